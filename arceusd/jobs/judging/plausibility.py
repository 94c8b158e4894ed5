"""How far training can move a parameter between two checkpoints, and the leader's check that a shard's values
stayed within it (issue #29 item 8: a finite poison, 1e30 everywhere, used to pass the finite-value scan and end
up in the exported model).

Pure functions of the job's training spec; the magnitudes come from the torch-free scan
(:func:`arceusd.jobs.judging.shard_scan.scan_shard`, a factor-of-two bracket from the exponent bits) and the reference
is the last committed checkpoint's (or the job's deterministic initial values before the first commit:
:func:`arceusd.jobs.procs.filework.plan_shapes`). A parameter tensor whose largest value at step ``s`` is above what
its largest value at the reference step ``c`` allows (:func:`ceiling`) is refused.

The bound per element and step, as a multiple of that step's learning rate ``lr_t`` (:func:`unit_step`):

- **AdamW**: the update is ``m_hat / (sqrt(v_hat) + eps)``; by Cauchy-Schwarz over the two moving averages,
  ``|m_t| / sqrt(v_t) <= (1 - b1) / sqrt(1 - b2) * sqrt(sum_{j<t} (b1^2 / b2)^j)``, and the bias corrections
  multiply it by ``sqrt(1 - b2^t) / (1 - b1^t)`` (:func:`adam_ratio_bound`, its largest value over ``t``; about
  7.3 for the defaults 0.9 and 0.999, 1 at ``t = 1``), whatever the gradients. Decoupled weight decay multiplies
  a value by ``1 - lr_t * wd``, which never grows it while ``lr_t * wd <= 2``;
- **SGD** (momentum ``mu``, weight decay ``wd``) with ``grad_clip`` ``c``: every element of a clipped gradient is
  at most ``c``, so the velocity, and the step it takes, is at most ``(c + wd * M) / (1 - mu)`` with ``M`` the
  largest value reached (solved for ``M``: :func:`ceiling`); nesterov and dampening stay within it;
- **SGD without clipping**: no bound exists (a gradient can be any size). The leader then refuses only a growth
  by more than :data:`UNCLIPPED_GROWTH` times ``max(1, M_c)`` in one interval: a heuristic, not a bound (a run
  that grows so fast has diverged anyway); set ``grad_clip`` for a sound check;
- **DiLoCo** replicas add their outer steps: each moves at most ``outer_lr / (1 - outer_momentum)`` times the
  pseudo-gradient, itself at most ``inner_steps`` inner steps' movement.

The movement is multiplied by :data:`SAFETY` (float rounding, compressed all-reduces) before it is compared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

from arceusd.jobs.judging.shard_scan import Magnitude
from arceusd.jobs.spec.parsed import TrainingSpec

SAFETY = 2.0
"""The bound on the movement is multiplied by this before a shard is refused."""
UNCLIPPED_GROWTH = 1e6
"""SGD without ``grad_clip`` (no sound bound): a tensor's largest value may grow to this many times
``max(1, its largest value at the last commit)`` in one interval."""
EXACT_T = 100_000
"""Adam's bias-corrected ratio is maximised over the first this many steps exactly, beyond by a bound."""
EXACT_LR_STEPS = 100_000
"""Learning rates are summed step by step over at most this many steps, beyond as steps x the largest."""


@lru_cache(maxsize=16)
def adam_ratio_bound(beta1: float, beta2: float) -> float | None:
    """The largest ``|m_hat_t| / sqrt(v_hat_t)`` Adam can reach at any step ``t`` whatever the gradients (see the
    module docstring); None when ``beta1^2 >= beta2`` (no bound)."""
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1) or beta1 * beta1 >= beta2:
        return None
    ratio = beta1 * beta1 / beta2
    scale = (1 - beta1) / math.sqrt(1 - beta2)
    best = 0.0
    b1t = b2t = rt = 1.0
    for _ in range(EXACT_T):
        b1t, b2t, rt = b1t * beta1, b2t * beta2, rt * ratio
        best = max(best, scale * math.sqrt((1 - rt) / (1 - ratio) * (1 - b2t)) / (1 - b1t))
    tail = scale / math.sqrt(1 - ratio) / (1 - b1t)  # every later t: the square roots at most 1, b1^t smaller
    return max(best, tail)


def lr_sum(training: TrainingSpec, start: int, end: int) -> tuple[float, float]:
    """The sum and the largest of the learning rates of (0-based) steps ``start`` to ``end - 1``."""
    count = max(0, end - start)
    if count == 0:
        return 0.0, 0.0
    if count > EXACT_LR_STEPS:
        top = max(training.lr, training.min_lr)
        return top * count, top
    rates = [training.lr_at(t) for t in range(start, end)]
    return math.fsum(rates), max(rates)


def _diloco(training: TrainingSpec) -> bool:
    """Whether the job may run DiLoCo's outer steps (replicas not averaged every step)."""
    return training.replicas != 1 and training.sync != "every_step"


def ceiling(training: TrainingSpec, start: int, end: int, magnitude: float) -> float:
    """The largest absolute value an element of a tensor can hold at step ``end`` when every element was at most
    ``magnitude`` at step ``start`` (see the module docstring); ``inf`` when nothing bounds it."""
    count = end - start
    if count <= 0:
        return magnitude
    total, top = lr_sum(training, start, end)
    wd = training.weight_decay
    if training.optimizer == "adamw":
        unit = adam_ratio_bound(*training.betas)
        if unit is None or top * wd > 2:
            return math.inf
        pull = 0.0  # decoupled decay never grows a value here
    else:
        mu = training.momentum
        clip = training.grad_clip
        if not 0 <= mu < 1:
            return math.inf
        if clip <= 0 or training.compression == "topk":  # top-k keeps residuals: a sent value may exceed the clip
            return max(1.0, magnitude) * UNCLIPPED_GROWTH
        unit = clip / (1 - mu)
        pull = wd / (1 - mu)  # the weight decay term pulls by wd * M / (1 - mu) per unit of lr
    movement = total * unit
    if _diloco(training):
        inner = training.diloco.inner_steps
        outer = training.diloco
        if not 0 <= outer.outer_momentum < 1:
            return math.inf
        outer_steps = math.ceil(count / max(1, inner)) + 1
        movement += outer_steps * inner * top * unit * outer.outer_lr / (1 - outer.outer_momentum)
        pull *= 1 + (outer_steps * inner * outer.outer_lr / (1 - outer.outer_momentum)) / max(1, count)
    movement *= SAFETY
    shrink = 1 - SAFETY * total * pull
    if shrink <= 0:
        return math.inf
    return (magnitude + movement) / shrink


def implausible(
    training: TrainingSpec, start: int, end: int, reference: Mapping[str, float], found: Mapping[str, Magnitude]
) -> str | None:
    """The first tensor of ``found`` (a shard's bounds, at step ``end``) whose largest value is surely above what
    ``reference`` (each tensor's largest value at step ``start``, an upper bound) allows, said as a reason; None
    when all are plausible. A tensor the reference does not know is not judged here (the shapes check is)."""
    for name in sorted(found):
        before = reference.get(name)
        if before is None:
            continue
        allowed = ceiling(training, start, end, before)
        if found[name].lower > allowed:
            return (
                f"its shard's values moved further than training can move them ({name}: at least "
                f"{found[name].lower:.3g} at step {end}, at most {before:.3g} at step {start}; "
                f"{end - start} steps allow at most {allowed:.3g})"
            )
    return None


def merge(magnitudes: Mapping[str, Mapping[str, Magnitude]]) -> dict[str, float]:
    """Each tensor's largest value over every shard holding (part of) it: the reference for the next check."""
    out: dict[str, float] = {}
    for found in magnitudes.values():
        for name, bound in found.items():
            out[name] = max(out.get(name, 0.0), bound.upper)
    return out


__all__ = [
    "EXACT_LR_STEPS",
    "EXACT_T",
    "SAFETY",
    "UNCLIPPED_GROWTH",
    "adam_ratio_bound",
    "ceiling",
    "implausible",
    "lr_sum",
    "merge",
]
