"""Device chain order for large clusters (beyond the exact subset search).

Heuristic, deterministic: greedy nearest-neighbour chain starting from the fastest device (ties by peer id),
distance = time to move a reference activation both ways over the pair's links (missing link: infinite),
then 2-opt on the open path (first improvement, bounded passes). Unreachable devices end up last in the
chain, where the DP's choice of a contiguous window of the chain can leave them out."""

from __future__ import annotations

import math

from partitioner.cost import CostModel


def pair_distance(cm: CostModel, a: int, b: int, ref_bytes: float) -> float:
    fwd, bwd = cm.links.get((a, b)), cm.links.get((b, a))
    if fwd is None or bwd is None:
        return math.inf
    return fwd[0] / 2 + ref_bytes / fwd[1] + fwd[2] + bwd[0] / 2 + ref_bytes / bwd[1] + bwd[2]


def reference_bytes(cm: CostModel) -> float:
    """A typical boundary: the largest block output at the median allowed micro-batch size, on the wire."""
    counts = cm.training.usable_micro_batch_counts() or cm.training.micro_batch_counts
    m = counts[len(counts) // 2]
    b = max(1, cm.training.global_batch_size // m)
    return max(blk.activation_bytes_per_sample for blk in cm.blocks) * b * cm.wire_ratio


def _path_cost(order: list[int], dist: list[list[float]]) -> float:
    return sum(dist[order[i]][order[i + 1]] for i in range(len(order) - 1))


def chain_order(cm: CostModel, max_passes: int = 50) -> tuple[int, ...]:
    n = cm.n
    if n == 0:
        return ()
    ref = reference_bytes(cm)
    dist = [[0.0 if a == b else pair_distance(cm, a, b, ref) for b in range(n)] for a in range(n)]
    start = min(range(n), key=lambda i: (-cm.speeds[i], cm.ids[i]))
    order = [start]
    left = set(range(n)) - {start}
    while left:
        last = order[-1]
        nxt = min(left, key=lambda i: (dist[last][i], -cm.speeds[i], cm.ids[i]))
        order.append(nxt)
        left.remove(nxt)
    # 2-opt on the open path; the first device (the fastest) stays first. Finite distances only.
    for _ in range(max_passes):
        improved = False
        for i in range(1, n - 1):
            for k in range(i + 1, n):
                cand = order[:i] + order[i : k + 1][::-1] + order[k + 1 :]
                before, after = _path_cost(order, dist), _path_cost(cand, dist)
                if after < before and not math.isnan(after) and after < math.inf:
                    order = cand
                    improved = True
        if not improved:
            break
    return tuple(order)
