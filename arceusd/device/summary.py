"""This device's one-line description for its peers, ``arceusd status`` and the dashboard (issue 30, item 8).

The machine line (OS, architecture, cores, RAM) comes from ``os`` alone; once the device is measured
(``arceusd.device.profile``'s cached ``device_profile.json``, taken in a child process: the daemon never imports
torch) each accelerator this daemon lends is added with its name and the memory free when it was measured, e.g.
``linux x86_64, 16 cores, 125 GiB; cuda NVIDIA H100 80GB HBM3 79 GiB``. The line is escaped and cut to
:data:`MAX_SUMMARY` characters, the bound a peer's hello holds it to (``protocol.gossip.PeerHello.device``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from arceusd.base.text_safety import safe_text
from arceusd.device.profile import CACHE_FILE

MAX_SUMMARY = 200
"""The longest summary sent (``PeerHello.device``'s wire bound)."""
MAX_NAME = 64
"""The longest device name kept of a measurement (a driver's name is a few words)."""
MAX_DEVICES = 16
"""The most devices of a measurement named."""


def machine_line() -> str:
    """OS, architecture, cores and RAM (no torch: the daemon never imports it)."""
    cores = os.cpu_count() or 1
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages * page_size / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        mem = ""
    return f"{os.uname().sysname.lower()} {os.uname().machine}, {cores} cores{mem}"


def accelerator_parts(found: Sequence[tuple[str, str, int]], kinds: Sequence[str] = ()) -> list[str]:
    """``kind name N GiB`` of each measured (kind, name, free memory in bytes) that is not the CPU (the machine
    line says that) and that this daemon lends (``kinds``: the config's ``devices``; empty: any)."""
    parts = []
    for kind, name, memory in found:
        if kind == "cpu" or (kinds and kind not in kinds):
            continue
        shown = " ".join(name.split())[:MAX_NAME]
        label = kind if not shown or shown == kind else f"{kind} {shown}"
        parts.append(f"{label} {max(0, memory) / 2**30:.0f} GiB")
    return parts


def format_summary(machine: str, accelerators: Sequence[str]) -> str:
    """The machine line and the accelerators, ``; ``-separated, escaped and cut to :data:`MAX_SUMMARY`."""
    return safe_text("; ".join([machine, *accelerators]), MAX_SUMMARY)


def measured_devices(cache_dir: Path) -> list[tuple[str, str, int]]:
    """(kind, name, free memory) of each device in ``cache_dir``'s cached measurement, however old (a name and
    a size do not go stale as a speed does); empty when there is none or it is unreadable."""
    try:
        data = json.loads((Path(cache_dir) / CACHE_FILE).read_text())
        found = [(d["kind"], d["name"], d["memory_bytes"]) for d in data["devices"][:MAX_DEVICES]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [(k, n, int(m)) for k, n, m in found if isinstance(k, str) and isinstance(n, str) and type(m) is int]


def device_summary(cache_dir: Path | None = None, kinds: Sequence[str] = ()) -> str:
    """This device's line: the machine, and the accelerators ``cache_dir``'s measurement names (none: the
    machine alone)."""
    found = measured_devices(cache_dir) if cache_dir is not None else []
    return format_summary(machine_line(), accelerator_parts(found, kinds))


__all__ = ["MAX_SUMMARY", "accelerator_parts", "device_summary", "format_summary", "machine_line", "measured_devices"]
