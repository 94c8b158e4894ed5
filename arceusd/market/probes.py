"""What the machine says now, for the owner's policy: idle time, mains power, battery, the owner's CPU use.

Owns: :class:`Snapshot` (one reading; ``None`` = this machine cannot tell) and the probes behind the
:class:`Probe` interface:
- :class:`LinuxProbe`: CPU use from ``/proc/stat`` deltas less Arceus's own processes' ticks
  (``/proc/<pid>/stat``); power and battery from ``/sys/class/power_supply/*/{type,online,capacity}``;
  idle time from logind (``loginctl list-sessions`` then ``loginctl show-session ID -p IdleHint -p
  IdleSinceHint``: every session idle -> seconds since the latest went idle; any session active -> 0), else from
  input-device activity (the ``i8042``/HID lines of ``/proc/interrupts``: a count that moved means input now);
- :class:`MacProbe`: ``pmset -g batt`` (AC power, battery %), ``ioreg -c IOHIDSystem`` (``HIDIdleTime`` in
  ns), ``ps -A -o pid=,%cpu=`` (CPU use by process).
Files are read under a root folder (``/`` on a real machine) and commands go through a :class:`Commands`; the
test source, :class:`FolderCommands`, reads each command's output from ``<root>/commands/<name>``, so a folder
with a fake ``proc/``, ``sys/`` and ``commands/`` stands in for the machine, in the same formats.

Parsing is pure (``parse_*`` functions); the probe classes keep only the previous counters that a rate
needs. Reading never raises: what cannot be read is ``None``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

COMMAND_TIMEOUT_S = 2.0
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_INPUT_IRQ = re.compile(r"i8042|keyboard|mouse|touchpad|\bhid|i2c_hid", re.IGNORECASE)


@dataclass(frozen=True)
class Snapshot:
    """One reading of the machine. ``None``: the machine cannot tell (no battery, no session, first sample)."""

    idle_s: float | None
    on_ac: bool | None
    battery_percent: float | None
    owner_cpu_percent: float | None
    local_hour: int


class Probe(Protocol):
    def snapshot(self, now: float) -> Snapshot:
        """A reading at wall-clock ``now`` (seconds since the epoch)."""
        ...


class Commands(Protocol):
    def output(self, name: str, argv: Sequence[str]) -> str | None:
        """The standard output of ``argv`` (``name`` is its file name in a test folder); None if it failed."""
        ...


class RealCommands:
    """Runs the command (2 s limit)."""

    def output(self, name: str, argv: Sequence[str]) -> str | None:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True)
class FolderCommands:
    """Reads a command's output from ``<root>/commands/<name>`` (absent: the command failed)."""

    root: Path

    def output(self, name: str, argv: Sequence[str]) -> str | None:
        return _read(self.root / "commands" / name)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _hour(now: float) -> int:
    return time.localtime(now).tm_hour


# --- pure parsers ------------------------------------------------------------------------------------------
def parse_proc_stat(text: str) -> tuple[int, int] | None:
    """(busy ticks, total ticks) from the ``cpu`` line of /proc/stat (idle and iowait are not busy)."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu" and len(parts) >= 5 and all(p.isdigit() for p in parts[1:]):
            values = [int(p) for p in parts[1:]]
            total = sum(values[:8])  # guest time is already inside user/nice
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    return None


def parse_pid_stat_ticks(text: str) -> int | None:
    """utime + stime of one /proc/<pid>/stat (fields 14 and 15; the command name may hold spaces)."""
    close = text.rfind(")")
    if close < 0:
        return None
    fields = text[close + 1 :].split()
    if len(fields) < 13 or not fields[11].isdigit() or not fields[12].isdigit():
        return None
    return int(fields[11]) + int(fields[12])


def parse_interrupts_input(text: str) -> int | None:
    """The summed counts of input-device lines of /proc/interrupts (None: no input device listed)."""
    total, found = 0, False
    for line in text.splitlines()[1:]:
        if not _INPUT_IRQ.search(line):
            continue
        for part in line.split()[1:]:
            if not part.isdigit():
                break
            total += int(part)
        found = True
    return total if found else None


def parse_power_supplies(supplies: Iterable[dict[str, str]]) -> tuple[bool | None, float | None]:
    """(on mains, battery %) from power-supply folders' ``type``/``online``/``capacity`` files. No mains
    supply listed: on mains unknown (None) unless a battery says Discharging; several batteries: their mean."""
    on_ac: bool | None = None
    capacities: list[float] = []
    discharging = False
    for s in supplies:
        kind = s.get("type", "").strip()
        if kind == "Mains":
            online = s.get("online", "").strip() == "1"
            on_ac = online or bool(on_ac)
        elif kind == "Battery":
            cap = s.get("capacity", "").strip()
            if cap.isdigit():
                capacities.append(min(100.0, float(cap)))
            discharging = discharging or s.get("status", "").strip() == "Discharging"
    if on_ac is None and discharging:
        on_ac = False
    return on_ac, (sum(capacities) / len(capacities) if capacities else None)


def parse_loginctl_sessions(text: str) -> list[str]:
    """Session ids from ``loginctl list-sessions --no-legend`` (first column)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts and _SESSION_ID.match(parts[0]) and parts[0] != "SESSION":
            out.append(parts[0])
    return out


def parse_loginctl_idle(text: str, now: float) -> float | None:
    """Seconds idle from ``loginctl show-session`` properties: IdleHint=no -> 0; yes -> now - IdleSinceHint."""
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    hint = props.get("IdleHint", "").strip()
    if hint == "no":
        return 0.0
    if hint != "yes":
        return None
    since = props.get("IdleSinceHint", "").strip()
    if not since.isdigit() or int(since) == 0:
        return None
    return max(0.0, now - int(since) / 1e6)


def parse_pmset_batt(text: str) -> tuple[bool | None, float | None]:
    """(on AC power, battery %) from ``pmset -g batt``."""
    on_ac: bool | None = None
    if "'AC Power'" in text:
        on_ac = True
    elif "'Battery Power'" in text:
        on_ac = False
    m = re.search(r"(\d{1,3})%", text)
    return on_ac, (min(100.0, float(m.group(1))) if m else None)


def parse_ioreg_idle(text: str) -> float | None:
    """Seconds since the last input from ``ioreg -c IOHIDSystem`` (``"HIDIdleTime" = <ns>``)."""
    m = re.search(r'"HIDIdleTime"\s*=\s*(\d+)', text)
    return int(m.group(1)) / 1e9 if m else None


def parse_ps_cpu(text: str, exclude: set[int], cores: int) -> float | None:
    """Percent of the whole machine used by processes not in ``exclude``, from ``ps -A -o pid=,%cpu=``."""
    total, seen = 0.0, False
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        try:
            cpu = float(parts[1])
        except ValueError:
            continue
        seen = True
        if int(parts[0]) not in exclude:
            total += cpu
    return min(100.0, total / max(1, cores)) if seen else None


# --- probes ------------------------------------------------------------------------------------------------
class LinuxProbe:
    """Linux, files under ``root`` (``/`` for the real machine). ``own_pids`` gives Arceus's processes (the
    daemon and its workers), whose CPU use is not the owner's."""

    def __init__(
        self,
        root: Path = Path("/"),
        commands: Commands | None = None,
        own_pids: Callable[[], Iterable[int]] = lambda: (),
    ) -> None:
        self.root = root
        self.commands: Commands = commands or RealCommands()
        self.own_pids = own_pids
        self._cpu: tuple[int, int, int] | None = None
        self._irq: int | None = None
        self._last_input: float | None = None

    def snapshot(self, now: float) -> Snapshot:
        on_ac, battery = parse_power_supplies(self._supplies())
        return Snapshot(self._idle(now), on_ac, battery, self._owner_cpu(), _hour(now))

    def _supplies(self) -> list[dict[str, str]]:
        base = self.root / "sys/class/power_supply"
        try:
            entries = sorted(base.iterdir())
        except OSError:
            return []
        out = []
        for entry in entries[:16]:
            out.append({k: v for k in ("type", "online", "capacity", "status") if (v := _read(entry / k)) is not None})
        return out

    def _own_ticks(self) -> int:
        total = 0
        for pid in self.own_pids():
            text = _read(self.root / "proc" / str(int(pid)) / "stat")
            total += (parse_pid_stat_ticks(text) or 0) if text else 0
        return total

    def _owner_cpu(self) -> float | None:
        text = _read(self.root / "proc/stat")
        parsed = parse_proc_stat(text) if text else None
        if parsed is None:
            return None
        busy, total = parsed
        own = self._own_ticks()
        prev, self._cpu = self._cpu, (busy, total, own)
        if prev is None or total <= prev[1]:
            return None
        owner_busy = max(0, (busy - prev[0]) - max(0, own - prev[2]))
        return min(100.0, 100.0 * owner_busy / (total - prev[1]))

    def _idle(self, now: float) -> float | None:
        listing = self.commands.output("loginctl-list-sessions", ["loginctl", "list-sessions", "--no-legend"])
        idles: list[float] = []
        for sid in parse_loginctl_sessions(listing or "")[:32]:
            argv = ["loginctl", "show-session", sid, "-p", "IdleHint", "-p", "IdleSinceHint"]
            props = self.commands.output(f"loginctl-show-session-{sid}", argv)
            idle = parse_loginctl_idle(props or "", now)
            if idle is not None:
                idles.append(idle)
        if idles:
            return min(idles)
        text = _read(self.root / "proc/interrupts")
        count = parse_interrupts_input(text) if text else None
        if count is None:
            return None
        if self._irq is not None and count != self._irq:
            self._last_input = now
        if self._last_input is None:
            self._last_input = now  # the first reading: idle counts from now
        self._irq = count
        return now - self._last_input


class MacProbe:
    """macOS, through ``pmset``, ``ioreg`` and ``ps`` output."""

    def __init__(self, commands: Commands | None = None, own_pids: Callable[[], Iterable[int]] = lambda: ()) -> None:
        self.commands: Commands = commands or RealCommands()
        self.own_pids = own_pids

    def snapshot(self, now: float) -> Snapshot:
        on_ac, battery = parse_pmset_batt(self.commands.output("pmset-g-batt", ["pmset", "-g", "batt"]) or "")
        idle = parse_ioreg_idle(
            self.commands.output("ioreg-IOHIDSystem", ["ioreg", "-c", "IOHIDSystem", "-d", "4"]) or ""
        )
        ps = self.commands.output("ps-cpu", ["ps", "-A", "-o", "pid=,%cpu="])
        cpu = parse_ps_cpu(ps, set(self.own_pids()), os.cpu_count() or 1) if ps else None
        return Snapshot(idle, on_ac, battery, cpu, _hour(now))


def probe_for(root: str, own_pids: Callable[[], Iterable[int]] = lambda: (), platform: str | None = None) -> Probe:
    """The probe for this machine; a non-empty ``root`` reads that folder instead (Linux formats, or macOS
    command outputs when it holds ``commands/pmset-g-batt``)."""
    if root:
        base = Path(root)
        if (base / "commands" / "pmset-g-batt").exists():
            return MacProbe(FolderCommands(base), own_pids)
        return LinuxProbe(base, FolderCommands(base), own_pids)
    if (platform or sys.platform) == "darwin":
        return MacProbe(own_pids=own_pids)
    return LinuxProbe(own_pids=own_pids)
