"""The leader's decisions at a job's edges (arceusd.jobs.core.lifecycle), and the manager carrying them out.

The manager tests drive a real :class:`JobManager` in trio with a mock clock; only its boundaries are fakes (the
node's identity and elections, a peer service that records what it sends, a shard fetch that fails, a worker
that records its commands).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from arceusd.jobs.core import JobCore, JobState, Stamp, lifecycle
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.record.job import Job
from arceusd.jobs.service.manager import JobManager
from protocol.job_wire import JobAck, JobGo, PeerAddress

ME, OTHER = "a" * 32, "b" * 32
JOB = "c" * 32


# ------------------------------------------------------------------------------------------------ pure
def test_a_failed_intermediate_commit_keeps_running() -> None:
    assert lifecycle.after_commit_failure(20, 100, 1, "x") == lifecycle.KeepRunning("x")


def test_a_failed_final_commit_is_retried_then_fails_the_job() -> None:
    decisions = [
        lifecycle.after_commit_failure(100, 100, a, "no shard") for a in range(1, lifecycle.FINAL_COMMIT_ATTEMPTS + 1)
    ]
    assert all(isinstance(d, lifecycle.RetryCommit) for d in decisions[:-1])
    last = decisions[-1]
    assert isinstance(last, lifecycle.FailJob)
    assert "final checkpoint (step 100)" in last.error and "no shard" in last.error
    with pytest.raises(ValueError):
        lifecycle.after_commit_failure(100, 100, 0, "x")


def test_go_is_resent_then_the_plan_restarts() -> None:
    assert lifecycle.after_go({}, 1) == lifecycle.GoAcknowledged()
    assert lifecycle.after_go({OTHER: "no answer"}, 1) == lifecycle.ResendGo((OTHER,))
    restart = lifecycle.after_go({OTHER: "no answer"}, lifecycle.GO_ATTEMPTS)
    assert isinstance(restart, lifecycle.RestartPlan) and OTHER[:12] in restart.reason


def test_only_an_ended_job_leaves_its_election() -> None:
    assert all(lifecycle.ends_election(s) for s in ("done", "failed", "cancelled"))
    assert not any(lifecycle.ends_election(s) for s in ("running", "paused", "replanning", "recovering"))


# ------------------------------------------------------------------------------------------------ manager
class FakeElections:
    def __init__(self) -> None:
        self.tracked = {JOB}
        self.untracked: list[str] = []

    def jobs(self) -> list[str]:
        return sorted(self.tracked)

    def untrack(self, job_id: str) -> None:
        self.tracked.discard(job_id)
        self.untracked.append(job_id)


class FakePeers:
    def __init__(self, answer: Any = None) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.answer = answer
        self.membership = SimpleNamespace(members={})

    async def request(self, address: str, peer: str, msg: Any, **_: Any) -> Any:
        self.sent.append((peer, msg))
        return self.answer

    def alive_peers(self) -> dict[str, str]:
        return {}


def manager(tmp_path: Path, peers: FakePeers) -> tuple[JobManager, FakeElections]:
    elections = FakeElections()
    node = SimpleNamespace(
        paths=SimpleNamespace(jobs_dir=tmp_path, root=tmp_path),
        identity=SimpleNamespace(peer_id=ME),
        elections=elections,
        addresses={"peer": "127.0.0.1:1"},
        config=SimpleNamespace(worker_threads=1, auto_join=False),  # read once, as the parts' ports are built
    )
    return JobManager(node, peers), elections  # type: ignore[arg-type]


def test_every_action_of_the_core_has_one_handler_or_is_answered_by_its_caller(tmp_path: Path) -> None:
    """Issue 32: the driver carries out actions through the table the parts register: none is left unhandled
    (an action the table lacks is silently dropped), long actions are run by the leader's loop."""
    import typing

    from arceusd.jobs.core import actions
    from arceusd.jobs.service.driver import LONG_ACTIONS

    m, _ = manager(tmp_path, FakePeers())
    table = m.driver.table
    answered_by_caller = {actions.StopWorkers, actions.UntrackElection, actions.Refuse, actions.LetWorkerGo}
    every = set(typing.get_args(actions.Action))
    assert set(table.quick) | set(table.long) | answered_by_caller == every
    assert not set(table.quick) & set(table.long) and set(table.long) == set(LONG_ACTIONS)


def leading_job(tmp_path: Path, total_steps: int = 100) -> Job:
    """An owner whose plan over itself and OTHER runs (its core as the leader's loop would have left it)."""
    spec = SimpleNamespace(checkpoint=SimpleNamespace(keep=2), name="t", base_dir=tmp_path)
    core = JobCore.owned(ME, total_steps)
    job = Job(JOB, cast(Any, spec), b"{}", "0" * 64, ME, "127.0.0.1:1", tmp_path / JOB, core, total_steps=total_steps)
    job.offers[ME] = cast(Any, SimpleNamespace(address="127.0.0.1:1"))
    job.offers[OTHER] = cast(Any, SimpleNamespace(address="127.0.0.1:2"))
    core.handle(e.MemberJoined(OTHER, memory_ok=False), 0.0)  # (the core takes it in; too little memory to plan)
    assert core.lead is not None
    core.state, core.stamp, core.lead.plan = JobState.RUNNING, Stamp(1, 1), (ME, OTHER)
    # a running plan whose one place is OTHER's (a commit without a running plan is moot)
    place = SimpleNamespace(shares=(SimpleNamespace(peer_id=OTHER),))
    cast(Any, job).plan = SimpleNamespace(peer_ids=(OTHER,), stages=(place,))
    return job


def run_with_nursery(mgr: JobManager, fn: Any) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            mgr._nursery = nursery
            await fn()
            await trio.sleep(60)  # let spawned tasks (commits, retries, stops, untrack) finish under the mock clock
            nursery.cancel_scope.cancel()

    # the clock jumps once nothing ran for 50 ms of real time: a thread (file checks) gets to finish first
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.05))


def complete(mgr: JobManager, job: Job, step: int) -> Any:
    """Every device of the running plan reported ``step`` (what the leader's report handling feeds the core)."""

    async def fed() -> None:
        mgr.feed(job, e.CheckpointComplete(job.core.stamp, step))

    return fed


def test_a_final_checkpoint_a_member_does_not_serve_excludes_it_on_the_retry(tmp_path: Path) -> None:
    """Its serving failed the first attempt and the first retry (each counts): the member is excluded and the job
    plans again from its last commit; it used to fail after all its attempts with the member never named. (A
    final commit that fails with nobody to blame still fails the job after its retries: test_job_core.)"""
    mgr, elections = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    job.leading.commits.reports[100] = {OTHER: {"name": "shard-1.pt", "sha256": "0" * 64, "size": 3}}
    fetches: list[int] = []

    async def fetch_shard(*_: Any) -> None:
        fetches.append(1)
        return None

    mgr.commits.ports = replace(mgr.commits.ports, fetch_shard=fetch_shard)  # the commits' port
    run_with_nursery(mgr, complete(mgr, job, 100))
    assert len(fetches) == 2 < lifecycle.FINAL_COMMIT_ATTEMPTS
    assert "shard serving failed 2 commits in a row" in job.leading.checks.excluded[OTHER], job.leading.checks.excluded
    assert job.state == "recovering" and not job.finished.is_set() and "shard-1.pt" in job.error
    assert elections.untracked == [], "the job goes on: it stays in its election"


def test_a_failed_intermediate_commit_is_not_retried_and_the_job_runs_on(tmp_path: Path) -> None:
    mgr, elections = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    job.leading.commits.reports[20] = {OTHER: {"name": "shard-1.pt", "sha256": "0" * 64, "size": 3}}

    async def fetch_shard(*_: Any) -> None:
        return None

    mgr.commits.ports = replace(mgr.commits.ports, fetch_shard=fetch_shard)  # the commits' port
    run_with_nursery(mgr, complete(mgr, job, 20))
    assert job.state == "running" and "shard-1.pt" in job.error
    assert elections.untracked == []


def test_cancel_stops_members_then_leaves_the_election(tmp_path: Path) -> None:
    peers = FakePeers(JobAck(True))
    mgr, elections = manager(tmp_path, peers)
    job = leading_job(tmp_path)
    cast(Any, job).plan = SimpleNamespace(peer_ids=(ME, OTHER))

    async def cancel() -> None:
        mgr.feed(job, e.Cancel())

    run_with_nursery(mgr, cancel)
    assert job.state == "cancelled" and job.finished.is_set()
    assert [(p, type(m).__name__, m.reason) for p, m in peers.sent] == [(OTHER, "JobStop", "cancelled")]
    assert elections.untracked == [JOB]


class FakeWorker:
    pid = 1

    def __init__(self) -> None:
        self.commands: list[dict[str, Any]] = []

    async def send(self, command: dict[str, Any]) -> None:
        self.commands.append(command)

    async def events(self) -> Any:
        await trio.sleep_forever()
        yield {}

    async def kill(self) -> int:
        return 0

    async def stop(self, grace: float) -> None:
        return None


def test_a_go_sent_again_after_a_lost_answer_starts_the_worker_once(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    job.core.stamp = Stamp(1, 3)
    worker = FakeWorker()
    job.worker = worker  # type: ignore[assignment]
    go = JobGo(JOB, 1, 3, (PeerAddress(OTHER, "127.0.0.1:9"),))

    async def twice() -> None:
        await mgr.local.go(job, go)
        await mgr.local.go(job, go)

    run_with_nursery(mgr, twice)
    assert worker.commands == [{"cmd": "start", "addresses": {OTHER: "127.0.0.1:9"}}]


def test_a_member_that_never_acknowledges_go_gets_it_again_then_the_plan_restarts(tmp_path: Path) -> None:
    peers = FakePeers(None)  # the answer is lost every time
    mgr, _ = manager(tmp_path, peers)
    job = leading_job(tmp_path)
    go = JobGo(JOB, 1, 0, ())

    async def rounds() -> None:
        attempt, pending = 0, [OTHER]
        while True:
            attempt += 1
            missing = await mgr.starting.send_go(job, go, pending, {OTHER: "127.0.0.1:2"})
            decided = lifecycle.after_go(missing, attempt)
            if not isinstance(decided, lifecycle.ResendGo):
                assert isinstance(decided, lifecycle.RestartPlan) and "no answer" in decided.reason
                return
            pending = list(decided.peers)

    run_with_nursery(mgr, rounds)
    assert [p for p, _ in peers.sent] == [OTHER] * lifecycle.GO_ATTEMPTS


def test_a_commit_waiting_while_a_repartition_is_asked_for_does_nothing(tmp_path: Path) -> None:
    """A checkpoint whose commit waited its turn (commits run one at a time) while a member failed or was excluded
    must not be committed: the new plan resumes from the last commit before the failure (CI on 6ca1187 committed
    steps after an exclusion, and an empty manifest once the restart had cleared the reports)."""
    mgr, _ = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    job.leading.commits.reports[40] = {OTHER: {"name": "shard-1.pt", "sha256": "0" * 64, "size": 3}}
    fetches: list[int] = []

    async def fetch_shard(*_: Any) -> None:
        fetches.append(1)
        return None

    mgr.commits.ports = replace(mgr.commits.ports, fetch_shard=fetch_shard)  # the commits' port
    waited = job.core.stamp

    async def excluded_then_commit() -> None:
        mgr.request_restart(job, "member x excluded")
        assert job.state == "recovering" and job.core.stamp != waited
        await mgr.commits.commit(job, a.Commit(waited, 40))

    run_with_nursery(mgr, excluded_then_commit)
    job.plan = None  # the restart ran: no plan until the next one
    run_with_nursery(mgr, lambda: mgr.commits.commit(job, a.Commit(job.core.stamp, 40)))
    assert fetches == [] and job.committed_step == 0 and job.error == "member x excluded"


def test_a_command_from_a_newly_elected_leader_waits_for_the_election_event_not_a_poll(tmp_path: Path) -> None:
    """``elected`` sleeps until the election says its leader changed (or its 3 s are up), and never reads the
    election in between: one read before the wait, one after each change."""
    mgr, elections = manager(tmp_path, FakePeers())
    leaders: dict[str, tuple[str, int]] = {}
    reads: list[float] = []

    def leader(job_id: str) -> tuple[str, int] | None:
        reads.append(trio.current_time())
        return leaders.get(job_id)

    elections.leader = leader  # type: ignore[attr-defined]
    job = leading_job(tmp_path)
    results: list[tuple[bool, float]] = []

    async def main() -> None:
        async def ask() -> None:
            began = trio.current_time()
            results.append((await mgr.elected(job, OTHER), trio.current_time() - began))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(1.0)
            mgr.leader_changed(JOB)  # a change that is not ours: it reads again and waits on
            await trio.sleep(0.5)
            leaders[JOB] = (OTHER, 2)
            mgr.leader_changed(JOB)
        results.append((await mgr.elected(job, "f" * 32), 0.0))  # never elected: False after its 3 s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert results[0] == (True, 1.5)
    assert results[1][0] is False
    assert len(reads) == 3 + 1  # the first call: before the wait and after each of two changes; the second: once


def test_a_restart_cuts_the_start_short_drops_the_old_plans_actions_and_checks_who_answers(tmp_path: Path) -> None:
    """The driver carries out the core's restart: the start in progress is cancelled, what the old plan had
    queued for the leader's loop is dropped, this device's worker is detached, the old plan's live members are
    told to stop (stamped with the new term), and the check of who answers is queued for the loop."""
    peers = FakePeers(JobAck(True))
    peers.alive_peers = lambda: {OTHER: "127.0.0.1:2"}  # type: ignore[method-assign]
    mgr, _ = manager(tmp_path, peers)
    job = leading_job(tmp_path)
    old = job.core.stamp
    scope = trio.CancelScope()
    job.leading.loop.start_scope = scope
    job.leading.loop.queue.append(a.SendGo(old, (ME, OTHER)))
    worker = FakeWorker()
    job.worker = cast(Any, worker)

    async def fail() -> None:
        mgr.request_restart(job, "worker on bbbbbbbbbbbb failed: broken pipe")

    run_with_nursery(mgr, fail)
    assert scope.cancel_called and job.worker is None
    assert job.state == "recovering" and job.core.stamp == old.next_term()
    assert list(job.leading.loop.queue) == [a.CheckReachable(job.core.stamp, (OTHER,))]
    assert job.leading.loop.recoveries[-1].reason.startswith("worker on bbbbbbbbbbbb failed")
    stops = [(p, m) for p, m in peers.sent if type(m).__name__ == "JobStop"]
    assert [(p, m.term, m.reason) for p, m in stops] == [(OTHER, job.term, "replanning")]


def test_the_owner_does_not_hand_its_job_to_a_peer_that_was_never_in_it(tmp_path: Path) -> None:
    """A peer's answer naming a leader that never was a member of the job (a stranger's claim) asks nobody to take
    the owner in, and the job runs on as it was."""
    peers = FakePeers(None)
    mgr, _ = manager(tmp_path, peers)
    job = leading_job(tmp_path)
    cast(Any, job).plan = SimpleNamespace(peer_ids=(ME, OTHER))
    stranger = "f" * 32
    peers.membership.members[stranger] = SimpleNamespace(address="127.0.0.1:9")
    before = job.core.stamp

    async def claim() -> None:
        mgr.feed(job, e.FollowsOther(stranger, OTHER))  # the plan's only other device says so

    run_with_nursery(mgr, claim)
    assert peers.sent == [] and job.state == "running" and job.core.stamp == before and job.leader == ME
