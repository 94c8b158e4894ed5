"""What tests read of other processes in /proc: a process's ``stat`` fields (its state, parent, CPU times), its
name, and the processes that are children of a given one. Linux only; a process that is gone reads as None or is
left out."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``[0]`` the state, ``[1]`` the parent's pid,
    ``[11]``/``[12]`` user and system clock ticks); None when the process is gone. The name is cut off first: it
    may hold spaces and parentheses."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def parent_of(pid: int) -> int | None:
    """``pid``'s parent (None: it is gone)."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[1])


def name_of(pid: int) -> str | None:
    """``pid``'s name (``/proc/PID/comm``: what ``ps`` and ``top`` show); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def processes() -> dict[int, tuple[int, str]]:
    """Every live (not zombie) process we can read: pid -> (its parent, its state)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None and fields[0] != "Z":
            out[int(entry.name)] = (int(fields[1]), fields[0])
    return out


def children_of(pid: int | None) -> list[int]:
    """The live (not zombie) child processes of ``pid``."""
    return sorted(child for child, (parent, _) in processes().items() if parent == pid)
