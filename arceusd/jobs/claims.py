"""What other devices claim about themselves or the job, checked before this daemon acts on it (issue #19 item 5).

- A member's offer (:func:`check_offer_bounds`): memory and speed within physical bounds, so an offer of 2^50
  bytes or 10^20 FLOP/s is refused at the join, before it can make the member the standby or win it the model;
- a leader's ``JobStop`` reason (:func:`stop_state`): one of the states this daemon knows, never the sender's
  text;
- a member's measured speed (:func:`own_step_times`, :func:`record_step_time`): the leader keeps each member's
  step times as its checkpoint reports carry them (the worker's own compute seconds per step, with the plan's
  prediction beside them; ``measured_step_s`` in ``arceusd status JOB``), and chooses the standby among members
  that were measured when there are any (:func:`arceusd.jobs.standby_sync.choose_standby`).
  :func:`discounted` is how a member measured far slower than it claimed would be given less work; it is not
  applied yet: the members check their own offer in the leader's plan inputs and would refuse a discounted one.
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
SLOW_FACTOR = 2.0
"""A member measured more than this many times slower than the plan predicted is discounted."""
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
    if math.isfinite(got) and math.isfinite(predicted) and 0 < got < 1e6 and 0 < predicted < 1e6:
        times[peer] = (float(got), float(predicted))


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
    predicted = stage.compute_s * job.plan.micro_batches + stage.optimizer_s
    return {"step_s": compute[len(compute) // 2], "predicted_s": predicted} if predicted > 0 else {}


def measured(times: Mapping[str, tuple[float, float]], peer: str) -> bool:
    return peer in times


def measured_factor(times: Mapping[str, tuple[float, float]], peer: str) -> float:
    """How much slower than predicted ``peer`` ran (1.0 when unmeasured or not slower)."""
    got = times.get(peer)
    return 1.0 if got is None else max(1.0, got[0] / got[1])


def discounted(offer: Any, times: Mapping[str, tuple[float, float]]) -> Any:
    """``offer`` with its speed divided by how much slower it was measured than predicted, when that is more
    than :data:`SLOW_FACTOR` (the next plan gives it less work)."""
    factor = measured_factor(times, offer.peer_id)
    return offer if factor <= SLOW_FACTOR else replace(offer, flops_per_s=offer.flops_per_s / factor)


__all__ = ["MAX_OFFER_FLOPS", "MAX_OFFER_MEMORY", "SLOW_FACTOR", "STOP_STATES", "check_offer_bounds", "discounted",
           "measured", "measured_factor", "own_step_times", "record_step_time", "stop_state"]  # fmt: skip
