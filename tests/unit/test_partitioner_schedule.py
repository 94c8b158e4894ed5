"""The cost model's step time against the worker's own schedules, run as a discrete-event simulation.

The worker executes the action lists of ``arceusd/worker/schedule.py`` in order: a stage computes one action at
a time, a receive waits for its neighbour's send, and ``OptimizerStep`` is a barrier (one scalar exchange for
the global gradient norm and the loss) after which every stage steps its optimizer. Here those very lists are
run with each stage's per-micro-batch forward and backward times (backward = 2 x forward, as the block costs
have it) and its optimizer time from the planner's stages, on links of no cost, and the simulated step is
compared with the plan's prediction: GPipe (what the planner picks whenever memory allows) with whole
backwards must match exactly; 1F1B with whole backwards is never slower than predicted (the prediction is an
upper bound) and within the issue's 25 %. With the deferred weights the worker turns on where the replay
says they pay (``deferring_pays`` with the plan's stage times; a split backward costs 13% more), both
schedules stay at or under the prediction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from arceusd.worker.schedule import build_schedule
from arceusd.worker.schedule_timing import SPLIT_COST, barrier_time, deferring_pays
from partitioner import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams
from partitioner.cost import CostModel
from partitioner.synthetic import gpt_like_blocks


def simulate_step(
    kind: str,
    forward: Sequence[float],
    backward: Sequence[float],
    optimizer: Sequence[float],
    m: int,
    defer_weights: bool = False,
) -> float:
    """Wall time of one step of the worker's ``kind`` schedule: every stage to the barrier, then the slowest
    optimizer step. A split backward costs what it measured in the engine."""
    n = len(forward)
    schedules = [build_schedule(kind, s, n, m, defer_weights=defer_weights) for s in range(n)]
    return barrier_time(schedules, forward, backward, split=SPLIT_COST) + max(optimizer)


def _stage_times(seed: int, n: int) -> tuple[CostModel, list[tuple[tuple[int, ...], int, int]]]:
    rng = random.Random(seed)
    blocks = gpt_like_blocks(rng.randint(n, 8), 64, 4, 32, 65)
    devices = tuple(
        DeviceProfile(
            f"d{i}",
            rng.uniform(1e9, 8e9),
            1 << 40,
            block_efficiency=rng.uniform(0.3, 1.0),
            dispatch_s=rng.uniform(0, 1e-3),
            optimizer_s_per_param=rng.uniform(0, 1e-8),
        )
        for i in range(n)
    )
    ids = [d.peer_id for d in devices]
    free = Link(0.0, 1e300)  # links of no cost: the test is about the schedule, not the transport
    links = LinkMatrix.symmetric((a, b, free) for a in ids for b in ids if a < b)
    cm = CostModel(PlanInputs(blocks, devices, links, TrainingParams(16, (1, 2, 4, 8, 16), max_tensor_parallel=1)))
    cuts = sorted(rng.sample(range(1, len(blocks)), n - 1))
    bounds = [0, *cuts, len(blocks)]
    return cm, [((s,), bounds[s], bounds[s + 1]) for s in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_prediction_is_the_workers_gpipe_step_and_bounds_its_1f1b_step(seed: int) -> None:
    n = 1 + seed % 4
    cm, stages = _stage_times(seed, n)
    for m in (1, 2, 4, 16):
        p = cm.evaluate(stages, m)
        assert p is not None and p.schedule == "gpipe"
        # per micro-batch: forward one third, backward two thirds of the stage's time (backward = 2 x forward)
        fwd = [s.time_s / 3 for s in p.stages]
        bwd = [2 * s.time_s / 3 for s in p.stages]
        opt = [s.optimizer_s for s in p.stages]
        assert simulate_step("gpipe", fwd, bwd, opt, m) == pytest.approx(p.predicted_step_time_s, rel=1e-9)
        one_f_one_b = simulate_step("1f1b", fwd, bwd, opt, m)
        assert p.predicted_step_time_s * 0.75 <= one_f_one_b <= p.predicted_step_time_s * (1 + 1e-9)
        for kind in ("gpipe", "1f1b"):
            defer = deferring_pays(kind, [s.time_s for s in p.stages], m)
            chosen = simulate_step(kind, fwd, bwd, opt, m, defer_weights=defer)
            assert p.predicted_step_time_s * 0.75 <= chosen <= p.predicted_step_time_s * (1 + 1e-9)


def test_the_optimizer_barrier_is_charged_once_by_the_slowest_stage() -> None:
    cm, stages = _stage_times(3, 3)
    p = cm.evaluate(stages, 4)
    assert p is not None
    opt = [s.optimizer_s for s in p.stages]
    assert max(opt) > 0 and len(set(opt)) == 3
    fwd = [s.time_s / 3 for s in p.stages]
    bwd = [2 * s.time_s / 3 for s in p.stages]
    without = simulate_step("gpipe", fwd, bwd, [0.0] * 3, 4)
    assert p.predicted_step_time_s - without == pytest.approx(max(opt), rel=1e-9)
