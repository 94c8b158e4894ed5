"""A member's step time as its neighbours in the pipeline see it (issue #19: the leader measures, it does not
believe): the engine splits its link waits by direction, and :func:`arceusd.jobs.claims.seen_by_neighbours` finds
the stage both neighbours wait on, whatever that stage says of itself."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from arceusd.jobs import claims
from arceusd.worker.engine import StageEngine, StepResult
from arceusd.worker.optim import LRSchedule
from arceusd.worker.schedule import ScheduleKind
from tests.unit.test_engine import CASES, OPTIMIZERS, _batches, build_engines

SLEEP_S = 0.05
"""Added to every forward of the slow stage's micro-batches (4 a step)."""


def plan_of(*stages: tuple[str, ...]) -> Any:
    return SimpleNamespace(stages=[SimpleNamespace(shares=[SimpleNamespace(peer_id=p) for p in s]) for s in stages])


def run_all(engines: list[list[StageEngine]], batches: list[Any]) -> dict[int, list[StepResult]]:
    """Every stage's step results (rank 0), each stage in its own thread."""
    results: dict[int, list[StepResult]] = {}
    last = len(engines) - 1

    def work(s: int, engine: StageEngine) -> None:
        results[s] = [engine.run_step(x if s == 0 else None, y if s == last else None) for x, y in batches]

    threads = [threading.Thread(target=work, args=(s, ranks[0]), daemon=True) for s, ranks in enumerate(engines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == len(engines), "a stage hung or failed"
    return results


@pytest.mark.parametrize("schedule", [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B])
def test_both_neighbours_of_a_slow_middle_stage_wait_on_it_and_it_waits_on_neither(schedule: ScheduleKind) -> None:
    case, opt = CASES["mlp-3"], OPTIMIZERS["sgd"]
    engines = build_engines(case, schedule, opt, LRSchedule(max_lr=opt.lr), None)
    engines[1][0].module.register_forward_pre_hook(lambda _m, _a: time.sleep(SLEEP_S))
    batches = _batches(case.model, case.batch) * 2
    results = run_all(engines, batches)
    slow = SLEEP_S * case.micro_batches

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    steps = range(1, len(batches))  # the first step also waits for the threads to start
    for r in (results[s][i] for s in range(3) for i in steps):
        assert r.wait_up_s + r.wait_down_s <= r.wait_s + 1e-9, r
    assert all(results[0][i].wait_up_s == 0.0 and results[2][i].wait_down_s == 0.0 for i in steps)  # the ends
    up = [median([results[s][i].wait_up_s for i in steps]) for s in range(3)]
    down = [median([results[s][i].wait_down_s for i in steps]) for s in range(3)]
    assert down[0] > 0.5 * slow and up[2] > 0.5 * slow, (up, down)  # both neighbours wait on the slow stage
    assert up[1] + down[1] < 0.25 * slow, (up, down)  # and it waits on neither
    waits = {"a": (up[0], down[0]), "b": (up[1], down[1]), "c": (up[2], down[2])}
    seen = claims.seen_by_neighbours(plan_of(("a",), ("b",), ("c",)), waits, "a", 10.0)
    assert seen["b"] > 0.5 * slow and seen["b"] > 3 * seen["c"], seen


def test_seen_by_neighbours_takes_the_least_view_and_never_more_than_the_leaders_step() -> None:
    plan = plan_of(("L",), ("b",), ("c",))  # L leads
    # b is slow: L waits for its gradients, c for its activations (its forward passes: a third of its compute)
    waits = {"L": (0.0, 0.9), "b": (0.01, 0.02), "c": (0.25, 0.0)}
    seen = claims.seen_by_neighbours(plan, waits, "L", 10.0)
    assert seen == {"b": pytest.approx(0.75), "c": 0.02}  # the leader is not seen: its own clock is its figure
    assert claims.seen_by_neighbours(plan, waits, "L", 0.5)["b"] == 0.5  # never more than the leader's own step
    assert claims.seen_by_neighbours(plan, waits, "L", None) == {}  # the leader has no step of its own
    # one neighbour that says it waited (framing b) is not enough: the other side did not
    framed = {"L": (0.0, 5.0), "b": (0.01, 0.02), "c": (0.01, 0.0)}
    assert claims.seen_by_neighbours(plan, framed, "L", 10.0)["b"] == pytest.approx(0.03)
    # a side that did not report: b is not seen at all (not seen as fast either)
    assert "b" not in claims.seen_by_neighbours(plan, {"L": (0.0, 0.9), "b": (0.0, 0.0)}, "L", 10.0)


def test_an_end_stage_is_framed_by_its_one_neighbour_only_when_that_neighbour_is_the_leader() -> None:
    plan = plan_of(("a",), ("b",), ("L",))
    # a (first stage, not the leader) is slow: b, its one neighbour, waits for its activations; a waited on b little
    slow_a = {"a": (0.0, 0.05), "b": (0.3, 0.0), "L": (0.1, 0.0)}
    assert claims.seen_by_neighbours(plan, slow_a, "L", 1.0)["a"] == pytest.approx(0.9)
    # b lies that it waited on a; a's own figures say it spent 0.95 s of the 1 s step waiting on b: word against
    # word, the smaller wins
    framing = {"a": (0.0, 0.95), "b": (0.3, 0.0), "L": (0.1, 0.0)}
    assert claims.seen_by_neighbours(plan, framing, "L", 1.0)["a"] == pytest.approx(0.05)
    # next to the leader, the leader's own wait counts as it is
    led = plan_of(("L",), ("b",))
    assert claims.seen_by_neighbours(led, {"L": (0.0, 0.8), "b": (0.7, 0.0)}, "L", 1.0) == {"b": 0.8}


def test_a_stage_split_across_devices_is_not_seen_and_its_ranks_count_as_neighbours() -> None:
    plan = plan_of(("a",), ("b1", "b2"), ("c",))
    waits = {"a": (0.0, 0.1), "b1": (0.3, 0.0), "b2": (0.7, 0.0), "c": (0.9, 0.0)}
    seen = claims.seen_by_neighbours(plan, waits, "L", 10.0)
    assert "b1" not in seen and "b2" not in seen  # neighbours see the stage, not which rank is slow
    assert seen["c"] == 0.0 and seen["a"] == pytest.approx(0.9)  # the least of the split stage's ranks, x3
    assert claims.seen_by_neighbours(plan_of(("solo",)), {"solo": (0.0, 0.0)}, "L", 1.0) == {}  # no neighbours


def test_a_member_is_judged_on_the_larger_of_its_word_and_its_neighbours_view() -> None:
    times = {"a": (0.3, 0.25), "b": (0.05, 0.05), "c": (0.3, 0.25)}  # b says it kept to its offer
    judged = claims.judged_times(times, {"b": 2.0, "a": 0.01})
    assert judged == {"a": (0.3, 0.25), "b": (2.0, 0.05), "c": (0.3, 0.25)}
    assert claims.overclaim(times, "b") is None  # on its own word, nothing to see
    assert claims.overclaim(judged, "b") == pytest.approx((2.0 / 0.05) / (0.6 / 0.5))


def test_link_waits_are_kept_only_when_both_are_valid_seconds() -> None:
    waits: dict[str, tuple[float, float]] = {}
    claims.record_link_waits(waits, "a", {"wait_up_s": 0.1, "wait_down_s": 0})
    assert waits == {"a": (0.1, 0.0)}
    for bad in ({"wait_up_s": float("nan"), "wait_down_s": 0.1}, {"wait_up_s": -1, "wait_down_s": 0.1},
                {"wait_up_s": True, "wait_down_s": 0.1}, {"wait_up_s": 0.1}, {"wait_up_s": "1", "wait_down_s": 0},
                {"wait_up_s": 0.1, "wait_down_s": 1e9}):  # fmt: skip
        claims.record_link_waits(waits, "a", {"wait_up_s": 0.1, "wait_down_s": 0.2})
        claims.record_link_waits(waits, "a", bad)
        assert "a" not in waits, bad  # a report without a valid pair forgets the old one
