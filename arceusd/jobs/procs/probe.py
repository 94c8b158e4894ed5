"""``python -m arceusd.jobs.procs.probe <cache_dir> [threads [kinds]]``: measure this device (torch, in a child process
so the daemon never runs torch) and print its offer as one JSON line: ``flops_per_s``, ``memory_bytes`` (80 % of what is
free), ``kind``, and the calibration the planner charges (``block_efficiency``, ``dispatch_s``,
``adamw_s_per_param``, ``sgd_s_per_param``; see :mod:`arceusd.device.profile`). Cached for a day.

``threads``: the torch thread count of this device's stage workers (``worker_threads``), so the offer says what a
worker will do. Measured with every core instead, a device with more cores than its worker uses looks faster than
it trains, and the planner gives it too many blocks; a cache taken at another thread count is measured again.

``kinds``: the daemon's ``devices`` (comma-separated, e.g. ``cpu``): the offer is the fastest of those kinds
(:func:`~arceusd.device.profile.chosen_measurement`); the cache still holds every kind measured here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from arceusd.device.profile import (
    DeviceMeasurement,
    chosen_measurement,
    load_or_measure,
    measure_all,
    to_device_profile,
)


def main() -> None:
    if len(sys.argv) not in (2, 3, 4):
        sys.exit("usage: python -m arceusd.jobs.procs.probe CACHE_DIR [THREADS [KINDS]]")
    threads = None
    kinds = tuple(k for k in sys.argv[3].split(",") if k) if len(sys.argv) == 4 else ()
    if len(sys.argv) >= 3:
        if not sys.argv[2].isdigit() or int(sys.argv[2]) < 1:
            sys.exit(f"THREADS must be a whole number >= 1, got {sys.argv[2]!r}")
        threads = int(sys.argv[2])

    def measure() -> tuple[DeviceMeasurement, ...]:
        import torch  # only to measure: a cached figure is read without it (2 s of CPU saved per start)

        if threads is not None:
            torch.set_num_threads(threads)
        return measure_all()

    try:
        m = chosen_measurement(load_or_measure(Path(sys.argv[1]), threads=threads, measure=measure), kinds)
    except ValueError as exc:
        sys.exit(str(exc))
    device = to_device_profile(m, peer_id="this-device")
    print(
        json.dumps(
            {
                "flops_per_s": float(f"{device.flops_per_s:.6g}"),
                "memory_bytes": device.memory_bytes,
                "kind": device.kind,
                "block_efficiency": m.block_efficiency,
                "dispatch_s": m.dispatch_s,
                "adamw_s_per_param": m.adamw_s_per_param,
                "sgd_s_per_param": m.sgd_s_per_param,
            }
        )
    )


if __name__ == "__main__":
    main()
