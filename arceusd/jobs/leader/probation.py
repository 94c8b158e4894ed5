"""Disputes the leader cannot settle from where it stands, settled by planning a disputed member beside it.

Two neighbours in the pipeline cannot both spend most of a step waiting on each other: one of them is computing.
When one says it waited on the next stage's gradients and the next says it waited on its activations, each for
at least :data:`CONTRADICTION` of the leader's own step (and :data:`claims.MIN_EXCESS_S`), one of them lies
(:func:`disputes`). Both ran fast in their speed challenges (:mod:`arceusd.jobs.judging.challenges`), so whoever holds
the job back does it on purpose, and the neighbours' views (:func:`arceusd.jobs.judging.claims.seen_by_neighbours`)
cannot tell which: the liar at an end of the pipeline is seen only by the other's word, and the other is seen by the
stage before it, which honestly waits on everything downstream. Left alone, the honest one is judged slow and
discounted. So while two members contradict each other, neither is judged on its neighbours' views, and after
:data:`claims.SUSTAINED_REPORTS` checkpoint reports in a row the leader plans one of them *on probation*: alone
with the leader (:func:`probation_offers`), whose own clock then sees it as its only neighbour. After
:data:`claims.SUSTAINED_REPORTS` checkpoints of that plan the member was either discounted (it was holding the
job back: the ordinary judgement caught it) or it is *cleared*; either way the leader plans with every member
again, and if the contradiction comes back, the other member goes on probation. Each member is on probation at
most once per job: a dispute costs at most two short plans with two devices. A contradiction with the leader
itself needs none of this (the leader's word is its own clock's).

The same holds in a tensor-parallel group: every rank waits in the group's all-reduces for the slowest, which
itself waits for nobody, so a group whose every rank says it waited most of the step holds a liar (when two or
more of them are not the leader; one partner of the leader is seen by the leader's own clock). Not covered:
members that never contradict each other because they lie together.

Pure functions over the job record; the leader calls :func:`judge` once every device reported a checkpoint, and
:mod:`arceusd.jobs.leader.starting` plans with :func:`probation_offers`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from arceusd.jobs.judging import claims

if TYPE_CHECKING:
    from arceusd.jobs.plans.planning import Offer
    from arceusd.jobs.record.leader_record import ProbationBook
    from partitioner import Plan

CONTRADICTION = 0.5
"""Two neighbours that each say they waited on the other at least this share of the leader's step contradict
each other (an honest pipeline's fill and drain make both wait a third of it at most with 4 micro-batches)."""


def disputes(
    plan: Plan, waits: Mapping[str, claims.LinkWaits], leader: str, step_s: float | None
) -> list[tuple[str, ...]]:
    """Members that contradict each other, each waiting at least :data:`CONTRADICTION` of ``step_s`` (the
    leader's own step) and :data:`claims.MIN_EXCESS_S`:

    - adjacent one-device stages (earlier, later), neither the leader, where the earlier says it waited on the
      later's gradients and the later on the earlier's activations;
    - the ranks of a tensor-parallel group (in stage order) when every rank, the leader too if it is one, says it
      waited in the group's all-reduces (the slowest rank waits for nobody), and two or more of them are not
      the leader (one partner of the leader is seen by the leader's own clock)."""
    if step_s is None:
        return []
    floor = max(claims.MIN_EXCESS_S, CONTRADICTION * step_s)
    stages = [[sh.peer_id for sh in st.shares] for st in plan.stages]
    found: list[tuple[str, ...]] = []
    for before, after in itertools.pairwise(stages):
        if len(before) != 1 or len(after) != 1:
            continue
        a, b = before[0], after[0]
        if leader in (a, b) or a not in waits or b not in waits:
            continue
        if waits[a].down_s >= floor and waits[b].up_s >= floor:
            found.append((a, b))
    for ranks in stages:
        others = tuple(p for p in ranks if p != leader)
        if len(ranks) < 2 or len(others) < 2 or not all(p in waits for p in ranks):
            continue
        if all(waits[p].group_s >= floor for p in ranks):
            found.append(others)
    return found


def _distance(pipelines: Sequence[Plan], peer: str, leader: str) -> int:
    """Stages between ``peer`` and the leader in ``peer``'s pipeline (the whole pipeline when the leader is in
    another replica's)."""
    for plan in pipelines:
        where = {sh.peer_id: k for k, st in enumerate(plan.stages) for sh in st.shares}
        if peer in where:
            return abs(where[peer] - where[leader]) if leader in where else len(plan.stages)
    return 0


def probation_offers(offers: Sequence[Offer], leader: str, on_probation: str) -> list[Offer]:
    """The offers a plan is made from: only the leader's and the member on probation's while there is one (and
    both are members), every offer otherwise."""
    if not on_probation or not {leader, on_probation} <= {o.peer_id for o in offers}:
        return list(offers)
    return [o for o in offers if o.peer_id in (leader, on_probation)]


def judge(
    book: ProbationBook,
    discounts: Mapping[str, float],
    pipelines: Sequence[Plan],
    found: Sequence[tuple[str, ...]],
    leader: str,
) -> str:
    """After a checkpoint's claims were judged: the restart reason a probation begins or ends with, or ``""``.

    ``book``: the leader's :class:`arceusd.jobs.record.leader_record.ProbationBook` (``job.leading.probation``);
    ``discounts``: the members it discounted (``job.leading.speed.discounts``); ``pipelines``: every pipeline of
    the plan that wrote the checkpoint (each replica's); ``found``: this checkpoint's :func:`disputes`."""
    on = book.member
    if on:
        if on in discounts:  # the ordinary judgement caught it beside the leader (its restart is asked)
            book.member = ""
            return ""
        if not any({sh.peer_id for st in p.stages for sh in st.shares} == {leader, on} for p in pipelines):
            book.member = ""  # the planner left one of them out, or made them replicas: the leader cannot see it
            return f"member {on[:12]} could not be planned alone beside the leader; planning with every member again"
        book.reports += 1
        if book.reports < claims.SUSTAINED_REPORTS:
            return ""
        book.member = ""
        book.cleared.add(on)
        return f"member {on[:12]} kept to its offer beside the leader; planning with every member again"
    for pair in list(book.disputes):
        if pair not in found:
            del book.disputes[pair]
    for pair in found:
        book.disputes[pair] = book.disputes.get(pair, 0) + 1
        if book.disputes[pair] < claims.SUSTAINED_REPORTS:
            continue
        left = [p for p in pair if p not in book.probed and p not in discounts]
        if not left:
            continue
        # the one farther from the leader first (the stage before it waits on all that is downstream)
        target = max(left, key=lambda p: (_distance(pipelines, p, leader), pair.index(p)))
        book.member, book.reports = target, 0
        book.probed.add(target)
        book.disputes.clear()
        named = ", ".join(p[:12] for p in pair[:-1]) + f" and {pair[-1][:12]}"
        return (
            f"members {named} each say they waited on the other; planning {target[:12]} alone beside the "
            "leader, which sees it on its own clock"
        )
    return ""


def suspects(found: Sequence[tuple[str, ...]]) -> set[str]:
    """Members not judged on their neighbours' views this checkpoint (they contradict a neighbour)."""
    return {p for pair in found for p in pair}


__all__ = ["CONTRADICTION", "disputes", "judge", "probation_offers", "suspects"]
