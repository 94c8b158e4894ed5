"""Pipeline schedules: completeness, ordering, stash bound, and deadlock freedom under blocking semantics."""

from __future__ import annotations

import random

import pytest

from arceusd.worker.schedule import (
    Action,
    Backward,
    ComputeLoss,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ScheduleKind,
    SendActivation,
    SendGrad,
    WeightGrad,
    build_schedule,
    deferred_micro_batches,
    max_in_flight,
    one_f_one_b,
    one_f_one_b_in_flight,
    simulate,
)
from arceusd.worker.schedule_timing import SPLIT_COST, barrier_time, deferring_pays
from partitioner.cost import in_flight_1f1b

KINDS = [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]


def _backward_at(acts: tuple[Action, ...], i: int) -> int:
    """Index of micro-batch ``i``'s ``Backward`` (whole, or input-only with the weights deferred)."""
    (at,) = [k for k, a in enumerate(acts) if isinstance(a, Backward) and a.micro_batch == i]
    return at


GRID = [(S, m) for S in range(1, 6) for m in range(1, 10)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_micro_batch_forwarded_and_backwarded_once_in_order(kind: ScheduleKind) -> None:
    for S, m in GRID:
        for s in range(S):
            acts = build_schedule(kind, s, S, m)
            fwd = [a.micro_batch for a in acts if isinstance(a, Forward)]
            bwd = [a.micro_batch for a in acts if isinstance(a, Backward)]
            assert sorted(fwd) == list(range(m)) and sorted(bwd) == list(range(m))
            for i in range(m):
                assert acts.index(Forward(i)) < _backward_at(acts, i)
            assert acts[-1] == OptimizerStep() and acts.count(OptimizerStep()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_first_and_last_stage_edges(kind: ScheduleKind) -> None:
    for S, m in GRID:
        for s in range(S):
            acts = build_schedule(kind, s, S, m)
            types = {type(a) for a in acts}
            assert (RecvActivation in types) == (s > 0)
            assert (SendGrad in types) == (s > 0)
            assert (SendActivation in types) == (s < S - 1)
            assert (RecvGrad in types) == (s < S - 1)
            assert (ComputeLoss in types) == (s == S - 1)
            for i in range(m):
                if s > 0:
                    assert acts.index(RecvActivation(i)) < acts.index(Forward(i))
                    assert _backward_at(acts, i) < acts.index(SendGrad(i))
                if s < S - 1:
                    assert acts.index(Forward(i)) < acts.index(SendActivation(i))
                    assert acts.index(RecvGrad(i)) < _backward_at(acts, i)
                else:
                    assert acts.index(Forward(i)) < acts.index(ComputeLoss(i)) < _backward_at(acts, i)


def test_1f1b_stash_bounded_by_stages_left_and_gpipe_stashes_all() -> None:
    for S, m in GRID:
        for s in range(S):
            look = 1 if s < S - 1 else 0  # the look-ahead forward, on every stage but the last
            plain = one_f_one_b(s, S, m, defer_weights=False)
            assert max_in_flight(plain) == min(S - s + look, m)
            assert max_in_flight(one_f_one_b(s, S, m, lookahead=0, defer_weights=False)) == min(S - s, m)  # textbook
            assert max_in_flight(plain) == one_f_one_b_in_flight(s, S, m, defer_weights=False)
            acts = build_schedule("1f1b", s, S, m)
            # deferring weights holds two stashes on the last stage of several, and no more anywhere else
            assert max_in_flight(acts) == (min(2, m) if s == S - 1 and S > 1 else max_in_flight(plain))
            assert max_in_flight(acts) == one_f_one_b_in_flight(s, S, m)
            # the planner's memory model counts the stashes the worker really holds (a lone stage: one more)
            assert max_in_flight(acts) == in_flight_1f1b(S - s, m) - (1 if S == 1 and m > 1 else 0)
            assert max_in_flight(build_schedule("gpipe", s, S, m)) == m


def test_1f1b_lookahead_keeps_the_backward_order_and_runs_the_next_forward_before_waiting() -> None:
    for S, m in GRID:
        for s in range(S):
            acts = build_schedule("1f1b", s, S, m)
            backwards = [a.micro_batch for a in acts if isinstance(a, Backward)]
            assert backwards == list(range(m))  # the accumulated gradients are summed in the same order
            if s < S - 1 and m > S - s:
                # before the stage waits for its first gradient it has run one forward more than textbook 1F1B
                first_wait = acts.index(RecvGrad(0))
                assert sum(isinstance(a, Forward) for a in acts[:first_wait]) == S - s + 1
    with pytest.raises(ValueError, match="lookahead"):
        one_f_one_b(0, 2, 4, lookahead=-1)


def test_1f1b_lookahead_shortens_a_two_stage_step_when_messages_take_time() -> None:
    """Timed replay of the action lists (forward 1, backward 2, each message 0.3): the look-ahead hides the
    gradient's round trip that textbook 1F1B waits for at every micro-batch."""

    def makespan(schedules: list[tuple[Action, ...]]) -> float:
        return barrier_time(schedules, [1.0, 1.0], [2.0, 2.0], latency=0.3)

    for m in (4, 8):
        textbook = makespan([one_f_one_b(s, 2, m, lookahead=0, defer_weights=False) for s in range(2)])
        ahead = makespan([one_f_one_b(s, 2, m, defer_weights=False) for s in range(2)])
        gpipe = makespan([build_schedule("gpipe", s, 2, m, defer_weights=False) for s in range(2)])
        assert ahead < textbook - 0.3 * (m - 2)
        assert ahead <= gpipe + 1e-9


@pytest.mark.parametrize("kind", KINDS)
def test_no_deadlock_with_one_buffered_message_per_direction(kind: ScheduleKind) -> None:
    for S, m in GRID:
        result = simulate([build_schedule(kind, s, S, m) for s in range(S)], capacity=1)
        assert result.finished, (kind, S, m, result)


def test_capped_1f1b_stashes_at_most_its_cap_keeps_the_order_and_never_deadlocks() -> None:
    """The plan's ``in_flight_cap`` (``partitioner/cost.py``'s capped 1F1B): every stage holds at most the cap
    (what the planner's memory counts: ``min(in_flight_1f1b, cap)``), no backward defers its weights, the
    forwards and backwards run in micro-batch order as uncapped, and the stages finish with one buffered message
    per direction."""
    for S, m in GRID:
        for cap in range(1, m):
            schedules = [build_schedule("1f1b", s, S, m, max_in_flight=cap) for s in range(S)]
            for s, acts in enumerate(schedules):
                assert max_in_flight(acts) <= min(cap, in_flight_1f1b(S - s, m)), (S, m, cap, s)
                assert not any(isinstance(a, WeightGrad) for a in acts)
                assert [a.micro_batch for a in acts if isinstance(a, Backward)] == list(range(m))
                assert [a.micro_batch for a in acts if isinstance(a, Forward)] == list(range(m))
            assert simulate(schedules, capacity=1).finished, (S, m, cap)
    # where the cap is below the warm-up, it is what the first stage holds
    assert max_in_flight(build_schedule("1f1b", 0, 4, 8, max_in_flight=2)) == 2
    assert build_schedule("gpipe", 0, 2, 4, max_in_flight=1) == build_schedule("gpipe", 0, 2, 4)
    with pytest.raises(ValueError, match="max_in_flight"):
        one_f_one_b(0, 2, 4, max_in_flight=-1)


def test_gpipe_survives_rendezvous_and_simulator_detects_deadlock() -> None:
    for S, m in GRID:
        assert simulate([build_schedule("gpipe", s, S, m) for s in range(S)], capacity=0).finished
    # 1F1B with strict rendezvous deadlocks in its steady state; the simulator must see it.
    stuck = simulate([build_schedule("1f1b", s, 3, 6) for s in range(3)], capacity=0)
    assert not stuck.finished and stuck.error is None


def test_simulator_detects_out_of_order_and_mismatched_lists() -> None:
    good = [build_schedule("gpipe", s, 2, 2) for s in range(2)]
    swapped = list(good[1])
    i0, i1 = swapped.index(RecvActivation(0)), swapped.index(RecvActivation(1))
    swapped[i0], swapped[i1] = swapped[i1], swapped[i0]
    bad = simulate([good[0], swapped])
    assert not bad.finished and bad.error is not None
    # a stage that never receives its activation: the sender's pipeline stalls
    assert not simulate([good[0], (RecvActivation(5), *good[1])], capacity=1).finished


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError):
        build_schedule("interleaved", 0, 2, 2)
    with pytest.raises(ValueError):
        build_schedule("gpipe", 2, 2, 2)
    with pytest.raises(ValueError):
        build_schedule("1f1b", 0, 2, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_deferred_weights_follow_the_last_gradient_sent_in_micro_batch_order(kind: ScheduleKind) -> None:
    for S, m in GRID:
        for s in range(S):
            acts = build_schedule(kind, s, S, m)
            deferred = [a.micro_batch for a in acts if isinstance(a, Backward) and a.defer_weights]
            weights = [a.micro_batch for a in acts if isinstance(a, WeightGrad)]
            assert deferred == weights == list(deferred_micro_batches(kind, s, S, m))
            if s == 0:
                assert deferred == []  # the first stage sends no gradient: nothing to send early
            elif kind is ScheduleKind.ONE_F_ONE_B:
                assert deferred == list(range(m - min(m, s + 1, S - s + 1), m))
            else:
                assert deferred == list(range(min(m, 2 * s)))
            if weights:  # every weight pass after the stage's last gradient sent, then the optimizer step
                last_send = max(k for k, a in enumerate(acts) if isinstance(a, SendGrad))
                assert acts[last_send + 1 :] == (*[WeightGrad(i) for i in weights], OptimizerStep())
            plain = build_schedule(kind, s, S, m, defer_weights=False)
            assert not any(isinstance(a, WeightGrad) for a in plain)
            assert [a for a in acts if not isinstance(a, WeightGrad)] == [
                Backward(a.micro_batch, a.micro_batch in deferred) if isinstance(a, Backward) else a for a in plain
            ]


@pytest.mark.parametrize("kind", KINDS)
def test_deferred_weights_shorten_even_pipelines(kind: ScheduleKind) -> None:
    """Timed replay with the measured split costs, forward 1 and backward 2 per stage, 1% message latency:
    deferring the weights shortens every even pipeline by at least a third of a forward per stage boundary."""
    for S, m in ((2, 4), (2, 8), (3, 8), (4, 8), (4, 16)):
        fwd, bwd = [1.0] * S, [2.0] * S
        plain = barrier_time(
            [build_schedule(kind, s, S, m, defer_weights=False) for s in range(S)], fwd, bwd, latency=0.01
        )
        split = barrier_time(
            [build_schedule(kind, s, S, m) for s in range(S)], fwd, bwd, latency=0.01, split=SPLIT_COST
        )
        assert split <= plain - 0.33 * (S - 1), (kind, S, m, split, plain)


@pytest.mark.parametrize("kind", KINDS)
def test_the_worker_defers_weights_where_the_replay_says_it_pays(kind: ScheduleKind) -> None:
    """Random uneven stages (2 to 5, 0.3 to 4.5 per micro-batch): the split sometimes lengthens a step (its 13%
    lands on a bottleneck stage that never waits), so the worker asks ``deferring_pays`` with the plan's stage
    times. Its choice is never slower than whole backwards, and on average clearly faster."""
    rng = random.Random(7)
    chosen, lost = [], 0
    for _ in range(150):
        S, m = rng.randint(2, 5), rng.choice([4, 8, 16])
        times = [rng.uniform(0.3, 4.5) for _ in range(S)]
        fwd, bwd = [t / 3 for t in times], [2 * t / 3 for t in times]

        def step(defer: bool, S: int = S, m: int = m, fwd: list[float] = fwd, bwd: list[float] = bwd) -> float:
            return barrier_time(
                [build_schedule(kind, s, S, m, defer_weights=defer) for s in range(S)], fwd, bwd, split=SPLIT_COST
            )

        whole, split = step(False), step(True)
        lost += split > whole
        pick = split if deferring_pays(kind, times, m) else whole
        assert pick <= whole and (pick == split or split >= 0.99 * whole)
        chosen.append(pick / whole)
    if kind is ScheduleKind.ONE_F_ONE_B:
        assert lost > 0  # the gate is needed: some uneven pipelines lose with the split
    assert sum(chosen) / len(chosen) < 0.98
    assert not deferring_pays(kind, [1.0], 8)  # one stage: nothing to overlap
