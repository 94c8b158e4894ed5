"""Two members that each say they waited on the other (issue #19: a member that slows the job on purpose and
blames its neighbour): found, kept out of the neighbours' judgement, and settled by planning one of them alone
beside the leader (``arceusd/jobs/leader/probation.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from arceusd.jobs.judging import claims
from arceusd.jobs.leader import probation
from arceusd.jobs.record.leader_record import ProbationBook
from tests.unit.test_neighbour_timing import lw, plan_of


def _plan(*stages: tuple[str, ...]) -> Any:
    plan = plan_of(*stages)
    plan.peer_ids = tuple(p for st in stages for p in st)
    return plan


# L leads; x (the last stage) naps 0.6 s a step and says it waited on v's activations; v honestly waited on x
PLAN = _plan(("L",), ("v",), ("x",))
BLAMING = lw({"L": (0.0, 0.62), "v": (0.0, 0.61), "x": (0.6, 0.0)})
STEP_S = 0.7


def test_two_neighbours_that_each_waited_on_the_other_are_a_dispute() -> None:
    assert probation.disputes(PLAN, BLAMING, "L", STEP_S) == [("v", "x")]
    assert probation.disputes(
        _plan(("v",), ("x",), ("L",)), lw({"v": (0, 0.6), "x": (0.6, 0.6), "L": (0.6, 0)}), "L", STEP_S
    ) == [("v", "x")]
    # a leader's own word is its clock's: no dispute with it (the ordinary judgement settles it)
    assert probation.disputes(_plan(("L",), ("x",)), lw({"L": (0, 0.6), "x": (0.6, 0)}), "L", STEP_S) == []
    # an honest pipeline's fill and drain: both wait a third of the step, not a contradiction
    assert probation.disputes(PLAN, lw({"L": (0, 0.25), "v": (0.24, 0.23), "x": (0.23, 0)}), "L", STEP_S) == []
    # one honestly slow stage: its neighbours wait on it, it waits on nobody
    assert probation.disputes(PLAN, lw({"L": (0, 0.6), "v": (0.0, 0.6), "x": (0.01, 0)}), "L", STEP_S) == []
    assert probation.disputes(PLAN, BLAMING, "L", None) == []  # the leader has no step of its own yet
    assert probation.disputes(_plan(("L",), ("v", "w"), ("x",)), BLAMING, "L", STEP_S) == []  # groups: not judged


def test_the_neighbours_view_frames_the_honest_member_which_is_why_disputes_are_kept_out_of_it() -> None:
    compute = {"L": 0.05, "v": 0.05, "x": 0.05}  # everyone says it computed what the plan predicted
    seen = claims.seen_by_neighbours(PLAN, BLAMING, compute, "L", STEP_S)
    judged = claims.judged_times({p: (c, 0.05) for p, c in compute.items()}, seen)
    assert claims.overclaim(judged, "v") is not None  # v, honest, looks like the one holding the job back
    assert claims.overclaim(judged, "x") is None  # x, napping, is cleared by its own word
    assert probation.suspects(probation.disputes(PLAN, BLAMING, "L", STEP_S)) == {"v", "x"}


def test_a_dispute_puts_the_member_farther_from_the_leader_on_probation_then_the_other() -> None:
    lead, discounts = ProbationBook(), dict[str, float]()
    found = probation.disputes(PLAN, BLAMING, "L", STEP_S)
    assert probation.judge(lead, discounts, [PLAN], found, "L") == ""  # one report is not enough
    reason = probation.judge(lead, discounts, [PLAN], found, "L")
    assert lead.member == "x" and "planning x alone beside the leader" in reason
    offers: list[Any] = [SimpleNamespace(peer_id=p) for p in ("L", "v", "x")]
    assert [o.peer_id for o in probation.probation_offers(offers, "L", lead.member)] == ["L", "x"]
    assert len(probation.probation_offers(offers, "L", "")) == 3
    assert len(probation.probation_offers(offers[:2], "L", "x")) == 2  # x left: every member's offer
    alone = _plan(("L",), ("x",))
    assert probation.judge(lead, discounts, [alone], [], "L") == ""  # one checkpoint beside the leader
    cleared = probation.judge(lead, discounts, [alone], [], "L")
    assert "x kept to its offer beside the leader" in cleared and lead.cleared == {"x"} and not lead.member
    # the dispute comes back: now the accuser goes on probation; after that nobody is left to try
    probation.judge(lead, discounts, [PLAN], found, "L")
    again = probation.judge(lead, discounts, [PLAN], found, "L")
    on: str = lead.member
    assert "planning v alone" in again and on == "v"
    lead.member = ""
    assert probation.judge(lead, discounts, [PLAN], found, "L") == ""
    assert probation.judge(lead, discounts, [PLAN], found, "L") == "" and not lead.member


def test_a_probation_ends_when_the_member_is_caught_or_cannot_be_planned_beside_the_leader() -> None:
    lead, discounts = ProbationBook(), dict[str, float]()
    lead.member = "x"
    discounts["x"] = 40.0  # the ordinary judgement caught it beside the leader
    assert probation.judge(lead, discounts, [_plan(("L",), ("x",))], [], "L") == "" and not lead.member
    lead, discounts = ProbationBook(), dict[str, float]()
    lead.member = "x"
    alone = _plan(("x",))  # the planner left the leader out: the leader cannot see it
    assert "could not be planned alone beside the leader" in probation.judge(lead, discounts, [alone], [], "L")
    assert not lead.member and "x" not in lead.cleared
    lead, discounts = ProbationBook(), dict[str, float]()
    lead.member = "x"
    replicas = [_plan(("L",)), _plan(("x",))]  # two replicas of one device each: nobody sees x
    assert "could not be planned alone beside the leader" in probation.judge(lead, discounts, replicas, [], "L")
    assert not lead.member and "x" not in lead.cleared


def test_a_tensor_parallel_group_whose_every_rank_waited_on_the_others_is_a_dispute() -> None:
    group = _plan(("L",), ("a", "b"))
    both = lw({"L": (0, 0.3), "a": (0.0, 0.0, 0.6), "b": (0.0, 0.0, 0.6)})  # b naps and says it waited on a
    assert probation.disputes(group, both, "L", STEP_S) == [("a", "b")]
    honest = lw({"L": (0, 0.3), "a": (0.0, 0.0, 0.6), "b": (0.0, 0.0, 0.01)})  # the slowest waits for nobody
    assert probation.disputes(group, honest, "L", STEP_S) == []
    # a group with the leader: one partner is seen by the leader's own clock; two or more are a dispute
    assert probation.disputes(_plan(("L", "a")), lw({"L": (0, 0, 0.6), "a": (0, 0, 0.6)}), "L", STEP_S) == []
    three = lw({"L": (0, 0, 0.6), "a": (0, 0, 0.6), "b": (0, 0, 0.6)})
    assert probation.disputes(_plan(("L", "a", "b")), three, "L", STEP_S) == [("a", "b")]
    lead, discounts = ProbationBook(), dict[str, float]()
    found = probation.disputes(group, both, "L", STEP_S)
    probation.judge(lead, discounts, [group], found, "L")
    assert "members a and b each say" in probation.judge(lead, discounts, [group], found, "L")
    assert lead.member == "b"  # same distance from the leader: the later rank first
