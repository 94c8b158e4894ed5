"""The job core's driver: feeds a job's :class:`arceusd.jobs.core.JobCore` the events the daemon sees and carries
out the actions it returns. Decisions are the core's; this module only moves bytes, files and timers.

:meth:`Driver.feed` hands the core one event and runs what it answers. Quick actions run at once (log, persist,
cancel a start in progress, detach and stop this device's worker, send stops, spawn a commit, the standby's sync
or the export, track or leave the election). Long ones that must not overlap (plan, start the workers, send
``go``, check which members answer before a repartition) are queued on the job (``job.leading.queue``) and run one at a
time by the leader's loop (:meth:`Driver.run_queue`), each feeding back what came of it; a result of an older plan
is dropped by the core. ``Refuse`` and ``LetWorkerGo`` are answers for the handler that fed the event: it finds
them in the list :meth:`feed` returns.

Where each action's I/O lives: planning, starting and ``go`` in :mod:`arceusd.jobs.starting`; commits in
:mod:`arceusd.jobs.commits`; the standby's and owner's copies in :mod:`arceusd.jobs.standby_sync`; the hand-over
in :mod:`arceusd.jobs.joining`; the export in a child process (:func:`arceusd.jobs.filework.export_model`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from arceusd.checkpoint import step_dir
from arceusd.jobs import filework
from arceusd.jobs.core import JobState, Role
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.job import Job, Recovery
from arceusd.jobs.transfers import job_weights, leader_data
from arceusd.market.forecast import count_evals
from arceusd.market.timings import JobTiming, pause_of, record_timing, typical_step
from arceusd.membership.events import MemberState
from protocol.job_wire import JobStop

if TYPE_CHECKING:
    from arceusd.jobs.commits import Commits
    from arceusd.jobs.joining import Joining
    from arceusd.jobs.regrow import Regrowing
    from arceusd.jobs.replica_drop import ReplicaDrops
    from arceusd.jobs.standby_sync import StandbySyncing
    from arceusd.jobs.starting import Starting
    from arceusd.node import Node
    from arceusd.peers import PeerService

log = logging.getLogger(__name__)


def job_timing(job: Job, now: float) -> JobTiming | None:
    """What an owned job that ended ``done`` at ``now`` took: submit to its first step, its last commit to done,
    its typical step over the plan's prediction (None: a restored job, one that recovered, or one that never stepped or
    committed here: its figures are not a plain run's)."""
    checkpoints = job.leading.checkpoints
    if job.leading.recoveries or not job.first_step_at or not checkpoints or not job.history or job.history[0][0] != 1:
        return None  # (a restored job resumes past step 1)
    rp = job.replica_plan
    predicted = rp.predicted_step_time_s if rp is not None else 0.0
    points = [(s, at) for (s, _), at in zip(job.history, job.history_at, strict=False)]
    step = typical_step(points)
    ratio = step / predicted if predicted > 0 else 0.0
    t = job.spec.training  # the points that held a checkpoint or an evaluation, before the last step
    pauses = count_evals(t.steps, job.spec.checkpoint.interval_steps, t.eval_interval_steps) - 1
    return JobTiming(
        type(job.spec.model).__name__,
        round(job.first_step_at - job.created, 3),
        round(max(now - checkpoints[-1][1], 0.0), 3),
        job.first_of_daemon,
        round(ratio, 4),
        round(now, 3),
        round(predicted, 6),
        len(job.plan_peers()),
        slowest_link(job.leading.links),
        round(pause_of(points, step, pauses), 4),
    )


def slowest_link(links: dict[str, dict[str, float]]) -> tuple[float, float, float]:
    """The slowest of the links a leader measured to its members (``job.leading.links``: ms, MB/s, ms) as
    (round trip s, bytes/s, per-message s); zeros when it measured none."""
    try:
        rows = [(v["rtt_ms"] / 1e3, v["bandwidth_mb_s"] * 1e6, v["message_ms"] / 1e3) for v in links.values()]
    except (KeyError, TypeError):
        return 0.0, 0.0, 0.0
    rows = [r for r in rows if r[1] > 0]
    if not rows:
        return 0.0, 0.0, 0.0
    return max(r[0] for r in rows), min(r[1] for r in rows), max(r[2] for r in rows)


LONG_ACTIONS = (a.Plan, a.SendStart, a.SendGo, a.CheckReachable, a.Regrow)
"""Actions the leader's loop runs one at a time, in order (each waits on the network or a child process)."""

STOP_TIMEOUT_S = 10.0
"""How long a leader waits for a member to acknowledge its stop."""


class DriverPorts(Protocol):
    """What the driver uses of the job manager (``arceusd.jobs.manager.JobManager`` has it all): the node and
    its peers, the parts that carry out the long actions, and the manager's own bookkeeping. A port, not the
    manager's class: the manager imports this module (issue 32: the import cycle it closed)."""

    node: Node
    peers: PeerService
    commits: Commits
    joining: Joining
    starting: Starting
    drops: ReplicaDrops
    regrow: Regrowing
    standbys: StandbySyncing

    def persist(self, job: Job) -> None: ...

    def spawn(self, fn: Any, *args: Any) -> None: ...

    def leads(self, job: Job) -> bool: ...

    def track(self, job: Job, members: list[str], ranking: list[str]) -> None: ...

    def untrack(self, job: Job) -> None: ...

    def announce_to_new_peers(self, job: Job) -> None: ...

    async def take_over(self, job: Job) -> None: ...


class Driver:
    """Carries out a job core's actions for the manager (see the module docstring)."""

    def __init__(self, manager: DriverPorts) -> None:
        self.m = manager

    # ------------------------------------------------------------------------------------------ feeding
    def feed(self, job: Job, event: e.Event) -> list[a.Action]:
        """Hand ``job``'s core ``event`` (now), carry out what it answers; the actions, for the caller's
        answers (``Refuse``, ``LetWorkerGo``)."""
        before = (job.role, job.state)
        out = job.core.handle(event, time.monotonic())
        self._reconcile_members(job)
        self.execute(job, out)
        if job.role != Role.OWNER and (job.role, job.state) != before:
            self.m.persist(job)  # a member's record of the job (arceusd.jobs.known): listed after a restart
        return out

    def _reconcile_members(self, job: Job) -> None:
        """The leader's offers (``job.members``) hold the same peers as its core: a member the core dropped
        loses its offer (and is announced to again when it comes back); one whose offer was dropped here leaves
        the core."""
        lead = job.core.lead
        if lead is None or not job.core.leads:
            return
        me = self.m.node.identity.peer_id
        for peer in [p for p in job.members if p not in lead.members and p != me]:
            del job.members[peer]
            job.leading.announced.discard(peer)
        lead.members &= set(job.members) | {me}

    def execute(self, job: Job, actions: list[a.Action]) -> None:
        untrack_after_stops = any(isinstance(x, a.UntrackElection) for x in actions) and any(
            isinstance(x, a.StopWorkers) and x.peers for x in actions
        )
        queued = False
        for action in actions:
            if isinstance(action, LONG_ACTIONS):
                job.leading.queue.append(action)
                queued = True
            elif isinstance(action, a.StopWorkers):
                self._stop_workers(job, action, untrack_after_stops)
            elif isinstance(action, a.UntrackElection):
                if not untrack_after_stops:
                    self.m.untrack(job)
            else:
                self._quick(job, action)
        if queued:
            job.poke()

    def _quick(self, job: Job, action: a.Action) -> None:
        m = self.m
        if isinstance(action, a.Announce):
            m.announce_to_new_peers(job)
        elif isinstance(action, a.TrackElection):
            m.track(job, list(action.members), list(action.ranking))
        elif isinstance(action, a.CancelStart):
            job.leading.queue.clear()  # what was queued belongs to the plan being cut short
            if job.leading.start_scope is not None:
                job.leading.start_scope.cancel()
        elif isinstance(action, a.StartRecovery):
            self._start_recovery(job, action)
        elif isinstance(action, a.Commit):
            m.spawn(m.commits.commit, job, action)
        elif isinstance(action, a.SyncStandby):
            shards = job.leading.committed_shards.get(action.step, {})
            m.spawn(
                m.standbys.sync_standby,
                job,
                action.step,
                tuple(name for peer, name in sorted(shards.items()) if peer != job.standby),
            )
        elif isinstance(action, a.Export):
            m.spawn(self._export_committed, job, action.step)
        elif isinstance(action, a.Pause):
            log.warning("job %s: paused: %s", job.job_id, action.reason)
        elif isinstance(action, a.Resume):
            log.info("job %s: capacity returned; planning again", job.job_id)
        elif isinstance(action, a.PrepareTakeover):
            m.spawn(m.take_over, job)
        elif isinstance(action, a.HandOver):
            m.spawn(m.joining.hand_over, job, action.leader)
        elif isinstance(action, a.DropReplica):
            m.drops.drop(job, action)
        elif isinstance(action, a.ReleaseHold):
            m.spawn(m.regrow.release, job)
        elif isinstance(action, a.Exclude):
            log.warning("job %s: member %s excluded: %s", job.job_id, action.peer[:12], action.reason)
            job.leading.excluded.setdefault(action.peer, f"member {action.peer} excluded: {action.reason}"[:300])
        elif isinstance(action, a.Persist):
            m.persist(job)
        elif isinstance(action, a.Finish):
            if action.error:
                log.warning("job %s: %s: %s", job.job_id, action.state.value, action.error)
            else:
                log.info("job %s: %s", job.job_id, action.state.value)
            if action.state == JobState.DONE and job.role == Role.OWNER:
                self._record_timing(job)
            job.finished.set()
            job.poke()
        # Refuse and LetWorkerGo answer the message that caused them: the handler that fed it carries them out.

    def _record_timing(self, job: Job) -> None:
        """What the job's start, end and steps took on this daemon, kept for its quotes
        (:mod:`arceusd.market.timings`)."""
        timing = job_timing(job, time.time())
        if timing is None:
            return
        try:
            record_timing(self.m.node.paths.root, timing)
        except OSError as exc:
            log.warning("job %s: cannot keep its timings for the quote: %s", job.job_id, exc)

    # ------------------------------------------------------------------------------------------ the leader loop's
    async def run_queue(self, job: Job) -> None:
        """Run the queued long actions in order while this device leads the job."""
        m = self.m
        while job.leading.queue and m.leads(job) and not job.core.terminal:
            action = job.leading.queue.popleft()
            if isinstance(action, a.Plan):
                await m.starting.plan(job)
            elif isinstance(action, a.SendStart):
                await m.starting.start(job, action)
            elif isinstance(action, a.SendGo):
                await m.starting.go_round(job, action)
            elif isinstance(action, a.RecoveryCause):
                self._recovery_cause(job, action)
            elif isinstance(action, a.CheckReachable):
                await self._check_reachable(job, action)
            elif isinstance(action, a.Regrow):
                await m.regrow.regrow(job, action)

    def _start_recovery(self, job: Job, action: a.StartRecovery) -> None:
        """A repartition begins: record it (the same incident keeps its start), forget the old plan."""
        log.warning("job %s: repartitioning: %s", job.job_id, action.reason)
        recovery = Recovery(action.reason, action.epoch, job.step)
        previous = job.leading.recoveries[-1] if job.leading.recoveries else None
        if previous is not None and previous.first_step_after_s is None:  # the same incident, another attempt
            recovery.began, recovery.began_at = previous.began, previous.began_at
            recovery.lost_step = previous.lost_step
        job.leading.recoveries.append(recovery)
        job.plan, job.replica_plan, job.leading.reports = None, None, {}
        job.leading.witnesses, job.leading.complete, job.leading.go_addresses = {}, {}, {}

    def _recovery_cause(self, job: Job, action: a.RecoveryCause) -> None:
        log.warning("job %s: repartitioning: %s", job.job_id, action.reason)
        last = job.leading.recoveries[-1] if job.leading.recoveries else None
        if last is not None and last.first_step_after_s is None:
            last.reason = action.reason

    async def _check_reachable(self, job: Job, action: a.CheckReachable) -> None:
        """The old plan's members are asked with a handshake, whatever membership says right now (a worker's
        broken link is faster than membership). A member that joined since (not in the old plan) is kept while
        membership sees it live: it asked to join moments ago, and a daemon that just restarted can be too busy
        to answer a handshake in time, while a leader that is not the owner could never invite it back (only
        the owner announces jobs). If it then fails to start, the next restart drops it."""
        m = self.m
        live = {
            p for p, mem in m.peers.membership.members.items() if mem.state in (MemberState.ALIVE, MemberState.SUSPECT)
        }
        reachable = await self.reachable(job, [p for p in job.members if p in action.peers])
        reachable |= {p for p in job.members if p not in action.peers and p in live}
        self.feed(job, e.MembersReachable(action.stamp, frozenset(reachable)))

    async def reachable(self, job: Job, peers: list[str], timeout: float = 1.0) -> set[str]:
        """The members among ``peers`` whose daemon answers a handshake within ``timeout`` (and ourselves)."""
        me = self.m.node.identity.peer_id
        answered = {me}

        async def probe(peer: str) -> None:
            offer = job.members.get(peer)
            if offer is not None and await self.m.peers.hello(offer.address, timeout) is not None:
                answered.add(peer)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                if peer != me:
                    nursery.start_soon(probe, peer)
        return answered

    # ------------------------------------------------------------------------------------------ workers
    def _stop_workers(self, job: Job, action: a.StopWorkers, untrack: bool) -> None:
        """Detach this device's worker now (a newer plan's must not be the one stopped) and stop it; tell
        ``action.peers`` (the live ones) the plan stopped, then leave the election when the job ended."""
        m = self.m
        if action.local:
            worker, job.worker = job.worker, None
            if worker is not None:
                stopped = job.local_stopped = trio.Event()

                async def stop_local() -> None:
                    try:
                        await worker.stop(grace=0.5)
                    finally:
                        stopped.set()

                m.spawn(stop_local)
        alive = m.peers.alive_peers()
        peers = [
            (p, job.members[p].address) for p in action.peers if p in job.members and (p in alive or job.core.terminal)
        ]
        if not peers and not untrack:
            return
        stop = JobStop(job.job_id, action.stamp.term, action.reason)

        async def tell() -> None:
            async with trio.open_nursery() as nursery:
                for peer, address in peers:
                    nursery.start_soon(self._send_stop, job, peer, stop, address)
            if untrack:
                m.untrack(job)

        m.spawn(tell)

    async def _send_stop(self, job: Job, peer: str, stop: JobStop, address: str) -> None:
        await self.m.peers.request(
            address, peer, stop, timeout=STOP_TIMEOUT_S, job_id=job.job_id, term=stop.term, epoch=job.epoch
        )

    # ------------------------------------------------------------------------------------------ the end
    async def _export_committed(self, job: Job, step: int) -> None:
        """The final checkpoint is committed: hand it to the owner when this leader is not the owner, then
        assemble the model here."""
        names = sorted(job.leading.committed_shards.get(step, {}).values())
        await self.m.standbys.sync_owner(job, step, names)
        folder = step_dir(job.paths.checkpoints, step)
        await self.export(job, step, [folder / name for name in names])

    async def export(self, job: Job, step: int, paths: list[Path]) -> None:
        """Assemble the model from the shards at ``paths`` (in a child process); the core ends the job."""
        data = leader_data(job)
        # a character job's vocabulary comes from its text, a stock LM's export carries its tokenizer.json
        vocab = str(data["path"]) if data.get("kind") == "text" else data.get("tokenizer")
        weights = job_weights(job)  # a LoRA job's merged export rebuilds its base (the owner's file, or a copy)
        try:
            path = await filework.export_model(job.directory, job.spec_bytes, job.job_id, step, paths, vocab, weights)
        except Exception as exc:
            self.feed(job, e.ExportFailed(str(exc)))
            return
        job.model_path = str(path)
        log.info("job %s: model saved to %s", job.job_id, path)
        self.feed(job, e.ExportDone(str(path)))


__all__ = ["LONG_ACTIONS", "STOP_TIMEOUT_S", "Driver"]
