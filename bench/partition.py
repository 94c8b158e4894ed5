"""Planner benchmark: our DP against three baselines under the same cost model, plus planning time.

Over seeded random heterogeneous clusters (device speed 1-8x, memory 2-32 GiB, rtt 0.1-50 ms, bandwidth
10 Mbit/s - 10 Gbit/s) and a GPT-like block list, prints for each baseline (equal split, memory-proportional
as exo does, parameter-proportional as DeepSpeed does) the geometric mean of (baseline predicted step time /
ours), how often the baseline found no memory-feasible placement, our planning time, and the DP's gap to
exhaustive search on small instances.

    python bench/partition.py [--quick] [--seed N] [--measured]

``--measured`` also compares predicted with measured step time of real stage workers
(``bench/partition_measured.py``): devices profiled with the calibration the cost model charges (block
efficiency, dispatch per block, optimizer per parameter, cost per message; ``arceusd.device.profile``). The
synthetic clusters here are uncalibrated (efficiency 1, no fixed costs); ``tests/unit`` checks the DP
against exhaustive search with calibration too.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from partitioner import Plan, PlanError, TrainingParams, plan
from partitioner.baselines import BASELINES
from partitioner.exhaustive import exhaustive_plan
from partitioner.synthetic import gpt_like_blocks, random_inputs


def predicted_vs_measured(quick: bool) -> int:
    """Measured / predicted step time of real stage workers per plan (the cost model's calibration): runs
    ``bench/partition_measured.py`` (workers as processes, devices and links measured in the same run)."""
    import subprocess

    script = Path(__file__).resolve().parent / "partition_measured.py"
    return subprocess.run([sys.executable, str(script), *(["--quick"] if quick else [])], check=False).returncode


def geo_mean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def run(quick: bool, seed: int) -> int:
    blocks = gpt_like_blocks(n_layer=24, n_embd=2048, n_head=16, seq=1024, vocab=50257)
    training = TrainingParams(64, (1, 2, 4, 8, 16, 32, 64), wire_bytes_per_element=2)
    sizes = (4, 8, 16) if quick else (3, 4, 6, 8, 12, 16)
    per_size = 4 if quick else 12
    ratios: dict[str, list[float]] = {name: [] for name in BASELINES}
    infeasible = {name: 0 for name in BASELINES}
    plan_times: list[float] = []
    ours_infeasible = 0
    rng = random.Random(seed)
    for n in sizes:
        for _ in range(per_size):
            inputs = random_inputs(random.Random(rng.randrange(1 << 30)), n, blocks, training)
            start = time.process_time()  # CPU time: robust to other load on the machine
            try:
                ours: Plan = plan(inputs)
            except PlanError:
                ours_infeasible += 1
                continue
            plan_times.append(time.process_time() - start)
            for name, baseline in BASELINES.items():
                theirs = baseline(inputs)
                if theirs is None:
                    infeasible[name] += 1
                else:
                    ratios[name].append(theirs.predicted_step_time_s / ours.predicted_step_time_s)
    total = len(plan_times)
    print(
        f"model: GPT-like, {len(blocks)} blocks, "
        f"{sum(b.param_bytes for b in blocks) / 4 / 1e9:.2f} B params; clusters of {list(sizes)} devices, "
        f"{total} feasible instances (ours infeasible: {ours_infeasible})"
    )
    print(f"{'baseline':<10} {'geo-mean step-time ratio (baseline/ours)':>42} {'min':>6} {'no fit':>7}")
    worst = float("inf")
    for name in BASELINES:
        g = geo_mean(ratios[name])
        worst = min(worst, g)
        lo = min(ratios[name]) if ratios[name] else float("nan")
        print(f"{name:<10} {g:>42.2f}x {lo:>6.2f} {infeasible[name]:>4}/{total}")
    print(
        f"planning CPU time: median {statistics.median(plan_times) * 1e3:.0f} ms, "
        f"max {max(plan_times) * 1e3:.0f} ms over {total} plans"
    )
    # DP vs exhaustive (ground truth) on small instances
    small_blocks = gpt_like_blocks(n_layer=6, n_embd=512, n_head=8, seq=256, vocab=8192)
    small_training = TrainingParams(16, (1, 2, 4, 8), wire_bytes_per_element=2, max_tensor_parallel=2)
    gaps = []
    for k in range(4 if quick else 12):
        inputs = random_inputs(
            random.Random(seed * 1000 + k), 4, small_blocks, small_training, mem_range_gib=(0.1, 0.6)
        )
        truth = exhaustive_plan(inputs)
        if truth is None:
            continue
        gaps.append(plan(inputs).predicted_step_time_s / truth.predicted_step_time_s - 1)
    if gaps:
        print(
            f"DP vs exhaustive (4 devices, {len(small_blocks)} blocks, {len(gaps)} instances): "
            f"max gap {max(gaps) * 100:.3f}%"
        )
    target = 1.3
    print(f"target >= {target}x for every baseline: {'met' if worst >= target else 'NOT met'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer, smaller instances")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--measured", action="store_true", help="also compare predicted with measured step time of real stage workers"
    )
    args = parser.parse_args()
    code = run(args.quick, args.seed)
    if args.measured:
        code = code or predicted_vs_measured(args.quick)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
