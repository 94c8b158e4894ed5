"""What this daemon measured its own jobs' fixed terms to take, for the quote (issue 31). Torch-free.

The quote's start (submit to the first step) and end (the last commit to ``done``: the last evaluation, the model
gathered and exported) do not scale with the steps: on an idle 16-core machine they took 3 s (+ 4.5 s on a
daemon's first job) and 2.8 s for a char-GPT; on a quiet 2-core one the first step came after 1.7-3.6 s. A figure
fitted on one machine is wrong on another, so each daemon keeps what its own jobs took: when a job it owns ends
``done`` without a recovery, the driver (``arceusd.jobs.service.driver``) appends a :class:`JobTiming` to
``job_timings.json`` in its state directory (the newest :data:`KEEP`), and the quote (``arceusd.market.estimate``,
:mod:`arceusd.market.forecast`) takes each term from there:

- start: the median of the daemon's past jobs of the same kind (a first job since the daemon started, or a later
  one; a later job with only first jobs measured takes theirs less what their worker waited for the fork server
  to import torch, measured, else an assumed wait) of the same model
  on as many devices, else on as many devices (each starts a worker, builds its part of the model and measures
  its links: on a 2-core machine 0.3 s for the MNIST MLP and 1.5-2.8 s for a char-GPT on one device, 1.9-3.3 s on
  two), the range from the fastest to the slowest of them;
- end: the median of its past jobs of the same model config (a GPT's export is not an MLP's), the range likewise;
- pause (what a checkpoint or an evaluation adds, per point that holds one: :func:`pause_term`) and step factor
  (a typical step, :func:`typical_step`, over the plan's predicted step): the median of its past
  jobs of the same model config whose plan predicted a step within :data:`LIKE_STEP` of this one's (the planner's
  error depends on the model's size: 1.6x for a 2-layer, 64-wide char-GPT and 1.8x for a 4-layer, 128-wide one,
  0.5x for the MNIST MLP, measured on the same 2-core machine), the range likewise.

The links between the quote's devices: the one this daemon measured to a member in its newest job that had one
(:func:`measured_link`), else the planner's defaults. The quote's further devices: the peers its past jobs ran
with, at the speed their plans took them (:func:`peer_speeds`: claimed, divided by how much slower the leader
measured them), else as fast as this device (said to be assumed).

When nothing is measured yet, the term is the 16-core machine's figure, said to be assumed (the quote's text and
JSON name it), with a wider range (:data:`ASSUMED_LOW`, :data:`ASSUMED_HIGH`).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from arceusd.base.atomic_files import atomic_write
from partitioner import Link
from partitioner.inputs import MAX_BLOCK_EFFICIENCY

TIMINGS_FILE = "job_timings.json"
KEEP = 40
"""Timings the file keeps (the newest)."""
RECENT = 8
"""Timings of one kind a term is taken from (the newest): a machine changes (load, a new library)."""
LIKE_STEP = 1.5
"""A past job's step factor stands for a job whose plan's predicted step is within this factor of its own."""
ASSUMED_LOW = 0.3
ASSUMED_HIGH = 1.5
"""An assumed term's range, as shares of it: it was measured on another machine (0.5-1.3x there and here)."""
ASSUMED_STEP_LOW = 0.7
ASSUMED_STEP_HIGH = 1.3
"""An assumed step factor's range, as shares of it (0.55-1.6x over the kinds measured on two machines)."""


@dataclass(frozen=True)
class JobTiming:
    """What one finished job took on its owner, measured by the owner's daemon."""

    model: str
    """The model config's class name (``GPTConfig``, ``MLPConfig``, ...)."""
    start_s: float
    """Submit to the first step, and the warm-up of the first steps beyond typical ones (:func:`warmup_of`)."""
    end_s: float
    """The last commit to ``done``."""
    first: bool
    """The daemon's first job since it started."""
    step_ratio: float = 0.0
    """The typical step (:func:`typical_step`) over the plan's predicted step (0: not measured)."""
    at: float = 0.0
    """Unix time it ended."""
    predicted_step_s: float = 0.0
    """The plan's predicted step (0: no plan)."""
    devices: int = 0
    """The plan's devices (0: not recorded)."""
    link: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The slowest link the leader measured to a member: round trip (s), bandwidth (bytes/s), per-message cost (s);
    zeros: none measured (a job alone)."""
    pause_s: float = -1.0
    """What a checkpoint or an evaluation added to the run, per point that held one before the last step: the
    span from the first to the last step less the typical steps, over those points (-1: not measured)."""
    load: float = 0.0
    """The machine's 1-minute load average per CPU when the job ended (:func:`machine_load`; 0: not recorded)."""
    peers: tuple[tuple[str, float, float], ...] = ()
    """The job's other members as its plan took them: (peer id, FLOP/s, block efficiency), each member's offered
    speed divided by what the leader measured it to run slower (``claims.discounted``): a quote's peers."""
    server_wait_s: float = 0.0
    """Of ``start_s``, what its first worker waited for this daemon's fork server to import torch (a daemon's
    first job: the server starts with it; ``arceusd.jobs.procs.warm_starts``): a later job does not pay it."""


@dataclass(frozen=True)
class Term:
    """One term of the quote: its value and range, and whether this daemon measured it."""

    value: float
    low: float
    high: float
    measured: int
    """How many of this daemon's past jobs it comes from (0: assumed)."""
    source: str
    """Where it comes from, for people."""


SKIP_STEPS = 3
WARMUP_STEPS = 20
"""A worker's first steps allocate and warm up: on a 2-core machine an MNIST MLP's steps 5-20 took 3-6x its
later ones, a char-GPT's 1.3x (bench/quote.py, 28 Nov). A typical step leaves out the first :func:`warmup_steps`;
what they took beyond it is the job's warm-up (:func:`warmup_of`), a fixed cost the quote's start carries."""


def warmup_steps(last_step: int) -> int:
    """The warm-up of a run to ``last_step``: its first fifth, at least :data:`SKIP_STEPS` and at most
    :data:`WARMUP_STEPS` steps."""
    return max(SKIP_STEPS, min(WARMUP_STEPS, last_step // 5))


def pause_steps(steps: int, checkpoint_interval: int, eval_interval: int) -> frozenset[int]:
    """The steps before the last after which a checkpoint or an evaluation runs (``arceusd.worker.process``): its
    pause falls in the interval from that step to the next."""
    every = [i for i in (checkpoint_interval, eval_interval) if i > 0]
    return frozenset(s for i in every for s in range(i, steps, i))


def _held(s1: int, s2: int, pauses: frozenset[int]) -> bool:
    """Whether the interval from step ``s1`` to ``s2`` holds a pause (a checkpoint or an evaluation after one of
    its steps)."""
    return any(s1 <= p < s2 for p in pauses)


def typical_step(points: Sequence[tuple[int, float]], pauses: frozenset[int] = frozenset()) -> float:
    """A step as the job took it, from its (step, wall time) points: the time per step over the intervals past
    the warm-up (:func:`warmup_steps`) that hold no pause (``pauses``: :func:`pause_steps`; 0: fewer than three
    such intervals). A 30-step job's span from its first to its last step measured twice its 300-step run's step
    on the same machine (its first steps were slow); without them it does not. A busy machine's hiccups stay in
    (issue 31: trimming the slowest tenth of the intervals moved them into the pauses, which the quote then
    multiplied by another job's count of checkpoints: a 300-step char-GPT's 2 pauses measured 11 s each, of which
    a checkpoint took 0.9 s; an MNIST job's pause measured over 1 point was quoted over 16)."""
    skip = warmup_steps(points[-1][0]) if points else SKIP_STEPS
    kept = [
        (s2 - s1, t2 - t1)
        for (s1, t1), (s2, t2) in itertools.pairwise(points)
        if s2 > s1 and s1 > skip and t2 >= t1 and not _held(s1, s2, pauses)
    ]
    if len(kept) < 3:
        return 0.0
    return sum(t for _, t in kept) / sum(n for n, _ in kept)


def _term(values: Sequence[float], what: str) -> Term:
    recent = list(values)[-RECENT:]
    return Term(
        statistics.median(recent),
        min(recent),
        max(recent),
        len(recent),
        f"measured: the median of this daemon's last {len(recent)} {what}",
    )


def _assumed(value: float, why: str, low: float = ASSUMED_LOW, high: float = ASSUMED_HIGH) -> Term:
    return Term(value, value * low, value * high, 0, f"assumed: {why}")


def start_term(
    records: Sequence[JobTiming],
    first_job: bool,
    assumed_s: float,
    assumed_first_s: float,
    devices: int = 0,
    model: str = "",
) -> Term:
    """The start of a ``model`` job on ``devices`` (``first_job``: the daemon's first since it started) from
    ``records`` (of that model on as many devices where there are some, else on as many devices: each starts a
    worker, builds its part of the model and measures its links); else ``assumed_s`` (+ ``assumed_first_s`` on a
    first job). A daemon's first job waits for its fork server to import torch (the server starts with the first
    job: :attr:`JobTiming.server_wait_s`, 3.0 s on a quiet 2-core machine, 6 s beside other work); a later job
    does not, so its start is a first job's less that wait where it was measured."""
    waits = [r.server_wait_s for r in records if r.first and r.server_wait_s > 0]  # (any model: torch's import)
    same = [r for r in records if r.devices == devices]
    records = [r for r in same if r.model == model] or same or records
    firsts = [r.start_s for r in records if r.first]
    laters = [r.start_s for r in records if not r.first]
    if first_job and firsts:
        return _term(firsts, "first jobs' start (submit to the first step, and its warm-up)")
    if first_job and laters:  # a first job waits for the fork server's import of torch more
        if waits:
            wait = statistics.median(waits)
            t = _term(laters, f"jobs' start, plus the {wait:.1f} s a first job's worker waited for torch's import")
        else:
            wait = assumed_first_s
            t = _term(laters, "jobs' start, plus an assumed first job's wait for torch's import")
        return Term(t.value + wait, t.low, t.high + wait, t.measured, t.source)
    if laters:
        return _term(laters, "jobs' start (submit to the first step, and its warm-up)")
    floor = assumed_s * ASSUMED_LOW
    measured_waits = [r.start_s - r.server_wait_s for r in records if r.first and r.server_wait_s > 0]
    if measured_waits:  # a later job starts without the first job's wait for the fork server, measured
        return _term(
            measured_waits, "first jobs' start less what their worker waited for torch's import (a later job's)"
        )
    if firsts:  # a later job starts faster, by the first job's wait, which the first alone does not say
        t = _term(
            firsts,
            f"first jobs' start, less an assumed first job's wait ({assumed_first_s:g} s), at most the assumed "
            f"{assumed_s:g} s (a first job's start says little of a later one's)",
        )
        value = min(max(t.value - assumed_first_s, floor), assumed_s)
        return Term(value, min(value, floor), max(t.high, value), t.measured, t.source)
    why = "this daemon has finished no job yet (measured on an idle 16-core machine)"
    if first_job:
        return _assumed(assumed_s + assumed_first_s, f"{why}; its first job waits for the fork server to import torch")
    return _assumed(assumed_s, why)


def end_term(records: Sequence[JobTiming], model: str, assumed_s: float) -> Term:
    """The last commit to ``done`` of a ``model`` job, from ``records`` of that model; else ``assumed_s``."""
    ends = [r.end_s for r in records if r.model == model]
    if ends:
        return _term(ends, f"{model} jobs' end (the last commit to done)")
    return _assumed(assumed_s, f"this daemon has finished no {model} job yet (measured on an idle 16-core machine)")


SPREAD_LOW = 0.33
SPREAD_HIGH = 1.7
"""How far one job's step factor (and pauses) may fall from an earlier like job's on the same machine, as shares
of it, until this daemon has measured its own spread (:data:`SPREAD_SAMPLES`): on a 2-core machine shared with
other sessions' test suites (load 3-29), bench/quote.py's jobs measured 0.33-1.66x the factor of the like job
before them (8 pairs over 4 runs; its load changed meanwhile)."""
SPREAD_SAMPLES = 4
"""Like jobs' deviations from their group's median a measured spread needs (fewer: :data:`SPREAD_LOW`,
:data:`SPREAD_HIGH`)."""
SPREAD_FLOOR = 0.1
"""A measured spread is at least this share either way (a few like jobs that happened to agree)."""


def spread(records: Sequence[JobTiming], value: Callable[[JobTiming], float]) -> tuple[float, float, int]:
    """How far this daemon's like jobs (same model, like predicted step) fell from each other: the lowest and
    highest of each job's ``value`` over the median of its like jobs (those of its group with two or more), as
    shares, and how many jobs that is; :data:`SPREAD_LOW`, :data:`SPREAD_HIGH` and 0 with fewer than
    :data:`SPREAD_SAMPLES`. A term measured once (the same job's step, reused) is as uncertain as the machine
    is noisy: its range is widened to this."""
    measured = [r for r in list(records)[-KEEP:] if value(r) > 0]
    shares = []
    for r in measured:
        group = [value(o) for o in measured if _like(o, r.model, r.predicted_step_s)]
        if len(group) >= 2:
            shares.append(value(r) / statistics.median(group))
    if len(shares) < SPREAD_SAMPLES:
        return SPREAD_LOW, SPREAD_HIGH, 0
    return min(min(shares), 1.0 - SPREAD_FLOOR), max(max(shares), 1.0 + SPREAD_FLOOR), len(shares)


def _widened(t: Term, low: float, high: float, samples: int) -> Term:
    """``t`` with its range at least ``low`` to ``high`` times its value."""
    how = (
        f"a range at least the {low:.2f}-{high:.2f}x this daemon's {samples} like jobs fell from each other"
        if samples
        else f"a range at least {low:.2f}-{high:.2f}x: one run of a job against the next on a shared machine"
    )
    return Term(t.value, min(t.low, t.value * low), max(t.high, t.value * high), t.measured, f"{t.source}; {how}")


def step_term(records: Sequence[JobTiming], model: str, predicted_step_s: float, assumed: float) -> Term:
    """The measured step over the plan's predicted step for a ``model`` job whose plan predicts
    ``predicted_step_s``, from ``records`` of that model and a like predicted step (:data:`LIKE_STEP`), its range
    at least what like jobs fell from each other (:func:`spread`); else ``assumed``."""
    ratios = [r.step_ratio for r in records if r.step_ratio > 0 and _like(r, model, predicted_step_s)]
    if ratios:
        t = _term(ratios, f"{model} jobs' measured step over the plan's, of a like predicted step")
        return _widened(t, *spread(records, lambda r: r.step_ratio))
    return _assumed(
        assumed,
        f"this daemon has finished no {model} job of a like predicted step yet (measured on an idle 16-core machine)",
        ASSUMED_STEP_LOW,
        ASSUMED_STEP_HIGH,
    )


def _like(r: JobTiming, model: str, predicted_step_s: float) -> bool:
    return (
        r.model == model
        and r.predicted_step_s > 0
        and 1 / LIKE_STEP <= predicted_step_s / r.predicted_step_s <= LIKE_STEP
    )


def pause_term(records: Sequence[JobTiming], model: str, predicted_step_s: float) -> Term | None:
    """What a checkpoint or an evaluation adds to a ``model`` job whose plan predicts ``predicted_step_s``, per
    point that holds one, from ``records`` of that model and a like predicted step (None: not measured; the
    quote then prices them as :data:`arceusd.market.forecast.CHECKPOINT_S` and a forward pass of the evaluation
    batches). An MNIST MLP's checkpoints and evaluations added about nothing on a 2-core machine, where 0.15 s a
    checkpoint was assumed."""
    pauses = [r.pause_s for r in records if r.pause_s >= 0 and _like(r, model, predicted_step_s)]
    if not pauses:
        return None
    t = _term(pauses, f"{model} jobs' pause per checkpoint or evaluation, of a like predicted step")
    return _widened(t, *spread(records, lambda r: r.pause_s))


def pause_of(points: Sequence[tuple[int, float]], step_s: float, pauses: frozenset[int]) -> float:
    """:attr:`JobTiming.pause_s` of a run whose (step, wall time) ``points`` hold a checkpoint or an evaluation
    after each step of ``pauses`` (:func:`pause_steps`), at a typical step ``step_s``: what each interval holding
    one took beyond its steps, per pause (-1: none to say). The rest of the run (a busy machine's hiccups) is in
    the typical step: it grows with the steps, not with the checkpoints."""
    if step_s <= 0:
        return -1.0
    extra, held = 0.0, 0
    skip = warmup_steps(points[-1][0]) if points else SKIP_STEPS
    for (s1, t1), (s2, t2) in itertools.pairwise(points):
        n = sum(1 for p in pauses if s1 <= p < s2)
        if s2 > s1 and s1 > skip and t2 >= t1 and n:
            extra += max(t2 - t1 - (s2 - s1) * step_s, 0.0)
            held += n
    return extra / held if held else -1.0


def warmup_of(points: Sequence[tuple[int, float]], step_s: float, pauses: frozenset[int] = frozenset()) -> float:
    """What a run's warm-up (its first :func:`warmup_steps`) took beyond as many typical steps ``step_s``, from its
    (step, wall time) points, less the intervals that hold a pause (``pauses``: the quote counts those apart; 0:
    not enough to say). The driver adds it to the job's start: a fixed cost, which a step factor would have
    charged again per step of a longer job."""
    if len(points) < 2 or step_s <= 0:
        return 0.0
    skip = warmup_steps(points[-1][0])
    extra = sum(
        t2 - t1 - (s2 - s1) * step_s
        for (s1, t1), (s2, t2) in itertools.pairwise(points)
        if s1 <= skip and s2 > s1 and not _held(s1, s2, pauses)
    )
    return max(extra, 0.0)


def read_timings(state_dir: Path) -> list[JobTiming]:
    """This daemon's measured timings, oldest first (none: no file, or one that does not parse)."""
    try:
        raw = json.loads((state_dir / TIMINGS_FILE).read_text())
        return [
            JobTiming(
                str(r["model"]),
                float(r["start_s"]),
                float(r["end_s"]),
                bool(r["first"]),
                float(r.get("step_ratio", 0.0)),
                float(r.get("at", 0.0)),
                float(r.get("predicted_step_s", 0.0)),
                int(r.get("devices", 0)),
                _link(r.get("link")),
                float(r.get("pause_s", -1.0)),
                min(max(float(r.get("load", 0.0)), 0.0), MAX_LOAD),
                _peers(r.get("peers")),
                min(max(float(r.get("server_wait_s", 0.0)), 0.0), float(r["start_s"])),
            )
            for r in raw
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


MAX_LOAD = 1000.0
"""The highest load per CPU a timing keeps."""


def machine_load() -> float:
    """This machine's 1-minute load average per CPU (0: the platform does not say)."""
    try:
        return round(os.getloadavg()[0] / (os.cpu_count() or 1), 3)
    except OSError:
        return 0.0


MAX_BUSIER = 5.0
"""The most a busier machine stretches the quote's range (:func:`busier`)."""


def busier(records: Sequence[JobTiming], load_now: float) -> tuple[float, float]:
    """How much slower the machine may run a job now than when this daemon measured its jobs: the load per CPU
    now over the median of theirs (each at least 1: a machine not fully used runs at its profile's speed), at
    least 1 and at most :data:`MAX_BUSIER`; with the median load (0: none recorded; the assumed figures come from
    an idle machine). The 1-minute load is a poor predictor of one job's step (other work comes and goes), so
    the quote stretches its range's high end by it, not its point: bench/quote.py's 150-step char-GPT took 3.2x
    its quote when the machine's load went from 1.6 to 6.6 per CPU."""
    loads = [r.load for r in list(records)[-RECENT:] if r.load > 0]
    then = statistics.median(loads) if loads else 0.0
    if load_now <= 0:
        return 1.0, then
    return min(max(max(load_now, 1.0) / max(then, 1.0), 1.0), MAX_BUSIER), then


MAX_PEERS = 64
"""The most peers one timing keeps."""


def _peers(raw: object) -> tuple[tuple[str, float, float], ...]:
    if not isinstance(raw, list | tuple):
        return ()
    out = []
    for row in raw[:MAX_PEERS]:
        if isinstance(row, list | tuple) and len(row) == 3 and isinstance(row[0], str) and len(row[0]) <= 128:
            flops, efficiency = float(row[1]), float(row[2])
            if 0 < flops < 1e18 and 0 < efficiency <= MAX_BLOCK_EFFICIENCY:  # (a block may beat the benchmark)
                out.append((row[0], flops, efficiency))
    return tuple(out)


def peer_speeds(records: Sequence[JobTiming]) -> list[tuple[str, float, float]]:
    """The peers this daemon's jobs ran with, newest first, each once: (peer id, FLOP/s as its plan took it, block
    efficiency). A quote plans its further devices at these speeds (issue 31: it assumed every peer as fast as
    this device)."""
    seen: dict[str, tuple[str, float, float]] = {}
    for r in reversed(records):
        for peer in r.peers:
            seen.setdefault(peer[0], peer)
    return list(seen.values())


def _link(raw: object) -> tuple[float, float, float]:
    if isinstance(raw, list | tuple) and len(raw) == 3:
        return float(raw[0]), float(raw[1]), float(raw[2])
    return 0.0, 0.0, 0.0


def measured_link(records: Sequence[JobTiming]) -> Link | None:
    """The link this daemon measured to a member in its newest job that had one (None: none yet): what a quote
    assumes between every two devices, where the planner's defaults were (issue 31: the daemon's real plan, over
    the links it measured, left out a device the quote planned on)."""
    for r in reversed(records):
        rtt, bandwidth, message = r.link
        if bandwidth > 0:
            return Link(rtt, bandwidth, message)
    return None


def record_timing(state_dir: Path, timing: JobTiming) -> None:
    """Append ``timing`` to this daemon's file (the newest :data:`KEEP` kept). Error handling: OSError."""
    records = [*read_timings(state_dir), timing][-KEEP:]
    atomic_write(state_dir / TIMINGS_FILE, json.dumps([asdict(r) for r in records], indent=1).encode())


__all__ = [
    "ASSUMED_HIGH",
    "ASSUMED_LOW",
    "KEEP",
    "LIKE_STEP",
    "MAX_BUSIER",
    "TIMINGS_FILE",
    "JobTiming",
    "Term",
    "busier",
    "end_term",
    "machine_load",
    "measured_link",
    "pause_of",
    "pause_steps",
    "pause_term",
    "peer_speeds",
    "read_timings",
    "record_timing",
    "spread",
    "start_term",
    "step_term",
    "typical_step",
    "warmup_of",
    "warmup_steps",
]
