"""A timed replay of the worker's pipeline schedules (test helper, pure): when does each stage reach the step's
optimizer barrier, given per-stage compute times and a message latency?"""

from __future__ import annotations

from collections.abc import Sequence

from arceusd.worker.schedule import (
    Action,
    Backward,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    SendActivation,
    SendGrad,
    WeightGrad,
)


def barrier_time(
    schedules: Sequence[Sequence[Action]],
    forward: Sequence[float],
    backward: Sequence[float],
    *,
    latency: float = 0.0,
    input_share: float | None = None,
) -> float:
    """The time the last stage reaches its ``OptimizerStep`` when stage ``s`` spends ``forward[s]`` /
    ``backward[s]`` per micro-batch and every message arrives ``latency`` after it is sent.

    A backward that defers its weights costs ``input_share * backward[s]`` and its ``WeightGrad`` the whole
    ``backward[s]`` (the engine reruns the backward for the weights); ``input_share=None`` charges the deferred
    backward whole and the ``WeightGrad`` nothing (the split not modelled). AssertionError on a deadlock. Every
    loop is bounded by the action count."""
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
                    split = a.defer_weights and input_share is not None
                    clock[s] += backward[s] * (input_share if split and input_share is not None else 1.0)
                elif isinstance(a, WeightGrad):
                    clock[s] += backward[s] if input_share is not None else 0.0
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
