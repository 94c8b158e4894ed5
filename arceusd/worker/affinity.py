"""CPU pinning for stage worker processes: which cores a worker may run on.

A stage worker runs one busy compute thread (``threads`` of them) plus the transport's helper threads. Left to
the scheduler, two workers on one machine trade cores and lose their private L2 caches at every migration, and
a helper thread of one worker preempts the other's compute; pinned, each keeps its core. Measured with
``bench/pipeline.py``'s two 1-thread workers on a 2-core machine, pinned and unpinned runs paired back to back:
pinned ran 1.4-2.1 % faster in 1F1B and 3.7-8.8 % faster in GPipe (two pairs each).

Pinning is opt-in (``worker_cpus`` in the daemon's config, ``cpus`` in the worker's): on a laptop that also
serves its owner, letting the scheduler move the worker off a busy core is the better default. The cores are
given in ``taskset``'s list syntax (``"0,2-3"``). Linux only: where the OS has no ``sched_setaffinity``
(macOS), the request is reported and ignored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

MAX_CPU = 4095


class AffinityError(ValueError):
    """A CPU list that is malformed, or names cores this process may not use."""


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)`` (sorted, distinct); ``""`` -> ``()``. AffinityError says what is wrong."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low_text, dash, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if dash else low
        except ValueError:
            raise AffinityError(f"CPU list {text!r}: {part!r} is not a core number or a range like 2-3") from None
        if not 0 <= low <= high <= MAX_CPU:
            raise AffinityError(f"CPU list {text!r}: {part!r} must be cores 0..{MAX_CPU}, low to high")
        cpus.update(range(low, high + 1))
    return tuple(sorted(cpus))


def usable_cores() -> list[int]:
    """The cores this process may run on, sorted; empty where the OS cannot tell (macOS)."""
    getter = getattr(os, "sched_getaffinity", None)
    return sorted(getter(0)) if getter is not None else []


def check_cpus(cpus: Iterable[object], threads: int) -> tuple[int, ...]:
    """``cpus`` (from a config file, a flag or a worker config) sorted and checked for ``threads`` compute
    threads: core numbers in range, each once, at least one per thread (fewer would make the threads share
    cores, the 6x slowdown that thread pinning exists to avoid)."""
    items = list(cpus)
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_CPU for c in items):
        raise AffinityError(f"CPU list {items!r}: expected core numbers 0..{MAX_CPU}")
    out = tuple(sorted(c for c in items if isinstance(c, int)))
    if len(set(out)) != len(out):
        raise AffinityError(f"CPU list {list(out)} names a core twice")
    if out and len(out) < threads:
        raise AffinityError(
            f"{threads} worker threads on {len(out)} pinned core(s) {list(out)} would share cores: "
            "pin at least as many cores as threads, or pin none"
        )
    return out


def pin_cpus(cpus: tuple[int, ...]) -> str | None:
    """Restrict this process (and every thread it starts afterwards) to ``cpus``; call before starting threads.

    Returns a note when the platform cannot pin (the request is then ignored), None otherwise. AffinityError
    when a core is not available to this process (offline, or outside its cgroup's set)."""
    if not cpus:
        return None
    setter = getattr(os, "sched_setaffinity", None)
    available = usable_cores()
    if setter is None or not available:
        return f"this OS cannot pin a process to cores; worker CPUs {list(cpus)} ignored"
    missing = sorted(set(cpus) - set(available))
    if missing:
        raise AffinityError(
            f"worker CPUs {missing} are not available to this process (it may use {available}); "
            "fix worker_cpus in the daemon's config"
        )
    setter(0, cpus)
    return None
