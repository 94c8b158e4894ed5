"""Issue 31, spares: the leader's plan start reaches the members it leaves out at once (beside the plan's own
starts), and a member that held a place in an older plan and is left out of the new one stops its old worker.
Over fakes of the manager's context (the plan, the spec and the job are real)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from arceusd.jobs.core import Role, Stamp, actions, events
from arceusd.jobs.leader.starting import Starting
from arceusd.jobs.member.local_worker import LocalWorker
from arceusd.jobs.plans.planning import encode_job_start, make_job_plan
from arceusd.jobs.record.job import Job
from arceusd.jobs.spec.schema import load_spec
from protocol.envelope import Header
from protocol.job_wire import JobStart, JobStartReply
from tests.unit.member_port_fakes import port_fakes
from tests.unit.test_forecast import offer
from tests.unit.test_jobspec import EXAMPLES

LEADER, SLOW, SLOWER = "a" * 32, "b" * 32, "c" * 32
JOB_ID = "d" * 32


def planned_job(tmp_path: Path, me: str) -> Job:
    """The MNIST example over a fast leader and two devices far slower: the plan leaves both out (spares)."""
    spec = load_spec(EXAMPLES / "mnist-mlp.toml")
    offers = [offer(LEADER), offer(SLOW, 1e6), offer(SLOWER, 1e6)]
    offers = [o if o.peer_id == LEADER else _at(o) for o in offers]
    inputs, rp = make_job_plan(spec, offers, {}, None, leader=LEADER)
    assert rp.peer_ids == (LEADER,), rp.peer_ids
    if me == LEADER:
        job = Job.submitted(
            JOB_ID, spec, b"spec", "h", LEADER, "", tmp_path, min_members=3, first_of_daemon=False, created=0.0
        )
    else:
        job = Job.announced(JOB_ID, spec, b"spec", "h", LEADER, "", me, tmp_path)
        job.core.role = Role.MEMBER
    job.offers = {o.peer_id: o for o in offers}
    for o in offers:  # the leader's core takes them in (a member's shows every offer it holds)
        job.core.handle(events.MemberJoined(o.peer_id, memory_ok=False), 0.0)
    job.inputs, job.replica_plan, job.plan = inputs, rp, rp.replicas[0]
    return job


def _at(o: Any) -> Any:
    from dataclasses import replace

    return replace(o, address=f"127.0.0.1:{ord(o.peer_id[0])}")


def test_the_plans_start_is_sent_to_the_members_it_leaves_out(tmp_path: Path) -> None:
    """bench/quote.py's 3-second MNIST job ended before its spare was told anything: the spares get the plan's
    start with the plan's own starts, not later."""
    job = planned_job(tmp_path, LEADER)
    spawned: list[tuple[Any, tuple[Any, ...]]] = []
    fed: list[Any] = []

    async def start_worker(_job: Job, _resume: Any, _weights: Any) -> JobStartReply:
        return JobStartReply(JOB_ID, True, "", "127.0.0.1:1")

    ports = SimpleNamespace(  # what Starting.start calls of its port
        me=LEADER,
        spawn=lambda fn, *args: spawned.append((fn, args)),
        feed=lambda _job, event: fed.append(event),
        start_own_worker=start_worker,
    )
    starting = Starting(cast(Any, ports))
    trio.run(starting.start, job, actions.SendStart(job.core.stamp, (LEADER,), False))
    told = [args for fn, args in spawned if getattr(fn, "__name__", "") == "tell_spares"]
    assert len(told) == 1, spawned
    _, start, spares = told[0]
    assert sorted(spares) == [SLOW, SLOWER] and spares[SLOW] == job.members[SLOW].address
    assert isinstance(start, JobStart) and start.epoch == job.epoch
    assert [type(e).__name__ for e in fed] == ["StartAnswered"]


def test_a_member_left_out_of_the_new_plan_says_it_is_a_spare_and_stops_its_old_worker(tmp_path: Path) -> None:
    """A member that had a place and is left out of the next plan kept its old worker running (nothing told it
    to stop: the plan's stops go to the plan's members)."""
    leader = planned_job(tmp_path / "leader", LEADER)
    assert leader.inputs is not None and leader.replica_plan is not None
    inputs_data, plan_data = encode_job_start(leader.spec, leader.inputs, leader.replica_plan)
    job = planned_job(tmp_path / "member", SLOW)
    stopped: list[float] = []

    class OldWorker:
        async def stop(self, grace: float) -> None:
            stopped.append(grace)

    job.worker = cast(Any, OldWorker())

    fakes = port_fakes(job.members[SLOW])
    ports = SimpleNamespace(  # what LocalWorker.on_start calls of its port
        jobs={JOB_ID: job},
        check_leader=fakes.check_leader,
        offer=fakes.offer,
        drop_own_worker=fakes.drop_own_worker,
        feed=lambda j, event: j.core.handle(event, 0.0),
        me=SLOW,
    )
    header = cast(Header, SimpleNamespace(sender=LEADER, term=1, epoch=2))
    start = JobStart(JOB_ID, 1, 2, b"spec", plan_data, inputs_data, members=(LEADER, SLOW, SLOWER))
    reply = trio.run(LocalWorker(cast(Any, ports)).on_start, header, start)
    assert not reply.accepted and "no place in the plan" in reply.reason
    assert job.is_spare() and job.spare_in == (1, 2)
    assert job.core.stamp == Stamp(1, 2), "the plan's stamp and standby: whom it follows if the leader dies"
    assert stopped == [0.5] and job.worker is None
