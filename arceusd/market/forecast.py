"""The forecast of a job's wall time and bill: the quote that holds (issue 31). Pure and torch-free.

Owns the time and cost model ``arceusd submit --quote`` (and ``arceus.quote``) states, from the same cost model the
planner uses: the daemon's plan for the devices that would take the job
(:func:`arceusd.jobs.plans.planning.make_job_plan` over their offers: measured FLOP/s, calibration and links) predicts a
step time, and the job's wall time is

    start (+ first job) + steps x step + checkpoints x checkpoint + evals x eval + end

- ``step``: the plan's predicted step time (``predicted_step_time_s``) x a step factor: what this daemon measured
  a typical step of its past jobs of the model with a like predicted step to take over their plan's prediction
  (:mod:`arceusd.market.timings`, from ``job_timings.json`` in its state directory); until it has, the model kind's
  :data:`STEP_FACTORS`, fitted by ``bench/quote.py`` on an idle 16-core machine (1.1-1.6x for the char-GPTs,
  0.55-0.65x for the MNIST MLP; a model kind not measured takes 1). The planner's cost model misses that much
  (``arceusd.device.profile``'s calibration is its to fix).
- ``start``: submit to the first step (the members' joins, the plan, the links measured, the stage workers started
  from a warm worker server) and the first steps' warm-up beyond typical steps (``timings.warmup_of``), and
  ``end``: the last commit to ``done`` (the last evaluation, the model gathered and exported): what this daemon
  measured its own past jobs to take. Until it has measured them, the figures of an
  idle 16-core machine, said to be assumed: :data:`START_S` (2.9-3.8 s measured there; 0.3-3.3 s on a 2-core
  machine), :data:`FIRST_JOB_S` more on a daemon's first job since it started (its first worker waits for the
  daemon's fork server, started with that job, to import torch; 7.7-10.0 s in all there, 3 s of it on a quiet 2-core
  machine) and :data:`END_BY_MODEL`.
- ``checkpoint`` and ``eval``: what a checkpoint or an evaluation adds, per point that holds one, as this daemon
  measured it for jobs of the model with a like predicted step; until then priced: :data:`CHECKPOINT_S` per
  commit (every ``checkpoint.interval_steps`` and the last step: the shards written, reported and the manifest
  committed) and a forward pass of the evaluation batches (at every checkpoint and every ``eval_interval_steps``)
  at the step time x the forward share of the FLOPs x eval samples over the step's batch.
- the links between the plan's devices: the one this daemon measured to a member in its newest job with one;
  until then the planner's defaults.

The bill: the plan's devices but the owner's own (``arceusd.market.receipts.billed``), each paid its market price
(``arceusd.market.needs.pay``, at most ``needs.max_price_per_hour``) at the demand while the job runs (the
caller's: :func:`arceusd.market.estimate.estimate` counts the job's devices busy then, as the leader's price at each
commit does) for the time the job runs after its leader starts (a receipt counts wall seconds between commits:
``LeaderBook.issue``), i.e. the wall time less the part of the start before the leader plans
(a third of the start, at most 1 s: :data:`UNBILLED_START_S` of :data:`START_S`) and less the end.

The range: the steps, checkpoints and evaluations at the step factor's and the pauses' ranges (the fastest to the
slowest this daemon measured, or an assumed factor's wider one) x (1 - :data:`LOW_SHARE`, 1 + :data:`HIGH_SHARE`),
the spread ``bench/quote.py`` measured between jobs on an idle machine, plus the start's and the end's ranges
(measured: the fastest to the slowest past job; assumed: :data:`arceusd.market.timings.ASSUMED_LOW` to
``ASSUMED_HIGH`` of the figure). A machine busy with other work runs every step slower than its profile says (on 2
cores at load 9-13, 2-4x): the range's high end is stretched by the load per CPU now over the load when this
daemon's jobs ran (:func:`arceusd.market.timings.busier`, at most 5x); the point is not (the 1-minute load says
little of the next minute's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from arceusd.jobs.plans.planning import Offer, make_job_plan
from arceusd.jobs.spec.parsed import JobSpec, MnistDataSpec
from arceusd.market.needs import pay
from arceusd.market.pricing import NEUTRAL, Demand
from arceusd.market.timings import (
    JobTiming,
    Term,
    busier,
    end_term,
    measured_link,
    pause_term,
    start_term,
    step_term,
)
from arceusd.models.costs import block_costs
from partitioner import Link, ReplicaPlan

START_S = 3.0
"""Submit to the first step on a daemon that has run a job before (``bench/quote.py``: 2.9-3.8 s)."""
FIRST_JOB_S = 4.5
"""What a daemon's first job since it started pays more to its first step, until the daemon measured it: its worker
waits for the fork server, started with the job, to import torch (``bench/quote.py``: 7.7-10.0 s in all)."""
UNBILLED_START_S = 2.0
"""Of the start, the part before the leader starts its book (the joins, the election): not billed."""
END_S = 2.0
"""The last commit to ``done`` for a model kind not measured: the last evaluation, the model gathered and exported
(not billed)."""
END_BY_MODEL = {"GPTConfig": 2.8, "MLPConfig": 0.2}
"""The last commit to ``done`` by model config, measured by ``bench/quote.py`` (2.5-3.8 s for the char-GPTs, 0.0-0.2 s
for the MNIST MLP)."""
CHECKPOINT_S = 0.15
"""One checkpoint's commit (shards written and reported, manifest committed), measured by ``bench/quote.py``."""
STEP_FACTORS = {"GPTConfig": 1.45, "MLPConfig": 0.6}
"""The workers' measured median step over the plan's prediction, by model config (``bench/quote.py``)."""
LOW_SHARE = 0.2
HIGH_SHARE = 0.25


def step_factor(spec: JobSpec) -> float:
    """The measured step over the planner's prediction for ``spec``'s kind of model (1: not measured)."""
    return STEP_FACTORS.get(type(spec.model).__name__, 1.0)


def end_seconds(spec: JobSpec) -> float:
    """The last commit to ``done`` for ``spec``'s kind of model (:data:`END_S` when not measured)."""
    return END_BY_MODEL.get(type(spec.model).__name__, END_S)


@dataclass(frozen=True)
class PaidDevice:
    """A plan device the owner pays: its id, measured FLOP/s and price per hour."""

    peer_id: str
    flops_per_s: float
    usd_per_hour: float


@dataclass(frozen=True)
class Forecast:
    """A job's predicted wall time (seconds) and bill (dollars), each a point and a range, with its terms."""

    devices: tuple[str, ...]
    """The plan's devices (those that would take the job)."""
    predicted_step_s: float
    """The plan's predicted step time (the planner's cost model)."""
    step_s: float
    steps: int
    start_s: float
    """Submit to the first step (this daemon's measured; else :data:`START_S`, + :data:`FIRST_JOB_S` on a
    daemon's first job)."""
    checkpoints: int
    checkpoint_s: float
    evals: int
    eval_s: float
    end_s: float
    """The last commit to ``done`` (this daemon's measured; else :data:`END_BY_MODEL`)."""
    seconds: float
    low_s: float
    high_s: float
    paid: tuple[PaidDevice, ...]
    usd: float
    low_usd: float
    high_usd: float
    step_factor: float = 1.0
    """The step over the plan's predicted step (this daemon's measured; else :data:`STEP_FACTORS`)."""
    sources: tuple[tuple[str, str], ...] = ()
    """Where the start, the end and the step factor come from: (term, its figure, range and "measured: ..." or
    "assumed: ...")."""
    assumed: tuple[str, ...] = ()
    """The terms this daemon has not measured (figures from another machine)."""
    steps_usd: float = 0.0
    """The bill's part for the steps, checkpoints and evaluations (without the start)."""
    pause_s: float = -1.0
    """What a checkpoint or an evaluation adds, each, as this daemon measured it (-1: priced as
    ``checkpoint_s`` and ``eval_s``)."""
    busier: float = 1.0
    """How much slower the machine may run the job than when this daemon measured its jobs (its load now over
    theirs: :func:`arceusd.market.timings.busier`); the range's high end is stretched by it."""
    in_flight_cap: int = 0
    """The plan's cap on micro-batches in flight (``partitioner.Plan.in_flight_cap``: the model fits these devices
    no other way, and its predicted step is the slower for it); 0: none."""

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0

    @property
    def usd_per_hour(self) -> float:
        """What the paid devices cost together per hour of the job."""
        return sum(p.usd_per_hour for p in self.paid)

    def _pauses(self) -> str:
        if self.pause_s >= 0:
            return f"{self.evals} checkpoint/evaluation point(s) x {self.pause_s:.2f} s"
        return (
            f"{self.checkpoints} checkpoint(s) x {self.checkpoint_s:.2f} s + {self.evals} eval(s) x {self.eval_s:.2f} s"
        )

    def lines(self) -> list[str]:
        """The forecast for people (``arceusd submit --quote``)."""
        return [
            f"plan      {len(self.devices)} device(s), "
            + (f"at most {self.in_flight_cap} micro-batch(es) in flight to fit memory, " if self.in_flight_cap else "")
            + f"predicted {1000 * self.predicted_step_s:.1f} ms/step (the planner's model)",
            f"time      {_secs(self.seconds)} ({_secs(self.low_s)} to {_secs(self.high_s)}): start {self.start_s:.1f} s"
            f" + {self.steps} steps x {1000 * self.step_s:.1f} ms + {self._pauses()} + end {self.end_s:.1f} s",
            f"cost      ${self.usd:.6f} (${self.low_usd:.6f} to ${self.high_usd:.6f}) for {len(self.paid)} paid "
            f"device(s) at ${self.usd_per_hour:.4f}/h together: your own is not billed",
            *(f"{term:<9} {source}" for term, source in self.sources),
        ]


def count_checkpoints(steps: int, interval: int) -> int:
    """Commits of a run of ``steps``: every ``interval`` steps (0: none) and the last step."""
    if steps <= 0:
        return 0
    return steps // interval + (1 if steps % interval else 0) if interval > 0 else 1


def count_evals(steps: int, checkpoint_interval: int, eval_interval: int) -> int:
    """Evaluations of a run: at every checkpoint and every ``eval_interval`` steps (``arceusd.worker.process``)."""
    if steps <= 0:
        return 0
    a = steps // checkpoint_interval if checkpoint_interval > 0 else 0
    b = steps // eval_interval if eval_interval > 0 else 0
    both = steps // math.lcm(checkpoint_interval, eval_interval) if a and b else 0
    last = (
        0
        if (checkpoint_interval > 0 and steps % checkpoint_interval == 0)
        or (eval_interval > 0 and steps % eval_interval == 0)
        else 1
    )
    return a + b - both + last


def eval_seconds(spec: JobSpec, step_s: float) -> float:
    """One evaluation: its batches' forward pass, priced at the step time x forward FLOPs over training FLOPs x
    eval samples over the step's batch."""
    costs = block_costs(spec.model, optimizer=spec.training.optimizer)
    forward = sum(c.forward_flops_per_sample for c in costs)
    total = sum(c.forward_flops_per_sample + c.backward_flops_per_sample for c in costs)
    if total <= 0:
        return 0.0
    if isinstance(spec.data, MnistDataSpec):
        samples = spec.data.holdout_count
    else:
        samples = spec.training.eval_iters * spec.training.batch_size
    return step_s * (forward / total) * samples / max(spec.training.batch_size, 1)


def forecast(
    spec: JobSpec,
    offers: list[Offer],
    owner: str,
    demand: Demand = NEUTRAL,
    rtt_s: dict[tuple[str, str], float] | None = None,
    links: Mapping[tuple[str, str], Link] | None = None,
    first_job: bool = False,
    timings: Sequence[JobTiming] = (),
    load_now: float = 0.0,
) -> Forecast:
    """The forecast for ``spec`` on ``offers`` (``owner``'s among them), planned as the daemon plans it, paid at
    ``demand`` (the market's while the job runs); ``first_job``: the daemon has run no job since it started;
    ``timings``: what this daemon measured its past jobs to take (:func:`arceusd.market.timings.read_timings`);
    ``load_now``: the machine's load per CPU now (0: not known; :func:`arceusd.market.timings.machine_load`).

    Error handling: :class:`partitioner.PlanError` (what is missing) when no plan fits the offers."""
    if links is None and len(offers) > 1:
        link = measured_link(timings)
        ids = [o.peer_id for o in offers]
        if link is not None:
            links = {(a, b): link for i, a in enumerate(ids) for b in ids[i + 1 :]}
        _, rp = make_job_plan(spec, offers, rtt_s or {}, links, leader=owner)
        f = from_plan(spec, rp, offers, owner, demand, first_job, timings, load_now)
        source = (
            f"round trip {1000 * link.rtt_s:.2f} ms, {link.bandwidth_bytes_per_s / 1e6:.0f} MB/s, "
            f"{1000 * link.message_s:.2f} ms a message, measured: this daemon's newest job with a member"
            if link is not None
            else "assumed: the planner's defaults (this daemon has measured no link in a job yet)"
        )
        return replace(f, sources=(*f.sources, ("links", source)), assumed=f.assumed + (() if link else ("links",)))
    _, rp = make_job_plan(spec, offers, rtt_s or {}, links, leader=owner)
    return from_plan(spec, rp, offers, owner, demand, first_job, timings, load_now)


def rest_usd(
    spec: JobSpec,
    offers: list[Offer],
    leader: str,
    owner: str,
    remaining_steps: int,
    demand: Demand = NEUTRAL,
    timings: Sequence[JobTiming] = (),
) -> float:
    """What the job's ``remaining_steps`` would cost on ``offers`` as the quote prices them (one cost model): the
    leader's plan over them (``leader``'s device in every plan), the steps, checkpoints and evaluations at the
    step factor, each paid device (not ``owner``'s) at its price at ``demand``. A device the plan leaves out (a
    spare) costs nothing. The leader's budget check at a join (``arceusd.market.service.Market.join_refusal``).

    Error handling: :class:`partitioner.PlanError` when no plan fits the offers."""
    if remaining_steps <= 0:
        return 0.0
    _, rp = make_job_plan(spec, offers, {}, None, leader=leader)
    f = from_plan(spec, rp, offers, owner, demand, timings=timings)
    return f.steps_usd * min(remaining_steps, f.steps) / max(f.steps, 1)


def terms(
    spec: JobSpec, predicted_step_s: float, first_job: bool, timings: Sequence[JobTiming], devices: int = 0
) -> tuple[Term, Term, Term]:
    """The start, the end and the step factor of ``spec``'s forecast (its plan predicting ``predicted_step_s`` on
    ``devices``): measured by this daemon, else assumed."""
    model = type(spec.model).__name__
    return (
        start_term(timings, first_job, START_S, FIRST_JOB_S, devices, model),
        end_term(timings, model, end_seconds(spec)),
        step_term(timings, model, predicted_step_s, step_factor(spec)),
    )


def from_plan(
    spec: JobSpec,
    rp: ReplicaPlan,
    offers: list[Offer],
    owner: str,
    demand: Demand = NEUTRAL,
    first_job: bool = False,
    timings: Sequence[JobTiming] = (),
    load_now: float = 0.0,
) -> Forecast:
    """The forecast of ``spec`` under the plan ``rp`` (over ``offers``)."""
    t = spec.training
    devices = tuple(dict.fromkeys(p for plan in rp.replicas for p in plan.peer_ids))
    start, end, factor = terms(spec, rp.predicted_step_time_s, first_job, timings, len(devices))
    interval = spec.checkpoint.interval_steps
    checkpoints = count_checkpoints(t.steps, interval)
    evals = count_evals(t.steps, interval, t.eval_interval_steps)

    pause = pause_term(timings, type(spec.model).__name__, rp.predicted_step_time_s)

    def work(f: float, p: float | None) -> float:  # the steps at a step factor f, the pauses p each (None: priced)
        step = rp.predicted_step_time_s * f
        pauses = checkpoints * CHECKPOINT_S + evals * eval_seconds(spec, step) if p is None else evals * p
        return t.steps * step + pauses

    step_s = rp.predicted_step_time_s * factor.value
    mid, least, most = (None, None, None) if pause is None else (pause.value, pause.low, pause.high)
    seconds = start.value + work(factor.value, mid) + end.value
    low_s = start.low + work(factor.low, least) * (1.0 - LOW_SHARE) + end.low
    slower, then = busier(timings, load_now)
    high_s = start.high + work(factor.high, most) * (1.0 + HIGH_SHARE) * slower + end.high
    by_id = {o.peer_id: o for o in offers}
    cap = float(spec.needs.max_price_per_hour)
    paid = tuple(
        PaidDevice(d, by_id[d].flops_per_s, pay(by_id[d].flops_per_s, cap, demand))
        for d in devices
        if d != owner and d in by_id
    )
    per_s = sum(p.usd_per_hour for p in paid) / 3600.0
    billed_start = min(start.value, START_S) * (1.0 - UNBILLED_START_S / START_S)  # a first job waits unbilled
    usd = (work(factor.value, mid) + billed_start) * per_s
    low_usd = work(factor.low, least) * (1.0 - LOW_SHARE) * per_s
    high_usd = (work(factor.high, most) * (1.0 + HIGH_SHARE) * slower + billed_start) * per_s
    sources: tuple[tuple[str, str], ...] = (
        ("start", f"{start.value:.1f} s ({start.low:.1f} to {start.high:.1f} s), {start.source}"),
        ("end", f"{end.value:.1f} s ({end.low:.1f} to {end.high:.1f} s), {end.source}"),
        ("step", f"x{factor.value:.2f} the plan's ({factor.low:.2f} to {factor.high:.2f}), {factor.source}"),
        (
            "pauses",
            f"assumed: {CHECKPOINT_S:g} s a checkpoint and a forward pass of the evaluation batches (this daemon has "
            "measured none for a job like it)"
            if pause is None
            else f"{pause.value:.2f} s each ({pause.low:.2f} to {pause.high:.2f} s), {pause.source}",
        ),
    )
    if slower > 1.0:
        against = f"against {then:.1f} when this daemon's jobs ran" if then > 0 else "against an idle machine's"
        load = f"{load_now:.1f} per CPU now, {against}: up to {slower:.1f}x slower (the range's top)"
        sources = (*sources, ("load", load))
    measured = (("start", start), ("end", end), ("step", factor))
    return Forecast(
        devices,
        rp.predicted_step_time_s,
        step_s,
        t.steps,
        start.value,
        checkpoints,
        CHECKPOINT_S,
        evals,
        eval_seconds(spec, step_s),
        end.value,
        seconds,
        low_s,
        high_s,
        paid,
        usd,
        low_usd,
        high_usd,
        factor.value,
        sources,
        tuple(name for name, term in measured if not term.measured) + (("pauses",) if pause is None else ()),
        work(factor.value, mid) * per_s,
        -1.0 if pause is None else pause.value,
        slower,
        max(plan.in_flight_cap for plan in rp.replicas),
    )


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.2f} h"


__all__ = [
    "CHECKPOINT_S",
    "END_BY_MODEL",
    "END_S",
    "FIRST_JOB_S",
    "START_S",
    "STEP_FACTORS",
    "Forecast",
    "PaidDevice",
    "count_checkpoints",
    "count_evals",
    "end_seconds",
    "eval_seconds",
    "forecast",
    "from_plan",
    "rest_usd",
    "step_factor",
    "terms",
]
