"""Pipeline schedules: completeness, ordering, stash bound, and deadlock freedom under blocking semantics."""

from __future__ import annotations

import pytest

from arceusd.worker.schedule import (
    Backward,
    ComputeLoss,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ScheduleKind,
    SendActivation,
    SendGrad,
    build_schedule,
    max_in_flight,
    simulate,
)

KINDS = [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B]
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
                assert acts.index(Forward(i)) < acts.index(Backward(i))
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
                    assert acts.index(Backward(i)) < acts.index(SendGrad(i))
                if s < S - 1:
                    assert acts.index(Forward(i)) < acts.index(SendActivation(i))
                    assert acts.index(RecvGrad(i)) < acts.index(Backward(i))
                else:
                    assert acts.index(Forward(i)) < acts.index(ComputeLoss(i)) < acts.index(Backward(i))


def test_1f1b_stash_bounded_by_stages_left_and_gpipe_stashes_all() -> None:
    for S, m in GRID:
        for s in range(S):
            assert max_in_flight(build_schedule("1f1b", s, S, m)) <= S - s
            assert max_in_flight(build_schedule("1f1b", s, S, m)) == min(S - s, m)
            assert max_in_flight(build_schedule("gpipe", s, S, m)) == m


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
