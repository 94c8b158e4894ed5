"""Plans use a device only where it helps (issue 31): the demo's job on one daemon alone against two local daemons.

Three runs of ``arceusd demo``'s job (``examples/shakespeare-gpt.toml``, a character GPT on Tiny Shakespeare) in one
script, one after the other on this machine: (a) one daemon alone (the baseline), (b) two local daemons with the
default plan (a device is planned only where the predicted step is faster with it), (c) the same two daemons asked to
use every member (``training.use_all_devices = true``, the plans before this rule). Each daemon's worker gets a core
of its own where there are enough (``--worker-cpus``, as the demo); every daemon plans with one measurement of the
machine (taken once, before the first run), so the runs' predictions compare. Prints, per run, the plan's devices
and its predicted step, and the measured step (wall time over the steps after the first ``--skip``), and the
ratios to the baseline: (b) should never be worse than (a) (give or take the machine's noise); (c) shows what the
old rule cost.

    python bench/plan_helps.py [--steps 120] [--skip 20]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arceusd.cli.demo import demo_spec
from arceusd.cli.swarm import PROFILE_ENV, LocalSwarm


def _spec(directory: Path, steps: int, use_all: bool) -> Path:
    path = demo_spec(directory, steps)
    text = re.sub(r"(?m)^interval_steps = \d+", f"interval_steps = {steps}", path.read_text())
    text = re.sub(r"(?m)^eval_interval_steps = \d+", "eval_interval_steps = 0", text)  # time the training steps
    if use_all:
        text = text.replace("[training]\n", "[training]\nuse_all_devices = true\n")
    path.write_text(text)
    return path


def _run(root: Path, size: int, steps: int, skip: int, use_all: bool) -> dict[str, Any]:
    """One job on ``size`` fresh daemons: its plan and its measured seconds per step after ``skip`` steps."""
    swarm = LocalSwarm(root, size, ["--auto-join"], preset="lan", pin_workers=True)
    try:
        swarm.start()
        swarm.wait_converged(60)
        job_id = swarm.call(
            0, "submit", {"spec_path": str(_spec(root, steps, use_all)), "min_members": size}, timeout=300
        )["job_id"]
        first: tuple[int, float] | None = None
        last: tuple[int, float] | None = None
        view: dict[str, Any] = {}
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            view = swarm.call(0, "job", {"job_id": job_id}, timeout=30)
            now, step = time.monotonic(), int(view["step"])
            if view["state"] == "running" and step >= skip:
                first = first or (step, now)
                last = (step, now)
            if view["state"] in ("done", "failed", "cancelled") or step >= steps - 2:
                break
            time.sleep(0.2)
        if first is None or last is None or last[0] <= first[0]:
            raise RuntimeError(f"the job did not run past step {skip}: {view.get('state')} {view.get('error')}")
        plan = view.get("plan") or {}
        devices = sorted({d["peer_id"][:8] for st in plan.get("stages", []) for d in st["devices"]})
        return {
            "step_s": (last[1] - first[1]) / (last[0] - first[0]),
            "devices": devices,
            "stages": len(plan.get("stages", [])),
            "predicted_s": plan.get("predicted_step_time_s"),
            "spares": [p[:8] for p in view.get("spares") or []],
        }
    finally:
        swarm.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--skip", type=int, default=20, help="steps left out of the timing (start-up)")
    args = parser.parse_args()
    runs = [
        ("one daemon alone", 1, False),
        ("two daemons, planned where they help", 2, False),
        ("two daemons, every member used", 2, True),
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="arceus-plan-helps-") as tmp:
        os.environ[PROFILE_ENV] = str(Path(tmp) / "profile")  # one measurement of the machine for every run
        for i, (label, size, use_all) in enumerate(runs):
            got = _run(Path(tmp) / f"run{i}", size, args.steps, args.skip, use_all)
            results.append((label, got))
            print(
                f"{label:<40} {got['step_s'] * 1e3:8.1f} ms/step measured, plan {got['stages']} stage(s) on "
                f"{len(got['devices'])} device(s) (predicted {got['predicted_s'] * 1e3:.1f} ms), "
                f"spares {len(got['spares'])}",
                flush=True,
            )
    base = results[0][1]["step_s"]
    for label, got in results[1:]:
        print(f"ratio  {label:<40} {got['step_s'] / base:.2f}x the step of one daemon alone")


if __name__ == "__main__":
    main()
