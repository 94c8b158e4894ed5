"""The speed a receipt pays a device for: what the leader measured of it, never more than its offer. Pure.

A device's offer is its own word; a receipt priced at the offer pays a member that offers 1,000 times its
speed about 950 times an honest member's hourly price. So the leader prices each device's receipts from the
speed it measured (:func:`paid_flops`):

- a device whose speed challenge (``arceusd.jobs.judging.challenges``: timed on the leader's clock) was answered in
  time and checked is paid for what it showed, scaled by how much slower than their offers the other devices
  ran theirs beside the job (their median slowdown: they share the machine with the job), at most its offer;
- a device whose challenge failed (wrong blocks, refused twice) is paid at its offer / ``MAX_DISCOUNT``;
- a device the leader discounted (its step times or its challenge: ``job.leading.speed.discounts``) is paid at the
  discounted speed from then on, at most;
- the leader's own device is paid at its offer (its challenge is the baseline the others are scaled by: on a
  loaded machine it runs ten times slower than its offer like every other device);
- a device not measured yet (a newcomer, or one whose challenge ran out of time: its speed is only an upper
  bound) is paid at most :func:`cap`: the leader's own offer (the one device the leader measured itself;
  :data:`~arceusd.market.pricing.TYPICAL_LAPTOP_FLOPS` when the leader lends nothing).

Because an unmeasured device faster than the cap would be paid less than its worth, the leader times it
(``hooks.wants_timing``: its speed check runs for any plan device that offers more than :data:`TIME_ABOVE` times
the cap, not only once the job runs slow), and pays its measure from the next checkpoint on.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arceusd.jobs.judging.challenges import MAX_WAIT_S, MIN_WAIT_S, WAIT_FACTOR, Timed
from arceusd.jobs.judging.claims import MAX_DISCOUNT
from arceusd.market.pricing import TYPICAL_LAPTOP_FLOPS

CAP_SLACK = 1.0
"""An unmeasured device is paid for at most this many times the leader's own FLOP/s."""
TIME_ABOVE = 2.0
"""The leader times an untimed plan device at once when it offers more than this many times the cap (devices of
one kind measure their profiles within about that of each other; nearer the cap, a challenge would cost every job
its time for little: such a device is paid at most the cap until a challenge times it)."""


@dataclass(frozen=True)
class Paid:
    """The speed a device's receipts are priced at, and why (``market`` status shows both)."""

    offered: float
    flops: float
    basis: str

    def summary(self) -> dict[str, float | str]:
        return {
            "offered_gflops": round(self.offered / 1e9, 3),
            "paid_gflops": round(self.flops / 1e9, 3),
            "basis": self.basis,
        }


def timed_out(t: Timed) -> bool:
    """Whether the leader stopped waiting for this challenge's answer (its time is what it waited: an upper bound
    of the speed, not a measure)."""
    at_offer = t.flops / max(1.0, t.offered_flops)
    wait = min(MAX_WAIT_S, max(MIN_WAIT_S, WAIT_FACTOR * at_offer))
    return t.seconds >= wait * 0.999


def answered(t: Timed) -> bool:
    return not t.why and t.seconds > 0 and not timed_out(t)


def baseline(timed: Mapping[str, Timed], peer: str) -> float:
    """How much slower than their offers the other devices answered their challenges (median, at least 1)."""
    others = [t.slowdown for p, t in timed.items() if p != peer and answered(t)]
    return max(1.0, statistics.median(others)) if others else 1.0


def cap(leader_offer: float | None) -> float:
    """What an unmeasured device is paid for at most (FLOP/s)."""
    return CAP_SLACK * (leader_offer or TYPICAL_LAPTOP_FLOPS)


def paid_flops(offered: float, discount: float, challenge: Timed | None, scale: float, limit: float) -> Paid:
    """The speed to price a device at: ``offered`` its offer, ``discount`` what the leader divides it by (1: none),
    ``challenge`` its timed challenge if any, ``scale`` :func:`baseline` for it, ``limit`` :func:`cap`."""
    planned = offered / max(1.0, discount)
    if challenge is not None and challenge.why:
        return Paid(offered, offered / MAX_DISCOUNT, f"failed its speed challenge ({challenge.why[:80]})")
    if challenge is not None and answered(challenge):
        shown = challenge.measured_flops * scale
        if shown < planned:
            return Paid(offered, shown, "its speed challenge")
        return Paid(
            offered,
            planned,
            "its offer, confirmed by its speed challenge" if planned == offered else "its discounted offer",
        )
    why = "its speed challenge ran out of time" if challenge is not None else "not measured yet"
    if planned > limit:
        return Paid(offered, limit, f"{why}: capped at the leader's own speed")
    return Paid(offered, planned, "its discounted offer" if discount > 1.0 else f"its offer ({why}, under the cap)")


def paid_speeds(job: Any, leader: str) -> dict[str, Paid]:
    """Every member of ``job``'s paid speed as its leader sees it now (``job.members``' offers,
    ``job.leading.speed.discounts`` and ``job.leading.speed.timed``)."""
    members: Mapping[str, Any] = job.members
    own = members.get(leader)
    limit = cap(float(own.flops_per_s) if own is not None else None)
    timed: Mapping[str, Timed] = job.leading.speed.timed
    discounts: Mapping[str, float] = job.leading.speed.discounts
    out = {
        peer: paid_flops(
            float(offer.flops_per_s), float(discounts.get(peer, 1.0)), timed.get(peer), baseline(timed, peer), limit
        )
        for peer, offer in members.items()
        if peer != leader
    }
    if own is not None:  # its own challenge is the baseline of how much slower devices run beside the job
        out[leader] = Paid(float(own.flops_per_s), float(own.flops_per_s), "the leader's own device")
    return out


def beyond_cap(job: Any, leader: str) -> list[str]:
    """Plan devices the leader has not asked to time that offer more than the cap (timed before they are paid more)."""
    own = job.members.get(leader)
    limit = cap(float(own.flops_per_s) if own is not None else None)
    return [
        p
        for p in job.plan_peers()
        if p in job.members
        and p not in job.leading.speed.challenged
        and float(job.members[p].flops_per_s) > TIME_ABOVE * limit
    ]


__all__ = [
    "CAP_SLACK",
    "TIME_ABOVE",
    "Paid",
    "answered",
    "baseline",
    "beyond_cap",
    "cap",
    "paid_flops",
    "paid_speeds",
    "timed_out",
]
