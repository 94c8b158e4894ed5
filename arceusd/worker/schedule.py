"""Pipeline schedules as pure per-stage action lists (GPipe and 1F1B).

A schedule is a tuple of frozen actions for one stage; the engine only executes it. Stage ``s`` of ``S``:
- the first stage has no ``RecvActivation`` (it reads the owner's inputs) and no ``SendGrad``;
- the last stage has no ``SendActivation``/``RecvGrad``: it runs ``ComputeLoss(i)`` after
  ``Forward(i)``, and its ``Backward(i)`` starts from that loss;
- every list ends with one ``OptimizerStep`` (a barrier across all stages: gradient clipping all-reduces).

Transport contract the schedules rely on: messages between two neighbours arrive in send order, and a send
may block only while an earlier message in the same direction is still undelivered (each direction buffers
at least one message). With strict rendezvous sends (buffer 0) 1F1B's steady state deadlocks (a stage sends
its activation while its successor sends a gradient back), as in every 1F1B implementation that does not
fuse send/recv pairs. ``simulate`` checks this for any schedule.

1F1B: stage ``s < S - 1`` runs ``min(S - s - 1 + LOOKAHEAD, m)`` warm-up forwards (the last stage none: it
has no gradient to wait for), then alternates one forward and one backward, then drains the
remaining backwards; :func:`one_f_one_b_in_flight` is how many micro-batches a stage stashes at once (GPipe
stashes all ``m``).

Why the look-ahead: in textbook 1F1B (PipeDream-flush, warm-up ``S - s - 1``) a stage that sends activations
runs ``Forward(i + 1)`` and then waits for the gradient of micro-batch ``i``, which has to travel to the
next stage, through its forward and backward, and back; with two stages every micro-batch puts that round
trip on the critical path (simulated with 2 x 5 ms per message on an 8 micro-batch step of 51 ms per
micro-batch: 1.64x over one process against 1.75x for GPipe). One more warm-up forward on every stage but
the last gives the stage the next forward to run while the gradient is in flight, for one more stashed
micro-batch. The order of the backwards (and so the accumulated gradients, bit for bit) is unchanged.

Deferred weights (zero-bubble style, on by default): a stage's backward is two halves, the gradient of its
input (which the previous stage waits for) and its parameters' gradients (which nobody waits for). On every
stage but the first, a few backwards compute only the input's half (``Backward(defer_weights=True)``),
``SendGrad`` sends it at once, and their ``WeightGrad``s run, in micro-batch order, after the stage's last
``SendGrad``, in time the stage would otherwise spend waiting for the optimizer barrier. Which ones
(:func:`deferred_micro_batches`), chosen with the timed replay (``schedule_timing.py``) over even and
random uneven stages:
- in 1F1B the last ``min(s + 1, S - s + 1)`` on stage ``s`` of ``S`` (the drain: the last gradient crosses
  every stage, and stage ``s`` has about ``s`` backwards of others' to wait for; the cap keeps a middle
  stage's stash at its steady size and the last stage's at 2, a bound the planner can use without knowing the
  stage count);
- in GPipe the first ``2 s`` (the first gradients to cross the stages start every earlier stage's backwards;
  with only ``s``, a stage a little slower than the one before it, as a last stage with the head and the loss
  is, stays on the critical path for the whole backward phase: the replay over random uneven stages is
  0.5-1.5% shorter with ``2 s``, even stages alike, and ``bench/pipeline.py``'s GPipe step 1.5% shorter;
  GPipe stashes every micro-batch anyway, so holding two a little longer costs no memory).

The engine splits a backward without computing anything twice (``split_backward.py``), but the split costs
about 13% of a backward on CPU (the weights' half reads its operands cold; measured figures in
``schedule_timing.SPLIT_COST``), so not every backward splits, and the worker turns the split on only where
``schedule_timing.deferring_pays`` says it shortens the step for the plan's stage times. Same kernels on the
same values: in 1F1B, accumulated in the same micro-batch order, the results equal the unsplit schedule's bit
for bit; in GPipe the deferred first micro-batches are added last, so they differ by the rounding of that sum.
A deferred micro-batch keeps its stash until its ``WeightGrad`` (:func:`max_in_flight` counts it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class RecvActivation:
    micro_batch: int


@dataclass(frozen=True)
class Forward:
    micro_batch: int


@dataclass(frozen=True)
class SendActivation:
    micro_batch: int


@dataclass(frozen=True)
class ComputeLoss:
    micro_batch: int


@dataclass(frozen=True)
class RecvGrad:
    micro_batch: int


@dataclass(frozen=True)
class Backward:
    micro_batch: int
    defer_weights: bool = False
    """True: compute only the gradient of the stage's input now, so that ``SendGrad`` leaves at once, and the
    parameters' gradients at the ``WeightGrad`` of the same micro-batch that follows it."""


@dataclass(frozen=True)
class WeightGrad:
    """The parameters' gradients of a micro-batch whose ``Backward`` deferred them."""

    micro_batch: int


@dataclass(frozen=True)
class SendGrad:
    micro_batch: int


@dataclass(frozen=True)
class OptimizerStep:
    pass


Action = (
    RecvActivation
    | Forward
    | SendActivation
    | ComputeLoss
    | RecvGrad
    | Backward
    | SendGrad
    | WeightGrad
    | OptimizerStep
)


#: Extra warm-up forwards of 1F1B on every stage but the last (see the module docstring).
LOOKAHEAD = 1
#: Whether some backwards defer their weights' gradients (see the module docstring).
DEFER_WEIGHTS = True


class ScheduleKind(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


def _check(stage: int, num_stages: int, num_micro_batches: int) -> None:
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} out of range for {num_stages} stages")
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be >= 1, got {num_micro_batches}")


def _forward_unit(i: int, stage: int, num_stages: int) -> list[Action]:
    acts: list[Action] = []
    if stage > 0:
        acts.append(RecvActivation(i))
    acts.append(Forward(i))
    acts.append(SendActivation(i) if stage < num_stages - 1 else ComputeLoss(i))
    return acts


def _backward_unit(i: int, stage: int, num_stages: int, defer: bool = False) -> list[Action]:
    acts: list[Action] = []
    if stage < num_stages - 1:
        acts.append(RecvGrad(i))
    acts.append(Backward(i, defer_weights=defer))
    if stage > 0:
        acts.append(SendGrad(i))
    return acts


def deferred_micro_batches(kind: ScheduleKind | str, stage: int, num_stages: int, num_micro_batches: int) -> range:
    """The micro-batches whose backward defers its weights on ``stage`` (none on the first stage, which sends
    no gradient): in 1F1B the last ``min(stage + 1, num_stages - stage + 1)``, in GPipe the first
    ``2 * stage`` (see the module docstring)."""
    _check(stage, num_stages, num_micro_batches)
    m = num_micro_batches
    if ScheduleKind(kind) is ScheduleKind.GPIPE:
        return range(min(m, 2 * stage))
    if stage == 0:
        return range(m, m)
    return range(m - min(m, stage + 1, num_stages - stage + 1), m)


def _deferred(kind: ScheduleKind, stage: int, num_stages: int, num_micro_batches: int, on: bool) -> range:
    return deferred_micro_batches(kind, stage, num_stages, num_micro_batches) if on else range(0)


def _finish(acts: list[Action], deferred: range) -> tuple[Action, ...]:
    """The deferred weight passes in micro-batch order, then the optimizer step."""
    acts += [WeightGrad(i) for i in deferred]
    acts.append(OptimizerStep())
    return tuple(acts)


def gpipe(
    stage: int, num_stages: int, num_micro_batches: int, *, defer_weights: bool = DEFER_WEIGHTS
) -> tuple[Action, ...]:
    """All forwards, then all backwards (in micro-batch order), the deferred weight passes, then the optimizer
    step."""
    _check(stage, num_stages, num_micro_batches)
    deferred = _deferred(ScheduleKind.GPIPE, stage, num_stages, num_micro_batches, defer_weights)
    acts: list[Action] = []
    for i in range(num_micro_batches):
        acts += _forward_unit(i, stage, num_stages)
    for i in range(num_micro_batches):
        acts += _backward_unit(i, stage, num_stages, i in deferred)
    return _finish(acts, deferred)


def one_f_one_b_warmup(stage: int, num_stages: int, num_micro_batches: int, lookahead: int = LOOKAHEAD) -> int:
    """Warm-up forwards of ``stage`` in 1F1B: ``S - s - 1``, plus ``lookahead`` on every stage but the last,
    at most ``m``."""
    extra = lookahead if stage < num_stages - 1 else 0
    return min(num_stages - stage - 1 + extra, num_micro_batches)


def one_f_one_b_in_flight(
    stage: int,
    num_stages: int,
    num_micro_batches: int,
    lookahead: int = LOOKAHEAD,
    *,
    defer_weights: bool = DEFER_WEIGHTS,
) -> int:
    """Micro-batches ``stage`` stashes at once in 1F1B: its warm-up forwards plus the one in steady state, or,
    on the last stage, its deferred micro-batches when there are more (a middle stage's deferred ones are held
    in the drain, when its stash has already shrunk)."""
    steady = min(one_f_one_b_warmup(stage, num_stages, num_micro_batches, lookahead) + 1, num_micro_batches)
    if defer_weights and stage == num_stages - 1:
        return max(steady, len(deferred_micro_batches(ScheduleKind.ONE_F_ONE_B, stage, num_stages, num_micro_batches)))
    return steady


def one_f_one_b(
    stage: int,
    num_stages: int,
    num_micro_batches: int,
    lookahead: int = LOOKAHEAD,
    *,
    defer_weights: bool = DEFER_WEIGHTS,
    max_in_flight: int = 0,
) -> tuple[Action, ...]:
    """PipeDream-flush 1F1B with ``lookahead`` extra warm-up forwards (0: the textbook schedule): warm-up
    forwards, steady one-forward-one-backward, drain backwards, the deferred weight passes. ``max_in_flight``
    > 0 (the plan's ``in_flight_cap``: a model that fits no other way): at most that many micro-batches stashed
    at once, so at most ``max_in_flight - 1`` warm-up forwards and no deferred weights (a deferred micro-batch
    keeps its stash). The warm-ups still shrink from the first stage to the last, so no stage waits on a
    forward its successor has not been sent (``simulate``), and the backwards run in the same order."""
    _check(stage, num_stages, num_micro_batches)
    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    if max_in_flight < 0:
        raise ValueError(f"max_in_flight must be >= 0 (0: no cap), got {max_in_flight}")
    m = num_micro_batches
    warmup = one_f_one_b_warmup(stage, num_stages, m, lookahead)
    if max_in_flight:
        warmup, defer_weights = min(warmup, max_in_flight - 1), False
    deferred = _deferred(ScheduleKind.ONE_F_ONE_B, stage, num_stages, m, defer_weights)
    acts: list[Action] = []
    for i in range(warmup):
        acts += _forward_unit(i, stage, num_stages)
    for j in range(m - warmup):
        acts += _forward_unit(warmup + j, stage, num_stages)
        acts += _backward_unit(j, stage, num_stages, j in deferred)
    for j in range(m - warmup, m):
        acts += _backward_unit(j, stage, num_stages, j in deferred)
    return _finish(acts, deferred)


def build_schedule(
    kind: ScheduleKind | str,
    stage: int,
    num_stages: int,
    num_micro_batches: int,
    *,
    defer_weights: bool = DEFER_WEIGHTS,
    max_in_flight: int = 0,
) -> tuple[Action, ...]:
    """The action list of ``stage`` for the named schedule (``"gpipe"`` or ``"1f1b"``); ``defer_weights``: some
    backwards defer their weights' gradients (:func:`deferred_micro_batches`); ``max_in_flight``: 1F1B's cap on
    stashed micro-batches (:func:`one_f_one_b`; GPipe, which a spec may force, stashes all of them)."""
    try:
        k = ScheduleKind(kind)
    except ValueError:
        raise ValueError(f"unknown schedule {kind!r}; expected 'gpipe' or '1f1b'") from None
    if k is ScheduleKind.GPIPE:
        return gpipe(stage, num_stages, num_micro_batches, defer_weights=defer_weights)
    return one_f_one_b(stage, num_stages, num_micro_batches, defer_weights=defer_weights, max_in_flight=max_in_flight)


def max_in_flight(actions: Sequence[Action]) -> int:
    """Largest number of micro-batches forwarded but not yet backwarded (stashes held) at once."""
    live = peak = 0
    for a in actions:
        if isinstance(a, Forward):
            live += 1
            peak = max(peak, live)
        elif isinstance(a, WeightGrad) or (isinstance(a, Backward) and not a.defer_weights):
            live -= 1  # a deferred backward keeps its stash until the weights' gradients
    return peak


@dataclass(frozen=True)
class SimulationResult:
    finished: bool
    """True when every stage ran its whole list."""
    positions: tuple[int, ...]
    """How many actions each stage completed."""
    error: str | None = None
    """Set when a receive found a different micro-batch than it expected (out-of-order schedule)."""


def simulate(schedules: Sequence[Sequence[Action]], capacity: int = 1) -> SimulationResult:
    """Run all stages' lists with blocking send/recv semantics and report whether they all finish.

    Each direction between neighbours is a FIFO holding at most ``capacity`` undelivered messages (0 means
    rendezvous: a send completes only after the receiver took the message). A receive blocks until a
    message is there. ``OptimizerStep`` is a barrier across all stages. Pure; the loop is bounded by the
    total action count.
    """
    n = len(schedules)
    sim = _Sim(schedules, capacity)
    total = sum(len(s) for s in schedules)
    for _ in range(3 * total + 1):
        if all(sim.pos[s] == len(schedules[s]) for s in range(n)):
            return SimulationResult(True, tuple(sim.pos))
        progressed = False
        for s in range(n):
            if sim.pos[s] == len(schedules[s]):
                continue
            outcome = sim.step(s, schedules[s][sim.pos[s]])
            if isinstance(outcome, str):
                return SimulationResult(False, tuple(sim.pos), outcome)
            progressed = progressed or outcome
        if not progressed:
            return SimulationResult(False, tuple(sim.pos))
    return SimulationResult(all(sim.pos[s] == len(schedules[s]) for s in range(n)), tuple(sim.pos))


class _Sim:
    """Mutable state of ``simulate`` (private; the public function stays pure)."""

    def __init__(self, schedules: Sequence[Sequence[Action]], capacity: int) -> None:
        n = len(schedules)
        self.schedules = schedules
        self.capacity = capacity
        self.pos = [0] * n
        self.act_q: list[deque[int]] = [deque() for _ in range(n)]  # activations travelling to stage s
        self.grad_q: list[deque[int]] = [deque() for _ in range(n)]  # gradients travelling to stage s
        self.offering = [False] * n  # rendezvous: stage s has put its message out and waits for the taker

    def step(self, s: int, a: Action) -> bool | str:
        """Try ``a`` on stage ``s``: True if anything changed, False if blocked, text on a bad schedule."""
        n = len(self.schedules)
        if isinstance(a, SendActivation | SendGrad):
            dst = s + 1 if isinstance(a, SendActivation) else s - 1
            if not 0 <= dst < n:
                return f"stage {s} sends {a} to a stage that does not exist"
            q = self.act_q[dst] if isinstance(a, SendActivation) else self.grad_q[dst]
            if self.capacity > 0:
                if len(q) >= self.capacity:
                    return False
                q.append(a.micro_batch)
                self.pos[s] += 1
                return True
            if not self.offering[s]:
                if q:
                    return False
                q.append(a.micro_batch)
                self.offering[s] = True
                return True
            if q:
                return False
            self.offering[s] = False
            self.pos[s] += 1
            return True
        if isinstance(a, RecvActivation | RecvGrad):
            q = self.act_q[s] if isinstance(a, RecvActivation) else self.grad_q[s]
            if not q:
                return False
            if q[0] != a.micro_batch:
                return f"stage {s} expected {a} but micro-batch {q[0]} arrived first"
            q.popleft()
            self.pos[s] += 1
            return True
        if isinstance(a, OptimizerStep):
            at_barrier = all(
                self.pos[t] == len(self.schedules[t]) or isinstance(self.schedules[t][self.pos[t]], OptimizerStep)
                for t in range(n)
            )
            if not at_barrier:
                return False
        self.pos[s] += 1
        return True
