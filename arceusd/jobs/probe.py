"""``python -m arceusd.jobs.probe <cache_dir>``: measure this device (torch, in a child process so the daemon
never runs torch) and print its offer as one JSON line: ``flops_per_s``, ``memory_bytes`` (80 % of what is free),
``kind``, and the calibration the planner charges (``block_efficiency``, ``dispatch_s``, ``adamw_s_per_param``,
``sgd_s_per_param``; see :mod:`arceusd.profile`). Cached for a day."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from arceusd.profile import best_measurement, load_or_measure, to_device_profile

    m = best_measurement(load_or_measure(Path(sys.argv[1])))
    device = to_device_profile(m, peer_id="this-device")
    print(json.dumps({"flops_per_s": float(f"{device.flops_per_s:.6g}"), "memory_bytes": device.memory_bytes,
                      "kind": device.kind, "block_efficiency": m.block_efficiency, "dispatch_s": m.dispatch_s,
                      "adamw_s_per_param": m.adamw_s_per_param, "sgd_s_per_param": m.sgd_s_per_param}))  # fmt: skip


if __name__ == "__main__":
    main()
