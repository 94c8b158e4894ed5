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

- a member's step time as its neighbours saw it (:func:`record_link_waits`, :func:`seen_by_neighbours`,
  :func:`judged_times`): every report also says how long its stage waited for the previous stage's activations
  and for the next stage's gradients. A stage that both its neighbours wait on is the one holding the pipeline
  back; the least of those waits (capped by the leader's own step time, which its own clock measured) is a floor
  on that stage's time that does not come from its own word. The leader judges each member on the larger of
  the two, so a member that overstates its speed and understates its step times is caught as well.

What stays open: a stage split across devices (tensor parallel) is judged on its devices' own figures: its
neighbours see the stage, not which of its devices is slow. Two colluding neighbours can hide each other.
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


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def own_step_times(job: Any, me: str) -> dict[str, float]:
    """What this device's checkpoint report carries about its speed: the median compute seconds of its last
    steps (step time less link waits, from its worker's step events), the median waits (in all, for the previous
    stage's activations, for the next stage's gradients) and what the plan predicted (its stage's compute per
    micro-batch times the micro-batches, plus its optimizer step); empty when unknown."""
    if job.plan is None or not job.stage_times:
        return {}
    stage = next((st for st in job.plan.stages if any(s.peer_id == me for s in st.shares)), None)
    if stage is None:
        return {}
    times = list(job.stage_times)
    predicted = stage.compute_s * job.plan.micro_batches + stage.optimizer_s
    if predicted <= 0:
        return {}
    return {
        "step_s": _median([max(0.0, t[0] - t[1]) for t in times]), "wait_s": _median([max(0.0, t[1]) for t in times]),
        "wait_up_s": _median([max(0.0, t[2]) for t in times]), "wait_down_s": _median([max(0.0, t[3]) for t in times]),
        "predicted_s": predicted,
    }  # fmt: skip


def own_step_total(job: Any) -> float | None:
    """The median wall seconds of this device's own last steps (its own clock), or None before any."""
    return _median([t[0] for t in job.stage_times]) if job.stage_times else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 <= value < MAX_REPORTED_S:  # fmt: skip
        return float(value)
    return None


def record_link_waits(waits: dict[str, tuple[float, float]], peer: str, event: Mapping[str, Any]) -> None:
    """Keep ``peer``'s median seconds per step waiting for the previous stage's activations and for the next
    stage's gradients (``wait_up_s``, ``wait_down_s``: both valid, else the previous pair is forgotten)."""
    up, down = _seconds(event.get("wait_up_s")), _seconds(event.get("wait_down_s"))
    if up is None or down is None:
        waits.pop(peer, None)
    else:
        waits[peer] = (up, down)


BACKWARD_PER_FORWARD = 2.0
"""A block's backward pass costs this many times its forward (the partitioner's cost model): a stage's next
neighbour waits only on its forward passes, about a third of its compute."""


def seen_by_neighbours(plan: Any, waits: Mapping[str, tuple[float, float]], leader: str,
                       step_s: float | None) -> dict[str, float]:  # fmt: skip
    """Each one-device stage's seconds per step as the devices beside it in the pipeline saw it, never more than
    ``step_s`` (the leader's own step time, on its own clock; None: nothing is seen):

    - the previous stage waits for its gradients: its forward and backward passes (and the stages after it);
    - the next stage waits for its activations: its forward passes, :data:`BACKWARD_PER_FORWARD` + 1 times that
      being its compute;
    - between two neighbours the least of the two views: one neighbour that says it waited cannot frame it. At
      an end of the pipeline with one neighbour, that neighbour's view counts as it is only when the neighbour
      is the leader (``leader``, whose own clock it is); another's is capped by the time the stage itself
      did not spend waiting on that neighbour (word against word: the smaller wins).

    The leader itself is not seen (its own figures are its clock's), nor is a stage split across devices (the
    neighbours see the stage, not which device is slow), nor one whose neighbours did not all report. When one
    stage holds the pipeline back, every neighbour waits on it, and on no other stage from both sides: the view
    is about that stage's own time. Slow stages on both sides of a fast one make it look slow too;
    :func:`overclaim` judges a member only when it took :data:`BOTTLENECK` times longer than every other
    member, which they then did not."""
    if step_s is None:
        return {}
    stages = list(plan.stages)
    out: dict[str, float] = {}
    for k, stage in enumerate(stages):
        peer = stage.shares[0].peer_id
        if len(stage.shares) != 1 or peer == leader:
            continue
        before = [(s.peer_id, waits[s.peer_id][1]) for s in stages[k - 1].shares if s.peer_id in waits] if k else []
        after = [(s.peer_id, waits[s.peer_id][0] * (1.0 + BACKWARD_PER_FORWARD))
                 for s in stages[k + 1].shares if s.peer_id in waits] if k < len(stages) - 1 else []  # fmt: skip
        sides = [side for side in (before, after) if side]
        expected = (k > 0) + (k < len(stages) - 1)
        if not sides or len(sides) != expected:
            continue
        seen = min(w for side in sides for _, w in side)
        if expected == 1 and not any(p == leader for p, _ in sides[0]):
            if peer not in waits:
                continue
            own_wait = waits[peer][0] if k else waits[peer][1]  # its own wait on that one neighbour
            seen = min(seen, max(0.0, step_s - own_wait))
        out[peer] = min(seen, step_s)
    return out


def judged_times(times: Mapping[str, tuple[float, float]], seen: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """What the leader judges each member on: the larger of the seconds it reported and the seconds its
    neighbours saw it take, beside its predicted seconds."""
    return {peer: (max(got, seen.get(peer, 0.0)), predicted) for peer, (got, predicted) in times.items()}


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
    "BACKWARD_PER_FORWARD", "BOTTLENECK", "MAX_DISCOUNT", "MAX_OFFER_FLOPS", "MAX_OFFER_MEMORY", "MIN_EXCESS_S",
    "RELATIVE_SLOW", "STOP_STATES", "SUSTAINED_REPORTS", "check_offer_bounds", "discounted", "judged_times", "measured",
    "measured_factor", "overclaim", "own_step_times", "own_step_total", "record_link_waits", "record_step_time",
    "record_wait_time", "seen_by_neighbours", "stop_state",
]  # fmt: skip
