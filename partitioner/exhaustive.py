"""Exhaustive search: every ordered sequence of disjoint device groups x every contiguous cut x every allowed
micro-batch count, each evaluated with ``cost.CostModel.evaluate``. Exponential: ground truth for small
instances in tests and the bench only (keep n <= 5-6 devices and <= ~10 blocks).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations

from partitioner.cost import CostModel, in_flight_caps
from partitioner.inputs import PlanInputs
from partitioner.plan import Plan

_Stages = list[tuple[tuple[int, ...], int, int]]


def _placements(cm: CostModel, max_tp: int) -> Iterator[_Stages]:
    n_blocks = len(cm.blocks)
    groups = [c for size in range(1, max_tp + 1) for c in combinations(range(cm.n), size)]

    def rec(j0: int, used: frozenset[int], acc: _Stages) -> Iterator[_Stages]:
        if j0 == n_blocks:
            yield list(acc)
            return
        for g in groups:
            if used & set(g):
                continue
            for j1 in range(j0 + 1, n_blocks + 1):
                if not cm.range_splittable(len(g), j0, j1):
                    break
                acc.append((g, j0, j1))
                yield from rec(j1, used | set(g), acc)
                acc.pop()

    yield from rec(0, frozenset(), [])


def exhaustive_plan(inputs: PlanInputs) -> Plan | None:
    """The plan with the least predicted step time over all placements, or None if nothing is feasible; as the
    search does, capped 1F1B (``cost.py``) only when nothing fits uncapped, and then the largest cap that fits."""
    cm = CostModel(inputs)
    any_tp = any(c >= 2 for c in cm.tp_cap)
    max_tp = min(cm.training.max_tensor_parallel, cm.n) if any_tp else 1
    counts = cm.training.usable_micro_batch_counts()
    for cap in in_flight_caps(counts, cm.n):
        best: Plan | None = None
        for stages in _placements(cm, max_tp):
            for m in counts:
                p = cm.evaluate(stages, m, cap) if cap < m else None
                if p is not None and (best is None or p.predicted_step_time_s < best.predicted_step_time_s):
                    best = p
        if best is not None:
            return best
    return None
