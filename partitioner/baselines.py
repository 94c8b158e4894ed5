"""Baseline partitioners for the bench, each evaluated with the same cost model as ours (``CostModel``).

- ``equal_split``: the same number of blocks on every device (devices in peer-id order).
- ``memory_proportional``: blocks in proportion to each device's memory, devices by memory, largest first
  (what exo's ring memory-weighted partitioning does).
- ``param_proportional``: cut where cumulative parameter bytes cross equal shares (DeepSpeed's
  ``partition_method="parameters"``), devices in peer-id order.
All use every device, one device per stage (no tensor parallelism). The micro-batch count is the best of the
allowed ones for that placement (so baselines are not handicapped on m). None when memory does not fit.
"""

from __future__ import annotations

from collections.abc import Sequence

from partitioner.cost import CostModel
from partitioner.inputs import PlanInputs
from partitioner.plan import Plan


def _cuts_from_counts(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, pos = [], 0
    for c in counts:
        out.append((pos, pos + c))
        pos += c
    return out


def _apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Largest remainder, zeros allowed, deterministic (ties by position)."""
    wsum = float(sum(weights))
    quotas = [total * w / wsum for w in weights]
    alloc = [int(q) for q in quotas]
    rest = total - sum(alloc)
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - alloc[i]), i))
    for i in order[:rest]:
        alloc[i] += 1
    return alloc


def _best_over_m(cm: CostModel, devices: Sequence[int], counts: Sequence[int]) -> Plan | None:
    cuts = _cuts_from_counts(counts)
    stages = [((d,), j0, j1) for d, (j0, j1) in zip(devices, cuts, strict=True) if j1 > j0]
    best: Plan | None = None
    for m in cm.training.usable_micro_batch_counts():
        p = cm.evaluate(stages, m)
        if p is not None and (best is None or p.predicted_step_time_s < best.predicted_step_time_s):
            best = p
    return best


def equal_split(inputs: PlanInputs) -> Plan | None:
    cm = CostModel(inputs)
    devices = list(range(cm.n))
    return _best_over_m(cm, devices, _apportion(len(cm.blocks), [1.0] * cm.n))


def memory_proportional(inputs: PlanInputs) -> Plan | None:
    cm = CostModel(inputs)
    devices = sorted(range(cm.n), key=lambda i: (-cm.budgets[i], cm.ids[i]))
    weights = [float(max(cm.budgets[i], 1)) for i in devices]
    return _best_over_m(cm, devices, _apportion(len(cm.blocks), weights))


def param_proportional(inputs: PlanInputs) -> Plan | None:
    cm = CostModel(inputs)
    n_blocks, n = len(cm.blocks), cm.n
    total = float(sum(b.param_bytes for b in cm.blocks)) or 1.0
    counts, pos, acc = [], 0, 0.0
    for k in range(n):
        target = total * (k + 1) / n
        start = pos
        # take blocks while the cumulative share gets closer to the target; leave one per later device
        while pos < n_blocks - (n - k - 1) and (
            pos == start or abs(acc + cm.blocks[pos].param_bytes - target) <= abs(acc - target)
        ):
            acc += cm.blocks[pos].param_bytes
            pos += 1
        if k == n - 1:
            while pos < n_blocks:
                acc += cm.blocks[pos].param_bytes
                pos += 1
        counts.append(pos - start)
    return _best_over_m(cm, list(range(n)), counts)


BASELINES = {
    "equal": equal_split,
    "memory": memory_proportional,
    "params": param_proportional,
}
