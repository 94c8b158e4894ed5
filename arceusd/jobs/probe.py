"""``python -m arceusd.jobs.probe <cache_dir>``: measure this device (torch, in a child process so the daemon
never runs torch) and print ``{"flops_per_s", "memory_bytes", "kind"}`` as one JSON line. Cached for a day."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    from arceusd.profile import best_measurement, load_or_measure, to_device_profile

    device = to_device_profile(best_measurement(load_or_measure(Path(sys.argv[1]))), peer_id="this-device")
    print(json.dumps({"flops_per_s": float(f"{device.flops_per_s:.6g}"), "memory_bytes": device.memory_bytes,
                      "kind": device.kind}))  # fmt: skip


if __name__ == "__main__":
    main()
