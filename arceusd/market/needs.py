"""Matching a device's offer against a job's needs and the owner's policy: pure.

Owns: :class:`DeviceOffer` (what this device brings: kind, memory it lends, measured FLOP/s, its workers' thread
count), :class:`JobNeeds` (a job's ``[needs]`` plus its owner, model size and current members: what the match
looks at), the price a job pays a device (:func:`pay`: the market price for the device's FLOP/s, at most the
job's highest) and :func:`match`: (offer, policy, snapshot, job, demand) -> :class:`Match` (qualifies, or every
reason why not).

A device qualifies for a job when its policy accepts the job now (``arceusd.market.policy.evaluate``, which
refuses a pay below the policy's lowest price: so a device whose lowest price is above the job's highest never
joins), its kind is one the job takes (a GPU the policy keeps back counts as a CPU), it lends at least
``memory_per_device_mib``, its workers use no more threads than the policy's ``max_cores``, and the job still
needs devices (fewer members than ``max_members``). A job that states no needs takes any device. The leader pays
by the same rule (``arceusd.market.receipts``), so what a device was matched at is what its receipts say, up to
the difference between the two devices' views of the demand.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from arceusd.jobs.spec.parsed import JobSpec
from arceusd.market.policy import JobFacts, Policy, Refusal, cores_within, evaluate
from arceusd.market.pricing import NEUTRAL, Demand, price_per_hour
from arceusd.market.probes import Snapshot
from arceusd.models.costs import block_costs
from arceusd.models.hf.config import HFModelConfig


@dataclass(frozen=True)
class DeviceOffer:
    peer_id: str
    kind: str
    memory_bytes: int
    flops_per_s: float
    threads: int = 1


@dataclass(frozen=True)
class JobNeeds:
    """The match's view of a job (``from_spec`` builds it from a parsed spec)."""

    job_id: str
    owner: str
    model_params: int
    members: int
    memory_per_device_mib: int = 0
    device_kinds: tuple[str, ...] = ()
    max_members: int = 0
    max_price_per_hour: float = 0.0

    @classmethod
    def from_spec(cls, job_id: str, owner: str, spec: object, members: int) -> JobNeeds:

        assert isinstance(spec, JobSpec)
        params = sum(c.param_bytes for c in block_costs(spec.model)) // 4
        model = spec.model
        if isinstance(model, HFModelConfig) and model.tied:  # the head's copy in the costs: one weight
            params -= model.vocab_size * model.hidden
        n = spec.needs
        return cls(
            job_id,
            owner,
            params,
            members,
            n.memory_per_device_mib,
            tuple(n.device_kinds),
            n.max_members,
            n.max_price_per_hour,
        )


class Unfit(enum.Enum):
    """Why a job does not take this device (besides the policy's reasons)."""

    KIND = "the job does not take this kind of device"
    MEMORY = "this device lends less memory than the job needs per device"
    FULL = "the job has all the members it wants"
    ALREADY = "this device is already a member"
    CORES = "this device's workers use more threads than policy.max_cores"


@dataclass(frozen=True)
class Misfit:
    unfit: Unfit
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.unfit.value} ({self.detail})" if self.detail else self.unfit.value


@dataclass(frozen=True)
class Match:
    price_per_hour: float
    reasons: tuple[Refusal | Misfit, ...] = field(default=())

    @property
    def qualifies(self) -> bool:
        return not self.reasons

    def why_not(self) -> str:
        return "; ".join(str(r) for r in self.reasons)


def demand_in_view(jobs: list[JobNeeds], alive_devices: int, busy_devices: int) -> Demand:
    """Announced jobs that still want devices, against the alive devices in the membership view that work for
    no known job."""
    wanting = sum(1 for j in jobs if not j.max_members or j.members < j.max_members)
    return Demand(wanting, max(0, alive_devices - busy_devices))


def pay(flops_per_s: float, max_price_per_hour: float, demand: Demand = NEUTRAL) -> float:
    """Dollars per hour a job pays a device: the market price for its FLOP/s, at most the job's highest (0 =
    none stated)."""
    market = price_per_hour(flops_per_s, demand)
    return min(market, max_price_per_hour) if max_price_per_hour else market


def effective_kind(offer: DeviceOffer, policy: Policy) -> str:
    return offer.kind if policy.gpu or offer.kind == "cpu" else "cpu"


def match(
    offer: DeviceOffer, policy: Policy, snap: Snapshot, job: JobNeeds, demand: Demand = NEUTRAL, member: bool = False
) -> Match:
    """Whether this device qualifies for ``job`` now, at its asking price, and every reason it does not."""
    price = pay(offer.flops_per_s, job.max_price_per_hour, demand)
    facts = JobFacts(job.owner, job.model_params, price)
    reasons: list[Refusal | Misfit] = list(evaluate(policy, snap, facts).refusals)
    if not cores_within(policy, offer.threads):
        reasons.append(Misfit(Unfit.CORES, f"{offer.threads} > {policy.max_cores}"))
    kind = effective_kind(offer, policy)
    if job.device_kinds and kind not in job.device_kinds:
        reasons.append(Misfit(Unfit.KIND, f"{kind} not in {', '.join(job.device_kinds)}"))
    lends_mib = offer.memory_bytes >> 20
    if policy.max_memory_mib:
        lends_mib = min(lends_mib, policy.max_memory_mib)
    if job.memory_per_device_mib and lends_mib < job.memory_per_device_mib:
        reasons.append(Misfit(Unfit.MEMORY, f"{lends_mib} MiB < {job.memory_per_device_mib} MiB"))
    if member:
        reasons.append(Misfit(Unfit.ALREADY))
    elif job.max_members and job.members >= job.max_members:
        reasons.append(Misfit(Unfit.FULL, f"{job.members} of {job.max_members}"))
    return Match(price, tuple(reasons))
