"""When this command's process began, on the wall clock: what a user waited from when they typed it.

A ``submit``'s quote times the job from the command (``asked_at``: ``arceusd.jobs.service.control_methods``); the
command's own interpreter start and imports (about 1 s of CPU on a 2-core machine) come before any of its code runs,
so a time taken in the command's function leaves them out, and ``bench/quote.py`` (timing from the moment it ran
the command) measured every job that much longer than the daemon did.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MAX_AGE_S = 60.0
"""A process older than this is not a command just typed (a notebook's, a test's): its start is not the job's."""


def began_from(stat: str, uptime: str, ticks_per_s: int, now: float) -> float:
    """The wall-clock start of the process whose ``/proc/<pid>/stat`` is ``stat``, from ``/proc/uptime``'s text at
    ``now``: its start (field 22, clock ticks after boot) against the system's uptime; ``now`` when that is later
    than ``now`` or more than :data:`MAX_AGE_S` earlier. ValueError or IndexError when the texts are not those."""
    started = int(stat.rsplit(")", 1)[1].split()[19]) / ticks_per_s  # (the name in parentheses may hold spaces)
    began = now - (float(uptime.split()[0]) - started)
    return began if now - MAX_AGE_S <= began <= now else now


def process_began() -> float:
    """The wall-clock time this process started (Linux, to 10 ms: :func:`began_from`); the time now where the
    platform does not say."""
    now = time.time()
    try:
        return began_from(
            Path("/proc/self/stat").read_text(), Path("/proc/uptime").read_text(), os.sysconf("SC_CLK_TCK"), now
        )
    except (OSError, ValueError, IndexError):
        return now


__all__ = ["MAX_AGE_S", "began_from", "process_began"]
