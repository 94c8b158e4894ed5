"""A timed replay of the worker's pipeline schedules (pure): when does each stage reach the step's optimizer
barrier, given per-stage compute times and a message latency? The worker uses it to decide whether deferring
weights' gradients pays for the plan's stage times (:func:`deferring_pays`); the tests use it to check the
schedules and the planner's step-time model against the action lists the worker really runs."""

from __future__ import annotations

from collections.abc import Sequence

from arceusd.worker.schedule import (
    Action,
    Backward,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ScheduleKind,
    SendActivation,
    SendGrad,
    WeightGrad,
    build_schedule,
)

SPLIT_COST = (22.7 / 37.4, 19.7 / 37.4)
"""A split backward's two halves as shares of one whole backward, measured on ``bench/pipeline.py``'s second
stage (3 transformer blocks + head, micro-batch 2 x 128, one CPU thread): the input's half 22.7 ms, the
weights' half 19.7 ms, the whole 37.4 ms; splitting costs 13% (the weights' half reads its operands cold)."""


def barrier_time(
    schedules: Sequence[Sequence[Action]],
    forward: Sequence[float],
    backward: Sequence[float],
    *,
    latency: float = 0.0,
    split: tuple[float, float] | None = None,
) -> float:
    """The time the last stage reaches its ``OptimizerStep`` when stage ``s`` spends ``forward[s]`` /
    ``backward[s]`` per micro-batch and every message arrives ``latency`` after it is sent.

    ``split=(input_share, weight_share)``: a backward that defers its weights costs ``input_share *
    backward[s]`` and its ``WeightGrad`` ``weight_share * backward[s]`` (their sum exceeds 1 by what splitting
    costs); ``None`` charges the deferred backward whole and the ``WeightGrad`` nothing (the split not
    modelled). AssertionError on a deadlock. Every loop is bounded by the action count."""
    n = len(schedules)
    pos, clock = [0] * n, [0.0] * n
    arrivals: dict[tuple[str, int, int], float] = {}  # (kind, receiving stage, micro-batch) -> arrival time
    for _ in range(sum(len(s) for s in schedules) + 1):
        moved = False
        for s in range(n):
            while pos[s] < len(schedules[s]):
                a = schedules[s][pos[s]]
                if isinstance(a, RecvActivation | RecvGrad):
                    key = ("act" if isinstance(a, RecvActivation) else "grad", s, a.micro_batch)
                    if key not in arrivals:
                        break
                    clock[s] = max(clock[s], arrivals[key])
                elif isinstance(a, Forward):
                    clock[s] += forward[s]
                elif isinstance(a, Backward):
                    clock[s] += backward[s] * (split[0] if a.defer_weights and split is not None else 1.0)
                elif isinstance(a, WeightGrad):
                    clock[s] += backward[s] * split[1] if split is not None else 0.0
                elif isinstance(a, SendActivation):
                    arrivals[("act", s + 1, a.micro_batch)] = clock[s] + latency
                elif isinstance(a, SendGrad):
                    arrivals[("grad", s - 1, a.micro_batch)] = clock[s] + latency
                elif isinstance(a, OptimizerStep):
                    break  # the barrier
                pos[s] += 1
                moved = True
        if not moved:
            break
    if not all(pos[s] < len(schedules[s]) and isinstance(schedules[s][pos[s]], OptimizerStep) for s in range(n)):
        raise AssertionError(f"the schedules deadlocked at {pos}")
    return max(clock)


def deferring_pays(
    kind: ScheduleKind | str, micro_batch_s: Sequence[float], num_micro_batches: int, *, latency: float = 0.0
) -> bool:
    """Whether the schedule with deferred weights (``schedule.deferred_micro_batches``) reaches the barrier at
    least 1% sooner than with whole backwards, for stages taking ``micro_batch_s[s]`` per micro-batch (forward
    one third, backward two thirds) and the split costing :data:`SPLIT_COST`. On a stage that never waits (the
    bottleneck of an uneven pipeline) the split's cost is not covered, and the step gets longer."""
    n = len(micro_batch_s)
    if n < 2 or num_micro_batches < 1:
        return False
    fwd = [t / 3 for t in micro_batch_s]
    bwd = [2 * t / 3 for t in micro_batch_s]

    def barrier(defer: bool) -> float:
        schedules = [build_schedule(kind, s, n, num_micro_batches, defer_weights=defer) for s in range(n)]
        return barrier_time(schedules, fwd, bwd, latency=latency, split=SPLIT_COST)

    return barrier(True) < 0.99 * barrier(False)
