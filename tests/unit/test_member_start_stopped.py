"""A stop that reaches a member while its worker starts (the job core's side): the start is cut short, its answer
refused, and no ``go`` is acknowledged for a plan whose worker this member does not hold.

At load 15 a false "leader dead" on a member (``LeaderGone``) came during a 12 s worker start: the stop found no
worker process yet, the worker came up anyway, the start was accepted and the later ``go`` acknowledged with no
worker to take it, so the job never stepped. The member's I/O side of it: ``test_member_start_stop_io.py``.
"""

from __future__ import annotations

from arceusd.jobs.core import JobCore, JobState, Role, Stamp
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e

LEADER, ME = "a" * 32, "b" * 32
PLAN = Stamp(3, 7)


def member() -> JobCore:
    core = JobCore(ME, LEADER, 100, Role.MEMBER, JobState.JOINED, Stamp(3, 6))
    core.handle(e.StartReceived(PLAN, LEADER), 0.0)
    return core


def state(core: JobCore) -> JobState:
    """The core's state, read afresh (mypy would keep an earlier comparison's narrowing)."""
    return core.state


def refused(out: list[a.Action]) -> str:
    assert len(out) == 1 and isinstance(out[0], a.Refuse), out
    return out[0].reason


def test_a_leader_declared_dead_while_the_worker_starts_refuses_the_start_and_its_go() -> None:
    core = member()
    out = core.handle(e.LeaderGone("dead"), 0.0)  # the stop: the driver detaches and stops the starting worker
    assert a.StopWorkers(PLAN, (), "paused") in out and state(core) == JobState.PAUSED
    why = refused(core.handle(e.WorkerStarted(PLAN), 0.0))  # the worker came up anyway: never accepted
    assert "stopped while its worker started" in why and "leader" in why
    assert state(core) == JobState.PAUSED
    assert "holds no worker for plan epoch 7" in refused(core.handle(e.GoReceived(PLAN), 0.0))
    assert state(core) == JobState.PAUSED and core.let_go(7)  # the go was not taken


def test_a_stop_after_the_start_was_answered_refuses_the_go() -> None:
    for stop in (e.LeaderGone("dead"), e.StopReceived("replanning")):
        core = member()
        assert core.handle(e.WorkerStarted(PLAN), 0.0) == [] and state(core) == JobState.STARTING
        assert find_stop(core.handle(stop, 0.0))
        assert "holds no worker" in refused(core.handle(e.GoReceived(PLAN), 0.0))
        assert "holds no worker" in refused(core.handle(e.GoReceived(PLAN), 0.0))  # resent: refused again


def test_a_start_replaced_by_a_newer_one_is_refused_and_the_newer_one_goes() -> None:
    core = member()
    newer = Stamp(3, 8)
    core.handle(e.StartReceived(newer, LEADER), 0.0)
    assert "plan epoch 7 was stopped" in refused(core.handle(e.WorkerStarted(PLAN), 0.0))
    assert core.handle(e.WorkerStarted(newer), 0.0) == [] and state(core) == JobState.STARTING
    assert core.handle(e.GoReceived(newer), 0.0) == [a.LetWorkerGo(newer)] and state(core) == JobState.RUNNING
    assert core.handle(e.GoReceived(newer), 0.0) == []  # a go sent again after a lost answer: a no-op


def test_an_undisturbed_start_is_accepted_and_let_go_once() -> None:
    core = member()
    assert core.handle(e.WorkerStarted(PLAN), 0.0) == [] and state(core) == JobState.STARTING
    assert core.handle(e.GoReceived(PLAN), 0.0) == [a.LetWorkerGo(PLAN)] and state(core) == JobState.RUNNING
    assert core.handle(e.WorkerStarted(PLAN), 0.0) != []  # one answer per start: a second is refused


def test_a_replica_rebuilt_on_a_device_that_went_in_the_same_epoch_lets_its_new_worker_go() -> None:
    """A device of a dropped replica (stopped, its worker gone) that rebuilds it at the next commit is started
    again in the same plan epoch: its new worker takes the go (it was acknowledged and never delivered)."""
    core = member()
    core.handle(e.WorkerStarted(PLAN), 0.0)
    assert core.handle(e.GoReceived(PLAN), 0.0) == [a.LetWorkerGo(PLAN)]
    assert find_stop(core.handle(e.StopReceived("replanning"), 0.0))  # its replica dropped
    core.handle(e.StartReceived(PLAN, LEADER), 0.0)  # the rebuild's start: the same term and epoch
    assert core.handle(e.WorkerStarted(PLAN), 0.0) == []
    assert core.handle(e.GoReceived(PLAN), 0.0) == [a.LetWorkerGo(PLAN)]
    assert core.handle(e.GoReceived(PLAN), 0.0) == []  # sent again after a lost answer: a no-op


def find_stop(out: list[a.Action]) -> bool:
    return any(isinstance(x, a.StopWorkers) and x.local for x in out)
