"""What other devices claim about themselves or the job, checked before this daemon acts on it (issue #19 item 5).

- A member's offer (:func:`check_offer_bounds`): memory and speed within physical bounds, so an offer of 2^50
  bytes or 10^20 FLOP/s is refused at the join, before it can make the member the standby or win it the model;
- a leader's ``JobStop`` reason (:func:`stop_state`): one of the states this daemon knows, never the sender's
  text;
- a member's measured speed (:func:`own_step_times`, :func:`record_step_time`): the leader keeps each member's
  step times as its checkpoint reports carry them (the worker's own compute seconds per step, with the plan's
  prediction beside them; ``measured_step_s`` in ``arceusd status JOB``), and chooses the standby among members
  that were measured when there are any (:func:`arceusd.jobs.leader.standby_sync.choose_standby`);
- a member's offered speed against that measure (:func:`overclaim`, :func:`discounted`): a member that ran more
  than :data:`RELATIVE_SLOW` times slower than its offer predicts, relative to how the other members ran against
  theirs (so a machine that slows everyone does not count), by at least :data:`MIN_EXCESS_S` a step, as the
  job's bottleneck, in :data:`SUSTAINED_REPORTS` reports in a row, has its
  speed divided by that factor and the leader plans again from the last checkpoint (once per member and job). A
  member accepts a plan that rates it slower than it offered, never faster
  (:func:`arceusd.jobs.plans.planning.verify_start`).

- a member's step time as the devices it works with saw it (:func:`record_link_waits`,
  :func:`seen_by_neighbours`, :func:`judged_times`): every report also says how long the device waited for the
  previous stage's activations, for the next stage's gradients and in its tensor-parallel group. A stage that
  both its neighbours wait on is the one holding the pipeline back, a rank its partners wait for the one holding
  its group back; what they waited (capped by the leader's own step time, which its own clock measured) is a
  floor on that member's time that does not come from its own word. The leader judges each member on the
  larger of the two, so a member that overstates its speed and understates its step times is caught as well.

With data-parallel replicas every replica's devices report the same claims with their witnesses, and each is
judged within its own replica's pipeline (:func:`seen_in_every_replica`, its replica's prediction).

Where one other device alone sees a member (an end of the pipeline next to a member that does not lead, a
tensor-parallel group of two), it is word against word and the smaller wins; a rank that lies about its waits can
make its whole group look alike; two colluding neighbours can hide each other. What settles those is the
leader's own clock: it times every device's speed itself (:mod:`arceusd.jobs.judging.challenges`,
:mod:`arceusd.jobs.leader.speed_checks`), and a member whose challenge ran far slower than its offer is discounted the
same way; two neighbours that each say they waited on the other are not judged here at all, and one of them is
planned alone beside the leader (:mod:`arceusd.jobs.leader.probation`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from protocol.job_wire import JobReport

if TYPE_CHECKING:
    from partitioner import Plan, ReplicaPlan, Stage

MAX_OFFER_MEMORY = 1 << 44
"""16 TiB: more memory than any one machine lends a job today; an offer above it is refused."""
MAX_OFFER_FLOPS = 1e17
"""FLOP/s: about fifty of today's fastest accelerators; one device claiming more is refused."""
RELATIVE_SLOW = 6.0
"""A member measured this many times slower against its offer than the others against theirs is discounted (wide:
two busy cores alone make honest members run up to about twice their prediction, all of them alike)."""
MIN_EXCESS_S = 0.25
"""...and only when it ran at least this many seconds per step over its prediction: a stage of a few
milliseconds is all overheads (Python, scheduling, a starved core), whose ratio to the prediction says nothing
about an offer (honest members of the tests' small MLP report 40-130 ms against 1.3 ms predicted)."""
BOTTLENECK = 3.0
"""...and only when its stage took this many times longer than any other member's: it is what slows the job."""
SUSTAINED_REPORTS = 2
"""...and only when this many checkpoint reports in a row say so (one slow interval is not a lie)."""
MAX_DISCOUNT = 1000.0
"""The most a member's offered speed is divided by; a plan may rate a member this much slower than it offered."""
STOP_STATES = frozenset({"done", "failed", "cancelled", "replanning"})
"""What a leader's JobStop may set a member's job to."""


def check_offer_bounds(memory_bytes: int, flops_per_s: float) -> str | None:
    """Why an offer is physically implausible, or None."""
    if not 0 < memory_bytes <= MAX_OFFER_MEMORY:
        return f"memory {memory_bytes} bytes is outside 1..{MAX_OFFER_MEMORY} (16 TiB)"
    if not (math.isfinite(flops_per_s) and 0 < flops_per_s <= MAX_OFFER_FLOPS):
        return f"speed {flops_per_s} FLOP/s is outside (0, {MAX_OFFER_FLOPS:g}]"
    return None


def stop_state(reason: str) -> str:
    """The job state a leader's JobStop ``reason`` sets: a known one, else ``stopped``."""
    return reason if reason in STOP_STATES else "stopped"


def record_step_time(times: dict[str, tuple[float, float]], peer: str, report: JobReport) -> None:
    """Keep ``peer``'s measured compute seconds per step and the plan's prediction from its checkpoint report
    (``step_s`` and ``predicted_s``; both finite and positive, else nothing is kept)."""
    got, predicted = report.step_s, report.predicted_s
    if got is None or predicted is None:
        return
    if math.isfinite(got) and math.isfinite(predicted) and 0 < got < MAX_REPORTED_S and 0 < predicted < MAX_REPORTED_S:
        times[peer] = (got, predicted)


MAX_REPORTED_S = 1e6
"""Seconds per step a report may claim (compute or waiting); a larger, negative or non-finite one is not kept."""


def _seconds(value: float | None) -> float | None:
    if value is not None and math.isfinite(value) and 0 <= value < MAX_REPORTED_S:
        return value
    return None


def record_wait_time(waits: dict[str, float], peer: str, report: JobReport) -> None:
    """Keep ``peer``'s median link-wait seconds per step from its checkpoint report (``wait_s``: finite,
    0 <= wait < :data:`MAX_REPORTED_S`), so every device's compute is set beside its waiting (``stage_times`` in
    ``arceusd status JOB``, the dashboard's plan). A report without a valid one forgets the previous value, so the
    wait shown is always from the same report as the compute (a report without it still counts as a report)."""
    wait = _seconds(report.wait_s)
    if wait is None:
        waits.pop(peer, None)
    else:
        waits[peer] = wait


class StageTime(NamedTuple):
    """One step of this device's worker, from its step event (seconds)."""

    total_s: float
    wait_s: float = 0.0
    """Of ``total_s``, waiting on the pipeline's links."""
    wait_up_s: float = 0.0
    """Of ``wait_s``, for the previous stage's activations."""
    wait_down_s: float = 0.0
    """Of ``wait_s``, for the next stage's gradients."""
    group_wait_s: float = 0.0
    """Of ``total_s`` less ``wait_s``, inside the tensor-parallel group's all-reduces (waiting for its slowest
    rank)."""


class PlannedJob(Protocol):
    """What the claims read of a job (:class:`arceusd.jobs.record.job.Job` fits): its plan, and this device's last
    steps."""

    @property
    def plan(self) -> Plan | None: ...

    @property
    def replica_plan(self) -> ReplicaPlan | None: ...

    @property
    def stage_times(self) -> Sequence[StageTime]: ...


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def own_step_times(job: PlannedJob, me: str) -> dict[str, float]:
    """What this device's checkpoint report carries about its speed: the median compute seconds of its last
    steps (step time less link waits, from its worker's step events), the median waits (in all, for the previous
    stage's activations, for the next stage's gradients) and what the plan predicted (its stage's compute per
    micro-batch times the micro-batches, plus its optimizer step, in this device's own replica's pipeline);
    empty when unknown."""
    if job.plan is None or not job.stage_times:
        return {}
    found = next(((p, st) for p in pipelines(job) for st in p.stages if any(s.peer_id == me for s in st.shares)), None)
    if found is None:
        return {}
    the_plan, stage = found
    times: list[StageTime] = list(job.stage_times)
    predicted = stage.compute_s * the_plan.micro_batches + stage.optimizer_s
    if predicted <= 0:
        return {}
    return {
        "step_s": _median([max(0.0, t.total_s - t.wait_s - t.group_wait_s) for t in times]),
        "wait_s": _median([max(0.0, t.wait_s) for t in times]),
        "wait_up_s": _median([max(0.0, t.wait_up_s) for t in times]),
        "wait_down_s": _median([max(0.0, t.wait_down_s) for t in times]),
        "group_wait_s": _median([max(0.0, t.group_wait_s) for t in times]),
        "predicted_s": predicted,
    }


def pipelines(job: PlannedJob) -> list[Plan]:
    """Every pipeline of the job's plan: each data-parallel replica's (the plan itself without replicas)."""
    if job.replica_plan is not None:
        return list(job.replica_plan.replicas)
    return [job.plan] if job.plan is not None else []


def seen_in_every_replica(job: Any, compute: Mapping[str, float], leader: str) -> dict[str, float]:
    """:func:`seen_by_neighbours` over each replica's pipeline (a replica's devices see only their own
    neighbours), capped by the leader's own step time: the replicas step together."""
    out: dict[str, float] = {}
    for the_plan in pipelines(job):
        out.update(seen_by_neighbours(the_plan, job.leading.speed.link_waits, compute, leader, own_step_total(job)))
    return out


def own_step_total(job: PlannedJob) -> float | None:
    """The median wall seconds of this device's own last steps (its own clock), or None before any."""
    return _median([t.total_s for t in job.stage_times]) if job.stage_times else None


class LinkWaits(NamedTuple):
    """A device's median seconds per step spent waiting, as its last checkpoint report said."""

    up_s: float
    """For the previous stage's activations."""
    down_s: float
    """For the next stage's gradients."""
    group_s: float = 0.0
    """In its tensor-parallel group's all-reduces (for the group's slowest rank)."""


def record_link_waits(waits: dict[str, LinkWaits], peer: str, report: JobReport) -> None:
    """Keep ``peer``'s median seconds per step waiting for the previous stage's activations, for the next
    stage's gradients and in its tensor-parallel group, from its checkpoint report (``wait_up_s``, ``wait_down_s``,
    ``group_wait_s``; the first two required, the last 0 when absent; any invalid one and the previous record is
    forgotten)."""
    up, down = _seconds(report.wait_up_s), _seconds(report.wait_down_s)
    group = _seconds(0.0 if report.group_wait_s is None else report.group_wait_s)
    if up is None or down is None or group is None:
        waits.pop(peer, None)
    else:
        waits[peer] = LinkWaits(up, down, group)


NO_WAITS = LinkWaits(0.0, 0.0)
"""What a member that reported no valid waits is taken to have waited: nothing (leaving them out hides nothing)."""

BACKWARD_PER_FORWARD = 2.0
"""A block's backward pass costs this many times its forward (the partitioner's cost model): a stage's next
neighbour waits only on its forward passes, about a third of its compute."""


def _stage_view(stages: Sequence[Stage], k: int, waits: Mapping[str, LinkWaits]) -> tuple[float, list[str]] | None:
    """Stage ``k``'s seconds per step as its pipeline neighbours saw it (the least of their views: the
    previous stage's wait for its gradients, the next stage's wait for its activations scaled to a whole
    step), and who saw it; None when a neighbour stage did not report or there is none."""
    before = [(s.peer_id, waits[s.peer_id].down_s) for s in stages[k - 1].shares if s.peer_id in waits] if k else []
    after = (
        [
            (s.peer_id, waits[s.peer_id].up_s * (1.0 + BACKWARD_PER_FORWARD))
            for s in stages[k + 1].shares
            if s.peer_id in waits
        ]
        if k < len(stages) - 1
        else []
    )
    sides = [side for side in (before, after) if side]
    if not sides or len(sides) != (k > 0) + (k < len(stages) - 1):
        return None
    return min(w for side in sides for _, w in side), [p for side in sides for p, _ in side]


def seen_by_neighbours(
    plan: Plan, waits: Mapping[str, LinkWaits], compute: Mapping[str, float], leader: str, step_s: float | None
) -> dict[str, float]:
    """Each member's seconds per step as the devices it works with saw it, never more than ``step_s`` (the
    leader's own step time, on its own clock; None: nothing is seen). ``compute``: each device's reported
    compute seconds per step (without its waits).

    - A one-device stage, by its pipeline neighbours: the previous stage waits for its gradients (its forward
      and backward passes, and the stages after it); the next stage waits for its activations (its forward
      passes, :data:`BACKWARD_PER_FORWARD` + 1 times that being its compute); the least of the two views, so one
      neighbour that says it waited cannot frame it.
    - A rank of a tensor-parallel stage, by its group: every rank waits in the group's all-reduces for the
      slowest, so each other rank's compute plus that wait is the group's time; what is left of the least of
      those once the largest of the other ranks' own compute is taken off is this rank's doing (nothing when
      another rank's compute accounts for the group's time). Never more than the stage's view by its pipeline
      neighbours, when they all reported. A rank that lies about its waits can make every rank look alike (no
      one is then judged), not single out another.
    - Word against word: where one other device alone sees it (an end of the pipeline, a group of two), that
      view counts as it is only when that device is the leader (``leader``, whose own clock it is); another's
      is capped by the time the member itself did not spend waiting on that device.

    The leader itself is not seen (its own figures are its clock's), nor a member whose viewers did not all
    report (a member's own missing waits count as none: :data:`NO_WAITS`). When one device holds the others
    back, they all wait on it, and on no other device from every side: the view is about that device's own time.
    Slow devices on both sides of a fast one make it look slow too; :func:`overclaim` judges a member only when
    it took :data:`BOTTLENECK` times longer than every other member, which they then did not."""
    if step_s is None:
        return {}
    stages = list(plan.stages)
    out: dict[str, float] = {}
    for k, stage in enumerate(stages):
        view = _stage_view(stages, k, waits)
        for share in stage.shares:
            peer = share.peer_id
            if peer == leader:
                continue
            own = waits.get(peer, NO_WAITS)  # a member that does not say it waited is taken as not having waited
            if len(stage.shares) == 1:
                if view is None:
                    continue
                seen, viewers = view
                if len(viewers) == 1 and viewers[0] != leader:  # one neighbour: its word against the member's
                    seen = min(seen, max(0.0, step_s - (own.up_s if k else own.down_s)))
            else:
                partners = [p.peer_id for p in stage.shares if p.peer_id != peer]
                if not all(p in waits and p in compute for p in partners):
                    continue
                # the group's step: any partner's compute plus its wait for the slowest; what no partner's own
                # compute accounts for was this rank's
                group_step = min(compute[p] + waits[p].group_s for p in partners)
                seen = max(0.0, group_step - max(compute[p] for p in partners))
                if len(partners) == 1 and partners[0] != leader:
                    seen = min(seen, max(0.0, step_s - own.up_s - own.down_s - own.group_s))
                if view is not None:
                    seen = min(seen, view[0])
            out[peer] = min(seen, step_s)
    return out


def judged_times(times: Mapping[str, tuple[float, float]], seen: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """What the leader judges each member on: the larger of the seconds it reported and the seconds its
    neighbours saw it take, beside its predicted seconds."""
    return {peer: (max(got, seen.get(peer, 0.0)), predicted) for peer, (got, predicted) in times.items()}


def overclaim(times: Mapping[str, tuple[float, ...]], peer: str) -> float | None:
    """How many times slower than its offer ``peer`` ran, relative to how much slower than planned the other
    measured members ran together (their seconds over their predicted seconds; at least 1.0: a member is never
    judged against others that ran faster than planned), when that is more than :data:`RELATIVE_SLOW`, it ran
    :data:`MIN_EXCESS_S` over its prediction and :data:`BOTTLENECK` times longer than any other member; None
    otherwise, and while no other member was measured."""
    got = times.get(peer)
    others = [t for p, t in times.items() if p != peer]
    if got is None or not others or got[0] - got[1] < MIN_EXCESS_S or got[0] < BOTTLENECK * max(t[0] for t in others):
        return None
    # the rest of the pipeline as a whole (time-weighted): a tiny stage's overheads do not set the bar
    rest = sum(t[0] for t in others) / sum(t[1] for t in others)
    factor = (got[0] / got[1]) / max(1.0, rest)
    return factor if factor > RELATIVE_SLOW else None


def discounted(offer: Any, factor: float) -> Any:
    """``offer`` with its speed divided by ``factor`` (at most :data:`MAX_DISCOUNT`; the next plan gives it less
    work)."""
    factor = min(MAX_DISCOUNT, factor)
    return offer if factor <= 1.0 else replace(offer, flops_per_s=offer.flops_per_s / factor)


__all__ = [
    "BACKWARD_PER_FORWARD",
    "BOTTLENECK",
    "MAX_DISCOUNT",
    "MAX_OFFER_FLOPS",
    "MAX_OFFER_MEMORY",
    "MIN_EXCESS_S",
    "NO_WAITS",
    "RELATIVE_SLOW",
    "STOP_STATES",
    "SUSTAINED_REPORTS",
    "LinkWaits",
    "StageTime",
    "check_offer_bounds",
    "discounted",
    "judged_times",
    "overclaim",
    "own_step_times",
    "own_step_total",
    "pipelines",
    "record_link_waits",
    "record_step_time",
    "record_wait_time",
    "seen_by_neighbours",
    "seen_in_every_replica",
    "stop_state",
]
