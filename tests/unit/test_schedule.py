"""Pipeline schedules: completeness, ordering, stash bound, and deadlock freedom under blocking semantics."""

from __future__ import annotations

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
    max_in_flight,
    one_f_one_b,
    one_f_one_b_in_flight,
    simulate,
)
from partitioner.cost import in_flight_1f1b
from tests.unit._schedule_timing import barrier_time

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
            assert max_in_flight(build_schedule("1f1b", s, S, m)) == min(S - s + look, m)
            assert max_in_flight(one_f_one_b(s, S, m, lookahead=0)) == min(S - s, m)  # textbook
            assert max_in_flight(build_schedule("1f1b", s, S, m)) == one_f_one_b_in_flight(s, S, m)
            # the planner's memory model counts the stashes the worker really holds
            assert max_in_flight(build_schedule("1f1b", s, S, m)) == in_flight_1f1b(S - s, m)
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
        textbook = makespan([one_f_one_b(s, 2, m, lookahead=0, early_last_grad=False) for s in range(2)])
        ahead = makespan([one_f_one_b(s, 2, m, early_last_grad=False) for s in range(2)])
        gpipe = makespan([build_schedule("gpipe", s, 2, m, early_last_grad=False) for s in range(2)])
        assert ahead < textbook - 0.3 * (m - 2)
        assert ahead <= gpipe + 1e-9


@pytest.mark.parametrize("kind", KINDS)
def test_no_deadlock_with_one_buffered_message_per_direction(kind: ScheduleKind) -> None:
    for S, m in GRID:
        result = simulate([build_schedule(kind, s, S, m) for s in range(S)], capacity=1)
        assert result.finished, (kind, S, m, result)


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
def test_last_micro_batch_sends_its_input_gradient_before_the_weights_gradients(kind: ScheduleKind) -> None:
    for S, m in GRID:
        for s in range(S):
            acts = build_schedule(kind, s, S, m, early_last_grad=True)
            deferred = [a.micro_batch for a in acts if isinstance(a, Backward) and a.defer_weights]
            weights = [a.micro_batch for a in acts if isinstance(a, WeightGrad)]
            early = kind is ScheduleKind.ONE_F_ONE_B and s > 0  # the first stage sends no gradient
            assert deferred == weights == ([m - 1] if early else [])
            if early:
                at = _backward_at(acts, m - 1)
                assert acts[at + 1 : at + 3] == (SendGrad(m - 1), WeightGrad(m - 1))
            plain = build_schedule(kind, s, S, m, early_last_grad=False)
            assert not any(isinstance(a, WeightGrad) for a in plain)
            assert build_schedule(kind, s, S, m) == plain  # off by default
            assert max_in_flight(acts) == max_in_flight(plain)


def test_early_last_gradient_shortens_the_1f1b_drain() -> None:
    """With messages free, each stage's last backward in 1F1B still waits for the next stage's: sending the
    input gradient before the weights' gradients (input half 1.0 of a backward of 2.0; the engine recomputes
    the input half for the weights, so a deferred weight pass costs the whole backward) shortens that chain."""
    for S, m in ((2, 8), (3, 6), (4, 8)):
        fwd, bwd = [1.0] * S, [2.0] * S
        plain = barrier_time([one_f_one_b(s, S, m, early_last_grad=False) for s in range(S)], fwd, bwd)
        early = barrier_time([one_f_one_b(s, S, m, early_last_grad=True) for s in range(S)], fwd, bwd,
                             input_share=0.5)  # fmt: skip
        assert early <= plain - 0.9, (S, m, early, plain)


def test_early_last_gradient_loses_when_the_previous_backward_is_short() -> None:
    """Why it is off by default: the engine's weight pass reruns the backward, so when the previous stage's
    last backward is under half of this stage's, the rerun outlasts it and the step gets longer."""
    fwd, bwd = [0.25, 1.0], [0.5, 2.0]
    plain = barrier_time([one_f_one_b(s, 2, 8, early_last_grad=False) for s in range(2)], fwd, bwd)
    early = barrier_time([one_f_one_b(s, 2, 8, early_last_grad=True) for s in range(2)], fwd, bwd, input_share=0.5)
    assert early > plain
