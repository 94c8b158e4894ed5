"""A member's side of a replica drop (``arceusd.jobs.member.replica_changes``): the leader's ``JobDropReplica`` is
checked against the member's own plan before it is used, and only then does its worker hear of it (issue 22)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from arceusd.jobs.common.replica_change import dropped_plan
from arceusd.jobs.core import JobCore, JobState, Role, Stamp
from arceusd.jobs.record.job import Job
from partitioner.replicas import ReplicaPlan, ReplicaSyncMode
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobDropReplica
from tests.unit.test_job_lifecycle import JOB, ME, OTHER, FakePeers, manager

THIRD, FOURTH = "e" * 32, "f" * 32


class FakeWorker:
    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    async def send(self, command: dict[str, Any]) -> None:
        self.commands.append(command)


def _plan(*replicas: tuple[str, ...]) -> ReplicaPlan:
    return ReplicaPlan(
        tuple(cast(Any, SimpleNamespace(peer_ids=r)) for r in replicas), ReplicaSyncMode.ALLREDUCE, 0.01, 1, 0.1
    )


def member_job(tmp_path: Path) -> tuple[Job, FakeWorker]:
    """This device (ME) in replica 1 of three; OTHER leads at term 2, epoch 3."""
    core = JobCore(ME, OTHER, 100, Role.MEMBER, JobState.RUNNING, Stamp(2, 3), OTHER)
    spec = SimpleNamespace(checkpoint=SimpleNamespace(keep=2), name="t", base_dir=tmp_path)
    job = Job(JOB, cast(Any, spec), b"{}", "0" * 64, OTHER, "127.0.0.1:1", tmp_path / JOB, core, total_steps=100)
    job.replica_plan = _plan((OTHER,), (ME,), (THIRD, FOURTH))
    job.plan = cast(Any, job.replica_plan.replicas[0])
    worker = FakeWorker()
    job.worker = cast(Any, worker)
    job.step = 57
    return job, worker


def _header(sender: str = OTHER, term: int = 2, epoch: int = 3) -> Header:
    return cast(Header, SimpleNamespace(sender=sender, term=term, epoch=epoch))


def test_a_drop_from_the_leader_shrinks_the_plan_and_tells_the_worker_once(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job, worker = member_job(tmp_path)
    mgr.jobs[JOB] = job
    ack = trio.run(mgr.replicas.on_drop, _header(), JobDropReplica(JOB, 3, 2))
    assert ack == JobAck(True)
    assert job.replica_plan is not None and [r.peer_ids for r in job.replica_plan.replicas] == [(OTHER,), (ME,)]
    assert worker.commands == [{"cmd": "drop_replica", "replicas": 3, "index": 2, "hold_at": 0}]
    assert (job.replica_slots, job.data_shares, job.ring_generation) == ((0, 1), 3, 1)
    (drop,) = job.replica_drops
    assert drop.devices == (THIRD, FOURTH) and drop.step == 57 and drop.replicas_left == 2
    assert drop.summary()["devices"] == [THIRD, FOURTH]
    # the same drop again (a retry, a replay): it no longer fits this plan, nothing changes
    again = trio.run(mgr.replicas.on_drop, _header(), JobDropReplica(JOB, 3, 2))
    assert not again.ok and "does not fit a plan of 2 replicas" in again.reason
    assert len(worker.commands) == 1 and len(job.replica_drops) == 1


@pytest.mark.parametrize(
    ("header", "msg", "why"),
    [
        (_header(sender=THIRD), JobDropReplica(JOB, 3, 2), "follow"),  # not our leader
        (_header(epoch=2), JobDropReplica(JOB, 3, 2), "stale"),  # an older plan's
        (_header(), JobDropReplica(JOB, 3, 1), "in the dropped replica"),  # our own: our worker is stopped instead
        (_header(), JobDropReplica(JOB, 3, 3), "no replica 3"),
        (_header(), JobDropReplica(JOB, 4, 0), "does not fit"),
        (_header(), JobDropReplica("9" * 32, 3, 2), "unknown job"),
    ],
)
def test_a_drop_that_does_not_fit_is_refused_and_changes_nothing(
    tmp_path: Path, header: Header, msg: JobDropReplica, why: str
) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job, worker = member_job(tmp_path)
    mgr.jobs[JOB] = job
    before = job.replica_plan
    ack = trio.run(mgr.replicas.on_drop, header, msg)
    assert not ack.ok and why in ack.reason, ack
    assert job.replica_plan is before and worker.commands == [] and job.replica_drops == []


def test_dropped_plan_keeps_the_order_of_the_replicas_left() -> None:
    plan = _plan((OTHER,), (ME,), (THIRD,))
    assert [r.peer_ids for r in dropped_plan(plan, 3, 0).replicas] == [(ME,), (THIRD,)]
    assert dataclasses.replace(dropped_plan(plan, 3, 0), replicas=plan.replicas) == plan
    with pytest.raises(ValueError, match="does not fit"):
        dropped_plan(_plan((ME,)), 1, 0)
