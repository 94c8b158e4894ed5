"""The estimate for a job before it is announced: how long, what it costs, and what the cloud charges for the
same FLOPs. Pure.

Work: the spec's model costs (``arceusd.models.costs.block_costs``: forward + backward FLOPs per sample) x
``batch_size`` x ``steps``. Time: that work over the members' FLOP/s, each taken at its measured block
efficiency (the share of the matmul benchmark a stage really gets; ``arceusd.device.profile``), assuming a perfect
pipeline (so the time is a lower bound and the cost with it). Cost: each member's hours x its price
(``arceusd.market.pricing``), but the owner's own device's. Cloud: the same FLOPs at each table GPU's float32
peak, at its list price.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.jobs.spec.parsed import JobSpec
from arceusd.market.pricing import CLOUD_GPUS, NEUTRAL, Demand, price_per_hour
from arceusd.models.costs import block_costs


@dataclass(frozen=True)
class CloudCost:
    name: str
    instance: str
    hours: float
    usd: float


@dataclass(frozen=True)
class Quote:
    flops: float
    members: int
    flops_per_s: float
    hours: float
    usd: float
    price_per_device_hour: float
    cloud: tuple[CloudCost, ...]
    within_budget: bool
    within_deadline: bool
    budget_usd: float = 0.0
    deadline_hours: float = 0.0

    def problems(self) -> list[str]:
        """What in ``[needs]`` this estimate cannot meet, for people (empty: everything it states)."""
        out = []
        if not self.within_budget:
            out.append(f"the budget cannot be met: about ${self.usd:.6f}, over needs.budget_usd ${self.budget_usd:.6f}")
        if not self.within_deadline:
            out.append(
                f"the deadline cannot be met: about {_hours(self.hours)} on {self.members} device(s), past "
                f"needs.deadline_hours {self.deadline_hours:g} h"
            )
        return out


def step_flops(spec: object) -> float:
    """Training FLOPs of one step of a parsed job spec (forward + backward over the batch)."""

    assert isinstance(spec, JobSpec)
    per_sample = sum(c.forward_flops_per_sample + c.backward_flops_per_sample for c in block_costs(spec.model))
    return float(per_sample * spec.training.batch_size)


def job_flops(spec: object) -> float:
    """Training FLOPs of a parsed job spec (forward + backward, every step)."""
    assert isinstance(spec, JobSpec)
    return step_flops(spec) * spec.training.steps


def quote(
    flops: float,
    members: int,
    device_flops_per_s: float,
    efficiency: float = 1.0,
    demand: Demand = NEUTRAL,
    budget_usd: float = 0.0,
    deadline_hours: float = 0.0,
    max_price_per_hour: float = 0.0,
) -> Quote:
    """The estimate for ``flops`` of work on ``members`` devices like this one (``device_flops_per_s`` each), the
    owner's own among them: every other one paid the market price, at most ``max_price_per_hour`` (0: none), as
    the job's leader pays it (the owner's device is not billed to its owner: ``receipts.billed``)."""
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    effective = max(device_flops_per_s * min(max(efficiency, 0.0), 1.0), 1.0)
    hours = flops / (effective * members) / 3600.0
    price = price_per_hour(device_flops_per_s, demand)
    if max_price_per_hour:
        price = min(price, max_price_per_hour)
    usd = hours * (members - 1) * price
    cloud = tuple(CloudCost(g.name, g.instance, *g.cost_for(flops)) for g in CLOUD_GPUS)
    return Quote(
        flops,
        members,
        device_flops_per_s,
        hours,
        usd,
        price,
        cloud,
        within_budget=not budget_usd or usd <= budget_usd,
        within_deadline=not deadline_hours or hours <= deadline_hours,
        budget_usd=budget_usd,
        deadline_hours=deadline_hours,
    )


def quote_lines(q: Quote) -> list[str]:
    """The quote for people."""
    lines = [
        f"work      {q.flops:.3g} FLOPs",
        f"devices   {q.members} x {q.flops_per_s / 1e9:.1f} GFLOP/s at ${q.price_per_device_hour:.4f} per device-hour",
        f"time      {_hours(q.hours)} (a lower bound: a perfect pipeline)",
        f"cost      ${q.usd:.4f} for {q.members - 1} paid device(s): your own is not billed"
        + (f" (needs.budget_usd ${q.budget_usd:.4f})" if q.budget_usd else ""),
    ]
    lines += [f"warning   {p}" for p in q.problems()]
    for c in q.cloud:
        lines.append(f"cloud     ${c.usd:.4f} on {c.name} ({c.instance}, {_hours(c.hours)} at its fp32 peak)")
    return lines


def _hours(h: float) -> str:
    s = h * 3600.0
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{h:.2f} h"
