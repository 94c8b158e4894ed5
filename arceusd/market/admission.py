"""The leader's side of a job's ``[needs]``: whom it admits, when it plans, and when the budget stops the job. Pure.

A device checks a job against its own policy before it joins (``arceusd.market.needs.match``); the leader does not
take its word for it and checks what it can see itself:

- :func:`join_refusal`: a device that wants to join (a new member) is refused when the job has all the members it
  wants (``max_members``), when its kind is not one the job takes (``device_kinds``), when it lends less memory
  than ``memory_per_device_mib``, or when the job's budget cannot pay for the rest of the job with it (priced by
  the caller as the quote prices it, whatever the device's price: the price is capped at ``max_price_per_hour``);
- :func:`memory_shortfall`: the leader plans only once the members lend ``memory_total_mib`` between them;
- :func:`budget_stop`: at every committed checkpoint, a job with a budget stops (``failed``, with the reason) when
  what it has spent and the most the next checkpoint interval can cost exceed the budget: the owner never owes
  more than ``budget_usd``, and the checkpoint stays on disk. The most an interval can cost is known: a receipt
  pays the leader's clock between commits, at most ``PLAN_SLACK`` x the plan's predicted step time per step
  (``arceusd.market.receipts``), at each device's price; the rate measured so far is used where it is higher
  (a job that began under another leader). The rate measured so far alone is not a bound: one slow interval
  after fast ones overspent the budget by 2 % (CI, 2026-11-27).

The rest of the job is priced by the leader as the quote prices it, one cost model
(:func:`arceusd.market.forecast.rest_usd`: its plan over the members and the new device, the steps at the step
factor it measured, each paid device at its price; a device the plan leaves out costs nothing); only when no plan
fits the members yet, by :func:`projected_usd`, the perfect pipeline's lower bound (the remaining FLOPs over the
members' FLOP/s at their block efficiency). Once the job has a measured cost per step (receipts issued), the
larger of that and the projection is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    """What the projection needs of a member: its FLOP/s, block efficiency and price per hour."""

    flops_per_s: float
    efficiency: float
    price_per_hour: float


def projected_usd(remaining_flops: float, members: Iterable[Member]) -> tuple[float, float]:
    """(hours, dollars) for ``remaining_flops`` on ``members`` working together as a perfect pipeline."""
    ms = list(members)
    speed = sum(max(m.flops_per_s, 0.0) * min(max(m.efficiency, 0.0), 1.0) for m in ms)
    if remaining_flops <= 0 or not ms:
        return 0.0, 0.0
    hours = remaining_flops / max(speed, 1.0) / 3600.0
    return hours, hours * sum(m.price_per_hour for m in ms)


@dataclass(frozen=True)
class Spend:
    """What the leader has spent on a job and the cost per step it measured (0: nothing measured yet)."""

    usd: float = 0.0
    per_step_usd: float = 0.0
    most_per_step_usd: float = 0.0
    """The most one step can cost under the current plan (0: unknown): receipts cap their seconds."""


def join_refusal(
    *,
    members: int,
    max_members: int,
    kinds: tuple[str, ...],
    kind: str,
    lends_mib: int,
    per_device_mib: int,
    budget_usd: float,
    spend: Spend,
    remaining_steps: int,
    remaining_usd: float,
) -> str | None:
    """Why the leader does not admit a new member (None: it does). ``remaining_usd``: :func:`projected_usd` for
    the rest of the job on the members with this device."""
    if max_members and members >= max_members:
        return f"the job has all the members it wants ({members} of needs.max_members {max_members})"
    if kinds and kind not in kinds:
        return f"the job takes only {', '.join(kinds)} devices (needs.device_kinds), not {kind}"
    if per_device_mib and lends_mib < per_device_mib:
        return f"this device lends {lends_mib} MiB; the job needs {per_device_mib} MiB per device"
    if budget_usd:
        rest = max(remaining_usd, spend.per_step_usd * max(remaining_steps, 0))
        if spend.usd + rest > budget_usd:
            return (
                f"the job's budget cannot pay for it: ${spend.usd:.6f} spent and about ${rest:.6f} for the "
                f"remaining {remaining_steps} step(s) exceed needs.budget_usd ${budget_usd:.6f}"
            )
    return None


def memory_shortfall(total_mib: int, lends_bytes: Iterable[int]) -> str | None:
    """Why the members cannot start yet because of ``memory_total_mib`` (None: they lend enough)."""
    lent = sum(max(b, 0) for b in lends_bytes) >> 20
    if not total_mib or lent >= total_mib:
        return None
    return f"waiting for members: they lend {lent} MiB of the {total_mib} MiB needs.memory_total_mib asks"


def devices_for_memory(total_mib: int, per_device_mib: int) -> int:
    """How many devices lending ``per_device_mib`` each hold ``total_mib`` (1 when no total is stated)."""
    if not total_mib:
        return 1
    return max(1, math.ceil(total_mib / max(per_device_mib, 1)))


def budget_stop(budget_usd: float, spend: Spend, step: int, total_steps: int, interval_steps: int) -> str | None:
    """Why the job stops at the checkpoint of ``step`` (None: it goes on): the next interval would overspend."""
    if not budget_usd or step >= total_steps:
        return None
    upto = total_steps if interval_steps <= 0 else min(total_steps, step + interval_steps)
    following = max(spend.per_step_usd, spend.most_per_step_usd) * (upto - step)
    if spend.usd + following <= budget_usd:
        return None
    return (
        f"stopped at step {step} of {total_steps}: the budget is spent (needs.budget_usd ${budget_usd:.6f}; "
        f"${spend.usd:.6f} paid so far and up to ${following:.6f} more by the next checkpoint); the checkpoint "
        f"of step {step} is kept. Submit the job with a larger budget to train it to the end"
    )


__all__ = ["Member", "Spend", "budget_stop", "devices_for_memory", "join_refusal", "memory_shortfall", "projected_usd"]
