"""The job core's driver: feeds a job's :class:`arceusd.jobs.core.JobCore` the events the daemon sees and carries
out the actions it returns. Decisions are the core's; this module only moves bytes, files and timers.

:meth:`Driver.feed` hands the core one event and runs what it answers. Quick actions run at once (log, persist,
cancel a start in progress, detach and stop this device's worker, send stops, spawn a commit, the standby's sync
or the export, track or leave the election). Long ones that must not overlap (plan, start the workers, send
``go``, check which members answer before a repartition) are queued on the job (``job.leading.loop.queue``) and
run one at a time by the leader's loop (:meth:`Driver.run_queue`), each feeding back what came of it; a result of
an older plan is dropped by the core. ``Refuse`` and ``LetWorkerGo`` are answers for the handler that fed the
event: it finds them in the list :meth:`feed` returns.

Who carries out an action is looked up in an :class:`ActionTable` (issue 32: ports, not back-pointers): the
composition root (:class:`arceusd.jobs.service.manager.JobManager`) registers the parts' handlers (planning, starting
and ``go`` in :mod:`arceusd.jobs.leader.starting`; commits in :mod:`arceusd.jobs.leader.commits`; the standby's and
owner's copies in :mod:`arceusd.jobs.leader.standby_sync`; the hand-over in :mod:`arceusd.jobs.leader.joining`; replica
drops and rebuilds; announcing, the election and the take-over of the manager itself), the driver its own (recoveries,
the export in a child process: :func:`arceusd.jobs.procs.filework.export_model`, the end). Besides the table the driver
is handed only what it uses: this device's id and state folder, and its port (:class:`DriverPorts`, a frozen dataclass
the composition root builds): the peer service, and the manager's persist, spawn, leads and untrack.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from arceusd.files.checkpoint import step_dir
from arceusd.jobs.common.ports import Leads, Spawn
from arceusd.jobs.common.transfers import job_weights, leader_data
from arceusd.jobs.core import JobState, Role
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.procs import filework
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.leader_record import Recovery
from arceusd.market.timings import (
    JobTiming,
    machine_load,
    pause_of,
    pause_steps,
    record_timing,
    typical_step,
    warmup_of,
)
from arceusd.membership.events import MemberState
from protocol.job_wire import JobStop

if TYPE_CHECKING:
    from arceusd.network.peers import PeerService

log = logging.getLogger(__name__)


def job_timing(job: Job, now: float, import_wait_s: float = 0.0) -> JobTiming | None:
    """What an owned job that ended ``done`` at ``now`` took: submit to its first step (of it, ``import_wait_s`` its
    worker waited for the fork server to import torch, counted on the daemon's first job only: the server starts
    with it), its last commit to done, its typical step over the plan's prediction (None: a restored job, one that
    recovered, or one that never stepped or committed here: its figures are not a plain run's)."""
    checkpoints = job.leading.commits.checkpoints
    if (
        job.leading.loop.recoveries
        or not job.first_step_at
        or not checkpoints
        or not job.history
        or job.history[0][0] != 1
    ):
        return None  # (a restored job resumes past step 1)
    rp = job.replica_plan
    predicted = rp.predicted_step_time_s if rp is not None else 0.0
    points = [(s, at) for (s, _), at in zip(job.history, job.history_at, strict=False)]
    t = job.spec.training  # the steps after which a checkpoint or an evaluation ran, before the last
    pauses = pause_steps(t.steps, job.spec.checkpoint.interval_steps, t.eval_interval_steps)
    step = typical_step(points, pauses)
    ratio = step / predicted if predicted > 0 else 0.0
    return JobTiming(
        type(job.spec.model).__name__,
        round(job.first_step_at - job.created + warmup_of(points, step, pauses), 3),  # before its typical pace
        round(max(now - checkpoints[-1][1], 0.0), 3),
        job.first_of_daemon,
        round(ratio, 4),
        round(now, 3),
        round(predicted, 6),
        len(job.plan_peers()),
        slowest_link(job.leading.loop.links),
        round(pause_of(points, step, pauses), 4),
        machine_load(),
        tuple(
            (peer, round(o.flops_per_s / max(job.leading.speed.discounts.get(peer, 1.0), 1.0), 1), o.block_efficiency)
            for peer, o in sorted(job.members.items())
            if peer != job.core.me  # (a spare too: the plan left it out for its speed)
        ),
        import_wait_s if job.first_of_daemon else 0.0,
    )


def slowest_link(links: dict[str, dict[str, float]]) -> tuple[float, float, float]:
    """The slowest of the links a leader measured to its members (``job.leading.loop.links``: ms, MB/s, ms) as
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


QuickHandler = Callable[[Job, Any], None]
"""Carries out one action at once (it may spawn a task): ``(job, action)``."""
LongHandler = Callable[[Job, Any], Awaitable[None]]
"""Carries out one long action from the leader's loop, to its end: ``(job, action)``."""


@dataclass
class ActionTable:
    """Who carries out each of the core's actions: ``quick`` ones at once, ``long`` ones (:data:`LONG_ACTIONS`)
    one at a time from the leader's loop. An action with no handler is one the driver or the caller of
    :meth:`Driver.feed` answers itself (``StopWorkers``, ``UntrackElection``, ``Refuse``, ``LetWorkerGo``)."""

    quick: dict[type[a.Action], QuickHandler] = field(default_factory=dict)
    long: dict[type[a.Action], LongHandler] = field(default_factory=dict)

    def on(self, kind: type[a.Action], handler: QuickHandler) -> None:
        if kind in self.quick or kind in self.long:
            raise ValueError(f"{kind.__name__} has a handler already (a bug: one part carries out each action)")
        self.quick[kind] = handler

    def on_long(self, kind: type[a.Action], handler: LongHandler) -> None:
        if kind in self.quick or kind in self.long or kind not in LONG_ACTIONS:
            raise ValueError(f"{kind.__name__} is not a long action without a handler (a bug)")
        self.long[kind] = handler


@dataclass(frozen=True)
class DriverPorts:
    """What the driver uses of the job manager besides the action table, built by the composition root (issue 32:
    a port, not the manager): the peer service (the handshake of who answers, the stops) and the manager's own
    bookkeeping."""

    peers: PeerService
    persist: Callable[[Job], None]
    """The job's durable record written."""
    spawn: Spawn
    leads: Leads
    untrack: Callable[[Job], None]
    """Leave the job's election."""


class Driver:
    """Carries out a job core's actions for the manager (see the module docstring)."""

    def __init__(
        self,
        ports: DriverPorts,
        table: ActionTable,
        me: str,
        state_root: Path,
        sync_owner: Callable[[Job, int, list[str]], Awaitable[None]],
    ) -> None:
        """``me``: this device's peer id; ``state_root``: its state folder (the quote's timings);
        ``sync_owner``: hands the owner a final checkpoint it lacks (:mod:`arceusd.jobs.leader.standby_sync`)."""
        self.ports, self.me, self.state_root, self.sync_owner = ports, me, state_root, sync_owner
        self.table = table
        table.on(a.CancelStart, self._cancel_start)
        table.on(a.StartRecovery, self._start_recovery)
        table.on(a.Export, lambda job, action: ports.spawn(self._export_committed, job, action.step))
        table.on(a.Pause, lambda job, action: log.warning("job %s: paused: %s", job.job_id, action.reason))
        table.on(a.Resume, lambda job, _: log.info("job %s: capacity returned; planning again", job.job_id))
        table.on(a.Exclude, self._exclude)
        table.on(a.Persist, lambda job, _: ports.persist(job))
        table.on(a.Finish, self._finish)
        table.on(a.RecoveryCause, self._recovery_cause)  # (was dropped unrun: run_queue never got it)
        table.on_long(a.CheckReachable, self._check_reachable)

    # ------------------------------------------------------------------------------------------ feeding
    def feed(self, job: Job, event: e.Event) -> list[a.Action]:
        """Hand ``job``'s core ``event`` (now), carry out what it answers; the actions, for the caller's
        answers (``Refuse``, ``LetWorkerGo``)."""
        before = (job.role, job.state)
        out = job.core.handle(event, time.monotonic())
        self.execute(job, out)
        if job.role != Role.OWNER and (job.role, job.state) != before:
            self.ports.persist(job)  # a member's record of the job (arceusd.jobs.record.known): listed after a restart
        return out

    def execute(self, job: Job, actions: list[a.Action]) -> None:
        untrack_after_stops = any(isinstance(x, a.UntrackElection) for x in actions) and any(
            isinstance(x, a.StopWorkers) and x.peers for x in actions
        )
        queued = False
        for action in actions:
            if isinstance(action, LONG_ACTIONS):
                job.leading.loop.queue.append(action)
                queued = True
            elif isinstance(action, a.StopWorkers):
                self._stop_workers(job, action, untrack_after_stops)
            elif isinstance(action, a.UntrackElection):
                if not untrack_after_stops:
                    self.ports.untrack(job)
            else:
                self._quick(job, action)
        if queued:
            job.poke()

    def _quick(self, job: Job, action: a.Action) -> None:
        handler = self.table.quick.get(type(action))
        if handler is not None:
            handler(job, action)
        # Refuse and LetWorkerGo answer the message that caused them: the handler that fed it carries them out.

    def _cancel_start(self, job: Job, _: a.CancelStart) -> None:
        job.leading.loop.queue.clear()  # what was queued belongs to the plan being cut short
        if job.leading.loop.start_scope is not None:
            job.leading.loop.start_scope.cancel()

    def _exclude(self, job: Job, action: a.Exclude) -> None:
        log.warning("job %s: member %s excluded: %s", job.job_id, action.peer[:12], action.reason)
        job.leading.checks.excluded.setdefault(action.peer, f"member {action.peer} excluded: {action.reason}"[:300])

    def _finish(self, job: Job, action: a.Finish) -> None:
        if action.error:
            log.warning("job %s: %s: %s", job.job_id, action.state.value, action.error)
        else:
            log.info("job %s: %s", job.job_id, action.state.value)
        if action.state == JobState.DONE and job.role == Role.OWNER:
            self._record_timing(job)
        job.finished.set()
        job.poke()

    def _record_timing(self, job: Job) -> None:
        """What the job's start, end and steps took on this daemon, kept for its quotes
        (:mod:`arceusd.market.timings`)."""
        timing = job_timing(job, time.time(), warm_starts().import_wait_s)
        if timing is None:
            return
        try:
            record_timing(self.state_root, timing)
        except OSError as exc:
            log.warning("job %s: cannot keep its timings for the quote: %s", job.job_id, exc)

    # ------------------------------------------------------------------------------------------ the leader loop's
    async def run_queue(self, job: Job) -> None:
        """Run the queued long actions in order while this device leads the job."""
        while job.leading.loop.queue and self.ports.leads(job) and not job.core.terminal:
            action = job.leading.loop.queue.popleft()
            handler = self.table.long.get(type(action))
            if handler is not None:
                await handler(job, action)

    def _start_recovery(self, job: Job, action: a.StartRecovery) -> None:
        """A repartition begins: record it (the same incident keeps its start), forget the old plan."""
        log.warning("job %s: repartitioning: %s", job.job_id, action.reason)
        recovery = Recovery(action.reason, action.epoch, job.step)
        previous = job.leading.loop.recoveries[-1] if job.leading.loop.recoveries else None
        if previous is not None and previous.first_step_after_s is None:  # the same incident, another attempt
            recovery.began, recovery.began_at = previous.began, previous.began_at
            recovery.lost_step = previous.lost_step
        job.leading.loop.recoveries.append(recovery)
        job.plan, job.replica_plan, job.leading.commits.reports = None, None, {}
        job.leading.commits.witnesses, job.leading.commits.complete, job.leading.loop.go_addresses = {}, {}, {}
        job.leading.commits.outer_witnesses = {}

    def _recovery_cause(self, job: Job, action: a.RecoveryCause) -> None:
        log.warning("job %s: repartitioning: %s", job.job_id, action.reason)
        last = job.leading.loop.recoveries[-1] if job.leading.loop.recoveries else None
        if last is not None and last.first_step_after_s is None:
            last.reason = action.reason

    async def _check_reachable(self, job: Job, action: a.CheckReachable) -> None:
        """The old plan's members are asked with a handshake, whatever membership says right now (a worker's
        broken link is faster than membership). A member that joined since (not in the old plan) is kept while
        membership sees it live: it asked to join moments ago, and a daemon that just restarted can be too busy
        to answer a handshake in time, while a leader that is not the owner could never invite it back (only
        the owner announces jobs). If it then fails to start, the next restart drops it."""
        m = self.ports
        live = {
            p for p, mem in m.peers.membership.members.items() if mem.state in (MemberState.ALIVE, MemberState.SUSPECT)
        }
        reachable = await self.reachable(job, [p for p in job.members if p in action.peers])
        reachable |= {p for p in job.members if p not in action.peers and p in live}
        self.feed(job, e.MembersReachable(action.stamp, frozenset(reachable)))

    async def reachable(self, job: Job, peers: list[str], timeout: float = 1.0) -> set[str]:
        """The members among ``peers`` whose daemon answers a handshake within ``timeout`` (and ourselves)."""
        me = self.me
        answered = {me}

        async def probe(peer: str) -> None:
            offer = job.members.get(peer)
            if offer is not None and await self.ports.peers.hello(offer.address, timeout) is not None:
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
        m = self.ports
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
        await self.ports.peers.request(
            address, peer, stop, timeout=STOP_TIMEOUT_S, job_id=job.job_id, term=stop.term, epoch=job.epoch
        )

    # ------------------------------------------------------------------------------------------ the end
    async def _export_committed(self, job: Job, step: int) -> None:
        """The final checkpoint is committed: hand it to the owner when this leader is not the owner, then
        assemble the model here."""
        names = sorted(job.leading.commits.committed_shards.get(step, {}).values())
        await self.sync_owner(job, step, names)
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


__all__ = ["LONG_ACTIONS", "STOP_TIMEOUT_S", "ActionTable", "Driver", "DriverPorts", "LongHandler", "QuickHandler"]
