"""Measuring this device and the links to peers, for the planner.

Owns: a short matmul benchmark per available device kind (CPU always; CUDA / MPS when torch says available)
giving FLOP/s, free memory and thread count; a JSON cache of those figures with a maximum age; the
conversion to ``partitioner.DeviceProfile``; and ``measure_link``, which times an async ``echo(payload) ->
payload`` callable (the transport supplies it) for round-trip time (median of small echoes) and bandwidth
(one large echo).

This module reads clocks and imports torch; the planner itself does neither. Torch is imported lazily so the
daemon can import this module without paying for torch until it actually measures.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from partitioner.inputs import DeviceProfile, Link

CACHE_FILE = "device_profile.json"
CACHE_VERSION = 1


@dataclass(frozen=True)
class DeviceMeasurement:
    """One device kind on this machine: measured matmul FLOP/s (float32) and free memory in bytes."""

    kind: str
    flops_per_s: float
    memory_bytes: int
    threads: int
    name: str
    measured_at: float


@dataclass(frozen=True)
class LinkMeasurement:
    rtt_s: float
    bandwidth_bytes_per_s: float

    def to_link(self) -> Link:
        return Link(self.rtt_s, self.bandwidth_bytes_per_s)


# --- memory -----------------------------------------------------------------------------------------------
def parse_meminfo_available(text: str) -> int | None:
    """MemAvailable from /proc/meminfo text, in bytes (None if absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                scale = 1024 if (len(parts) < 3 or parts[2].lower() == "kb") else 1
                return int(parts[1]) * scale
    return None


def cpu_free_memory(meminfo_path: str = "/proc/meminfo") -> int:
    """Available RAM: /proc/meminfo's MemAvailable, else free pages x page size via os.sysconf."""
    try:
        with open(meminfo_path) as f:
            found = parse_meminfo_available(f.read())
        if found is not None:
            return found
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


# --- compute ----------------------------------------------------------------------------------------------
def available_kinds() -> tuple[str, ...]:
    import torch

    kinds = ["cpu"]
    if torch.cuda.is_available():
        kinds.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        kinds.append("mps")
    return tuple(kinds)


def _sync(kind: str) -> None:
    import torch

    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()


def measure_device(
    kind: str,
    size: int = 512,
    repeats: int = 4,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], float] = time.time,
) -> DeviceMeasurement:
    """Time ``repeats`` float32 matmuls of ``size`` x ``size`` (after a warm-up) on ``kind``; best of 3.

    Error handling: raises ``ValueError`` for an unknown or unavailable kind.
    """
    import torch

    if kind not in available_kinds():
        raise ValueError(f"device kind {kind!r} is not available here (available: {available_kinds()})")
    if size <= 0 or repeats <= 0:
        raise ValueError("size and repeats must be positive")
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(kind)
    b = torch.randn(size, size, generator=gen).to(kind)
    (a @ b).sum().item()  # warm-up (kernel selection, lazy init)
    best = float("inf")
    for _ in range(3):
        _sync(kind)
        start = clock()
        for _ in range(repeats):
            c = a @ b
        _sync(kind)
        best = min(best, clock() - start)
        del c
    flops = 2.0 * size**3 * repeats / max(best, 1e-9)
    if kind == "cuda":
        free, _total = torch.cuda.mem_get_info()
        memory = int(free)
        name = torch.cuda.get_device_name()
    else:
        memory = cpu_free_memory()  # MPS shares the unified memory with the CPU
        name = kind
    return DeviceMeasurement(kind, flops, memory, torch.get_num_threads(), name, now())


def measure_all(size: int = 512, repeats: int = 4) -> tuple[DeviceMeasurement, ...]:
    return tuple(measure_device(k, size, repeats) for k in available_kinds())


# --- cache ------------------------------------------------------------------------------------------------
def load_or_measure(
    cache_dir: Path,
    max_age_s: float = 24 * 3600.0,
    now: float | None = None,
    measure: Callable[[], Sequence[DeviceMeasurement]] = measure_all,
) -> tuple[DeviceMeasurement, ...]:
    """Cached measurements from ``cache_dir/device_profile.json`` if younger than ``max_age_s``, else measure
    and write the cache (atomically: temp file + rename). A corrupt or foreign cache is remeasured."""
    t = time.time() if now is None else now
    path = Path(cache_dir) / CACHE_FILE
    try:
        data: Any = json.loads(path.read_text())
        if data.get("version") == CACHE_VERSION and 0 <= t - float(data["measured_at"]) <= max_age_s:
            return tuple(DeviceMeasurement(**d) for d in data["devices"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    found = tuple(measure())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, "measured_at": t,
                               "devices": [asdict(d) for d in found]}, sort_keys=True))
    os.replace(tmp, path)
    return found


def best_measurement(found: Sequence[DeviceMeasurement]) -> DeviceMeasurement:
    """The fastest device (ties: cuda, mps, cpu order by name). Raises ``ValueError`` when empty."""
    if not found:
        raise ValueError("no device measurements")
    return max(found, key=lambda d: (d.flops_per_s, d.kind))


def to_device_profile(m: DeviceMeasurement, peer_id: str, memory_fraction: float = 0.8) -> DeviceProfile:
    """The planner's view of a measured device, offering ``memory_fraction`` of its free memory."""
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    return DeviceProfile(peer_id, m.flops_per_s, int(m.memory_bytes * memory_fraction), m.kind)


# --- links ------------------------------------------------------------------------------------------------
def _payload(n: int) -> bytes:
    pattern = bytes(range(256))
    return (pattern * (n // 256 + 1))[:n]


async def measure_link(
    echo: Callable[[bytes], Awaitable[bytes]],
    small_count: int = 5,
    small_size: int = 64,
    large_size: int = 1 << 20,
) -> LinkMeasurement:
    """RTT = median time of ``small_count`` echoes of ``small_size`` bytes; bandwidth from one echo of
    ``large_size`` bytes: the payload crosses the link twice, so bw = 2 x size / (time - rtt).

    Uses ``trio.current_time()``, so it runs under trio's MockClock in tests.
    Error handling: ``ValueError`` when the echo returns different bytes (a broken transport).
    """
    if small_count <= 0 or small_size <= 0 or large_size <= small_size:
        raise ValueError("need small_count > 0 and 0 < small_size < large_size")
    small = _payload(small_size)
    samples = []
    for _ in range(small_count):
        start = trio.current_time()
        got = await echo(small)
        samples.append(trio.current_time() - start)
        if got != small:
            raise ValueError("echo returned different bytes than it was sent")
    rtt = statistics.median(samples)
    large = _payload(large_size)
    start = trio.current_time()
    got = await echo(large)
    elapsed = trio.current_time() - start
    if got != large:
        raise ValueError("echo returned different bytes than it was sent")
    transfer = elapsed - rtt
    if transfer <= 0:  # faster than the small echoes' median: the large payload costs ~nothing extra
        transfer = max(elapsed, 1e-9)
    return LinkMeasurement(rtt, 2 * large_size / transfer)
