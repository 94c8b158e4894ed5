"""The leader's checks of data-parallel replicas' witnesses (``arceusd.jobs.leader.witnesses``), on real replica
plans."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from arceusd.jobs.leader import witnesses
from arceusd.jobs.leader.shard_checks import ReportProblem, ReportRefused
from arceusd.jobs.plans.planning import make_job_plan
from arceusd.jobs.record.job import Job
from partitioner.replicas import ReplicaSyncMode
from protocol.job_wire import JobReport, ReportKind
from tests.unit.test_planning_replicas import FAST, _links, _offers, _spec

A, B = "a" * 64, "b" * 64


def _job(replicas: int, sync: str = "every_step") -> Any:
    spec = _spec(replicas=replicas, sync=sync, batch_size=96)
    _, rp = make_job_plan(spec, _offers(replicas), {}, _links(replicas, FAST))
    assert len(rp.replicas) == replicas
    return SimpleNamespace(
        plan=rp.replicas[0],
        replica_plan=rp,
        total_steps=200,
        spec=SimpleNamespace(checkpoint=SimpleNamespace(interval_steps=50)),
    )


def _witness(step: int | None, digest: str) -> JobReport:
    return JobReport("j" * 32, 0, ReportKind.WITNESS, step=step, digest=digest)


def _peers(job: Any) -> list[str]:
    return [r.peer_ids[0] for r in job.replica_plan.replicas]


def test_a_witness_is_taken_only_from_a_replica_device_at_a_checkpoint_step() -> None:
    job = _job(2)
    peer = _peers(job)[1]
    assert witnesses.check_witness(cast(Job, job), peer, _witness(100, A)) == (100, A)
    bad: list[tuple[str, JobReport, ReportProblem]] = [
        ("f" * 32, _witness(100, A), ReportProblem.NOT_IN_PLAN),
        (peer, _witness(99, A), ReportProblem.STEP),  # not a checkpoint step
        (peer, _witness(250, A), ReportProblem.STEP),
        (peer, _witness(0, A), ReportProblem.STEP),
        (peer, _witness(None, A), ReportProblem.STEP),
        (peer, _witness(100, "A" * 64), ReportProblem.DIGEST),
        (peer, _witness(100, "../" * 21 + "a"), ReportProblem.DIGEST),
        (peer, _witness(100, A[:-1]), ReportProblem.DIGEST),
        (peer, _witness(100, ""), ReportProblem.DIGEST),
    ]
    for who, report, problem in bad:
        with pytest.raises(ReportRefused) as refused:
            witnesses.check_witness(cast(Job, job), who, report)
        assert refused.value.problem is problem
    one = _job(2)
    one.replica_plan = None  # one pipeline: no witnesses at all
    with pytest.raises(ReportRefused):
        witnesses.check_witness(cast(Job, one), peer, _witness(100, A))


def test_alike_replicas_count_as_reported_and_a_difference_is_judged_by_the_majority() -> None:
    two = _job(2)
    p0, p1 = _peers(two)
    verdict = witnesses.judge(cast(Job, two), 50, {p0: A, p1: A})
    assert verdict.reason == "" and verdict.alike == {p1} and verdict.odd == ()
    split = witnesses.judge(cast(Job, two), 50, {p0: A, p1: B})  # word against word: nobody is named
    assert "different states at step 50" in split.reason and split.odd == () and split.alike == frozenset()
    three = _job(3)
    q0, q1, q2 = _peers(three)
    odd = witnesses.judge(cast(Job, three), 50, {q0: A, q1: B, q2: A})
    assert odd.odd == (q1,) and odd.alike == {q2} and "diverged" in odd.reason
    first_odd = witnesses.judge(cast(Job, three), 50, {q0: B, q1: A, q2: A})  # the shard writer is the odd one
    assert first_odd.odd == (q0,) and first_odd.reason
    missing = witnesses.judge(cast(Job, three), 50, {q0: A, q1: B, q2: "c" * 64})
    assert missing.reason and missing.odd == ()


def test_with_two_replicas_the_leaders_own_witness_settles_the_places_it_holds() -> None:
    """Issue #29 item 6: a member sending a wrong witness failed every job of two replicas, never named. Where the
    leader holds one of the two places itself, its own computation settles it: the other device is the odd one
    (either replica); a place it does not hold stays word against word."""
    two = _job(2)
    p0, p1 = _peers(two)
    for leader, other in ((p0, p1), (p1, p0)):
        verdict = witnesses.judge(cast(Job, two), 50, {leader: A, other: B}, leader)
        assert verdict.odd == (other,) and "diverged" in verdict.reason, verdict
    alike = witnesses.judge(cast(Job, two), 50, {p0: A, p1: A}, p0)
    assert alike.reason == "" and alike.alike == {p1}
    stranger = witnesses.judge(cast(Job, two), 50, {p0: A, p1: B}, "e" * 32)  # the leader holds neither
    assert stranger.odd == () and "different states" in stranger.reason


def test_with_two_replicas_a_place_the_leader_does_not_hold_is_settled_by_the_first_replicas_shard() -> None:
    """Issue #29 item 6, the rest: where the leader holds neither place, the first replica's witness is the sha256
    of the shard it reported (bytes the leader fetches and checks): a witness that differs from it is the odd one;
    a first-replica device whose witness contradicts its own shard is. With DiLoCo (the witness is not the shard)
    its shard's digest says nothing (the next test: its outer state does)."""
    two = _job(2)
    assert two.replica_plan.sync_mode is ReplicaSyncMode.ALLREDUCE
    p0, p1 = _peers(two)
    leader = "e" * 32  # holds neither place
    other = witnesses.judge(cast(Job, two), 50, {p0: A, p1: B}, leader, {p0: A})
    assert other.odd == (p1,) and "diverged" in other.reason and "first replica's shard" in other.reason, other
    liar = witnesses.judge(cast(Job, two), 50, {p0: B, p1: A}, leader, {p0: A})  # contradicts its own shard
    assert liar.odd == (p0,) and liar.reason, liar
    both = witnesses.judge(cast(Job, two), 50, {p0: B, p1: B}, leader, {p0: A})  # alike, but not the shard
    assert both.odd == (p0,) and both.reason, both
    alike = witnesses.judge(cast(Job, two), 50, {p0: A, p1: A}, leader, {p0: A})
    assert alike.reason == "" and alike.alike == {p1} and alike.odd == ()
    unreported = witnesses.judge(cast(Job, two), 50, {p0: A, p1: B}, leader, {})  # no shard digest in hand
    assert unreported.odd == () and "different states" in unreported.reason
    diloco = _job(2, sync="diloco")
    d0, d1 = _peers(diloco)
    assert diloco.replica_plan.sync_mode is ReplicaSyncMode.DILOCO
    word = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: B}, leader, {d0: A})  # a shard digest says nothing
    assert word.odd == () and "different states" in word.reason


def test_with_diloco_a_place_the_leader_does_not_hold_is_settled_by_the_outer_state_in_the_first_replicas_shard() -> (
    None
):
    """Issue #29 item 6, DiLoCo: the witness is the outer anchor and momentum. A split at a place the leader does
    not hold is left open, naming the first replica's device whose shard settles it; judged again with the witness
    the leader rebuilt from that shard, the same rule as a shard digest's names the odd device, and never the one
    whose witness the shard backs. A shard that could not be read (``""``) leaves it word against word."""
    diloco = _job(2, sync="diloco")
    d0, d1 = _peers(diloco)
    leader = "e" * 32  # holds neither place
    shards = {d0: "c" * 64}  # its shard file's digest: not the DiLoCo witness
    open_ = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: B}, leader, shards)
    assert open_.unsettled == (d0,) and open_.odd == () and "different states" in open_.reason, open_
    other = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: B}, leader, shards, {d0: A})
    assert other.odd == (d1,) and other.unsettled == () and "first replica's shard" in other.reason, other
    assert "outer anchor and momentum" in other.reason
    liar = witnesses.judge(cast(Job, diloco), 50, {d0: B, d1: A}, leader, shards, {d0: A})  # not its own shard's
    assert liar.odd == (d0,) and liar.reason, liar
    both = witnesses.judge(cast(Job, diloco), 50, {d0: B, d1: B}, leader, shards, {d0: A})
    assert both.odd == (d0,), both
    unread = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: B}, leader, shards, {d0: ""})
    assert unread.odd == () and "different states" in unread.reason, unread
    alike = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: A}, leader, shards)
    assert alike.reason == "" and alike.unsettled == () and alike.alike == {d1}
    for held in (d0, d1):  # the leader's own witness settles its place: no shard is read
        own = witnesses.judge(cast(Job, diloco), 50, {d0: A, d1: B}, held, shards)
        assert own.unsettled == () and own.odd == ((d1,) if held == d0 else (d0,)), own
    every_step = _job(2)
    p0, p1 = _peers(every_step)
    assert witnesses.judge(cast(Job, every_step), 50, {p0: A, p1: B}, leader, {}).unsettled == ()
    assert witnesses.place(cast(Job, diloco), d1) == (0, 0) and witnesses.place(cast(Job, diloco), leader) is None


def test_the_shard_digests_are_the_first_replicas_reported_ones() -> None:
    reports = {50: {"p": {"name": "s", "sha256": A, "size": 9}}}
    job = SimpleNamespace(leading=SimpleNamespace(commits=SimpleNamespace(reports=reports)))
    assert witnesses.shard_digests(cast(Job, job), 50) == {"p": A}
    assert witnesses.shard_digests(cast(Job, job), 100) == {}


def test_the_worker_witness_event_round_trips_and_a_bad_digest_is_refused() -> None:
    from arceusd.worker.protocol import WitnessEvent, WorkerProtocolError, parse_event

    assert parse_event(WitnessEvent(12, A).to_line()) == WitnessEvent(12, A)
    for line in ('{"event": "witness", "step": 12, "digest": "xyz"}', '{"event": "witness", "digest": "' + A + '"}'):
        with pytest.raises(WorkerProtocolError):
            parse_event(line)
