"""What other devices claim about themselves or the job, checked before this daemon acts on it (issue #19 item 5).

- A member's offer (:func:`check_offer_bounds`): memory and speed within physical bounds, so an offer of 2^50
  bytes or 10^20 FLOP/s is refused at the join, before it can make the member the standby or win it the model;
- a leader's ``JobStop`` reason (:func:`stop_state`): one of the states this daemon knows, never the sender's
  text;
- a member's measured speed (:func:`own_step_times`, :func:`record_step_time`): the leader keeps each member's
  step times as its checkpoint reports carry them (the worker's own compute seconds per step, with the plan's
  prediction beside them; ``measured_step_s`` in ``arceusd status JOB``), and chooses the standby among members
  that were measured when there are any (:func:`arceusd.jobs.standby_sync.choose_standby`);
- a member's offered speed against that measure (:func:`overclaim`, :func:`discounted`): a member that ran more
  than :data:`RELATIVE_SLOW` times slower than its offer predicts, relative to how the other members ran against
  theirs (so a machine that slows everyone does not count), by at least :data:`MIN_EXCESS_S` a step, as the
  job's bottleneck, in :data:`SUSTAINED_REPORTS` reports in a row, has its
  speed divided by that factor and the leader plans again from the last checkpoint (once per member and job). A
  member accepts a plan that rates it slower than it offered, never faster
  (:func:`arceusd.jobs.planning.verify_start`).

What stays open: the step times are the member's worker's own figures; a member that lies about its speed *and*
its step times is caught only by the pipeline running slower than planned for everyone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

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


def record_step_time(times: dict[str, tuple[float, float]], peer: str, event: Mapping[str, Any]) -> None:
    """Keep ``peer``'s measured compute seconds per step and the plan's prediction from a checkpoint report
    (``step_s`` and ``predicted_s``; both finite and positive, else nothing is kept)."""
    got, predicted = event.get("step_s"), event.get("predicted_s")
    if not (isinstance(got, int | float) and isinstance(predicted, int | float)) or isinstance(got, bool):
        return
    if math.isfinite(got) and math.isfinite(predicted) and 0 < got < MAX_REPORTED_S and 0 < predicted < MAX_REPORTED_S:
        times[peer] = (float(got), float(predicted))


MAX_REPORTED_S = 1e6
"""Seconds per step a report may claim (compute or waiting); a larger, negative or non-finite one is not kept."""


def record_wait_time(waits: dict[str, float], peer: str, event: Mapping[str, Any]) -> None:
    """Keep ``peer``'s median link-wait seconds per step from a checkpoint report (``wait_s``: finite,
    0 <= wait < :data:`MAX_REPORTED_S`), so every device's compute is set beside its waiting (``stage_times`` in
    ``arceusd status JOB``, the dashboard's plan). A report without a valid one forgets the previous value, so the
    wait shown is always from the same report as the compute (a report without it still counts as a report)."""
    wait = event.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and math.isfinite(wait) \
            and 0 <= wait < MAX_REPORTED_S:  # fmt: skip
        waits[peer] = float(wait)
    else:
        waits.pop(peer, None)


def own_step_times(job: Any, me: str) -> dict[str, float]:
    """What this device's checkpoint report carries about its speed: the median compute seconds of its last
    steps (step time less link waits, from its worker's step events) and what the plan predicted for them (its
    stage's compute per micro-batch times the micro-batches, plus its optimizer step); empty when unknown."""
    if job.plan is None or not job.stage_times:
        return {}
    stage = next((st for st in job.plan.stages if any(s.peer_id == me for s in st.shares)), None)
    if stage is None:
        return {}
    compute = sorted(max(0.0, total - wait) for total, wait in job.stage_times)
    waits = sorted(max(0.0, wait) for _, wait in job.stage_times)
    predicted = stage.compute_s * job.plan.micro_batches + stage.optimizer_s
    if predicted <= 0:
        return {}
    return {"step_s": compute[len(compute) // 2], "wait_s": waits[len(waits) // 2], "predicted_s": predicted}


def measured(times: Mapping[str, tuple[float, float]], peer: str) -> bool:
    return peer in times


def measured_factor(times: Mapping[str, tuple[float, ...]], peer: str) -> float:
    """How much slower than predicted ``peer`` ran (1.0 when unmeasured or not slower)."""
    got = times.get(peer)
    return 1.0 if got is None else max(1.0, got[0] / got[1])


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
    "BOTTLENECK", "MAX_DISCOUNT", "MAX_OFFER_FLOPS", "MAX_OFFER_MEMORY", "MIN_EXCESS_S", "RELATIVE_SLOW", "STOP_STATES",
    "SUSTAINED_REPORTS", "check_offer_bounds", "discounted", "measured", "measured_factor", "overclaim",
    "own_step_times", "record_step_time", "record_wait_time", "stop_state",
]  # fmt: skip
