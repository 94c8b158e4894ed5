"""Integer splits of heads / MLP columns over a tensor-parallel group, proportional to device speed.

Largest-remainder apportionment with a floor of 1 per device; ties go to the smaller key (peer id), so the
split is deterministic. The result sums exactly to ``total``."""

from __future__ import annotations

from collections.abc import Sequence


def proportional_split(total: int, weights: Sequence[float], keys: Sequence[str]) -> tuple[int, ...]:
    """Split ``total`` units over ``len(weights)`` devices, each >= 1, proportional to ``weights``.

    Raises ``ValueError`` if there are fewer units than devices or a weight is not positive.
    """
    k = len(weights)
    if k == 0 or len(keys) != k:
        raise ValueError("proportional_split needs one key per weight and at least one weight")
    if total < k:
        raise ValueError(f"cannot split {total} units over {k} devices with at least 1 each")
    if any(w <= 0 for w in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    wsum = float(sum(weights))
    quotas = [total * w / wsum for w in weights]
    alloc = [max(1, int(q)) for q in quotas]
    # Too many (floors of 1 pushed the sum up): take from those most above their quota, keeping >= 1.
    bounded = 0
    while sum(alloc) > total and bounded < total + k:
        bounded += 1
        candidates = [i for i in range(k) if alloc[i] > 1]
        i = min(candidates, key=lambda i: (-(alloc[i] - quotas[i]), keys[i]))
        alloc[i] -= 1
    # Too few: give to those furthest below their quota.
    bounded = 0
    while sum(alloc) < total and bounded < total + k:
        bounded += 1
        i = min(range(k), key=lambda i: (-(quotas[i] - alloc[i]), keys[i]))
        alloc[i] += 1
    return tuple(alloc)
