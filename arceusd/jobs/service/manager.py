"""Jobs in the daemon: the service that owns, leads or serves each job this device takes part in.

Roles: the *owner* submitted the job (it holds the data and gets the model); *members* joined it; the job's
*leader* (the owner while it lives, else the plan's *standby* the job's election made leader) coordinates planning,
starting, checkpoint commits and repartitions, serves the data and signs the checkpoints. Each repartition starts a
new term and plan epoch; every leader command carries (job, term, epoch) and members refuse older ones and any
sender that is neither their leader nor the election's winner of a newer term. The whole flow (submit, announce,
join, plan, start, go, checkpoints, export, done; recovery, replicas dropped and rebuilt, the takeover, the owner's
hand-over and its copy of the final checkpoint) is mapped once, in docs/ARCHITECTURE.md, "A job's life".

Every decision is the job core's (:mod:`arceusd.jobs.core`: a pure state machine per job, fed events,
returning actions); this module is its trio driver: the service (:meth:`JobManager.run`, restoring owned jobs
after a restart), the leader's loop (tell the core time passed, run the long actions it queued one at a time,
wait on the job's wake), and the events membership and the election bring (member changes, a new leader, the
standby's takeover). :mod:`arceusd.jobs.service.driver` feeds the core and carries out its actions. The rest lives
beside it, composed: this is the composition root. Each part is handed a port of its own (issue 32: ports, not
back-pointers), a frozen dataclass declared beside the part holding exactly what it calls (``LocalWorkerPorts``,
``ReportIntakePorts``, ``StartingPorts``, ...; the shared shapes in :mod:`arceusd.jobs.common.ports`), which
:meth:`JobManager.__init__` builds from its own methods, the node and the other parts; no part holds the manager.
The parts, in the order ``__init__`` builds them (each group a method, the attribute each is kept in):

- the leader's parts of a running job (``_leader_running``): :mod:`arceusd.jobs.leader.speed_checks` (``speed``),
  :mod:`arceusd.jobs.leader.report_intake` (``intake``: members' reports, this device's own too),
  :mod:`arceusd.jobs.leader.commits` (``commits``), :mod:`arceusd.jobs.leader.standby_sync` (``standbys``: the
  standby's and the owner's copies sent), :mod:`arceusd.jobs.leader.replica_drop` (``drops``);
- the member's side (``_member_side``; it calls the leader's intake and speed checks for this device's own worker):
  :mod:`arceusd.jobs.member.local_worker` (``local``: this device's worker started, let go, stopped),
  :mod:`arceusd.jobs.member.speed_answers` (``answers``), :mod:`arceusd.jobs.member.standby_copy` (``copies``),
  :mod:`arceusd.jobs.member.replica_changes` (``replicas``), :mod:`arceusd.jobs.member.join` (``joiner``),
  :mod:`arceusd.jobs.member.link_echo` (a function);
- the leader's parts that form the plan's workers (``_leader_forming``; they call the member's side: this device's
  own worker, its join): :mod:`arceusd.jobs.leader.joining` (``joining``), :mod:`arceusd.jobs.leader.starting`
  (``starting``), :mod:`arceusd.jobs.leader.regrow` (``regrow``);
- the service: :mod:`arceusd.jobs.service.control_methods` (``control``: the control-socket methods ``submit``,
  ``join``, ``jobs``, ``job``, ``cancel``, ``leave``), :mod:`arceusd.jobs.service.lending` (``lending``),
  :mod:`arceusd.jobs.service.driver` (``driver``: feeding the job core and carrying out its actions, each part's
  handler registered in :meth:`JobManager._action_table`).

Shared by all: :mod:`arceusd.jobs.common.manager_base` (:class:`JobContext`, which the manager is: the state, the
nursery, this device's offer, whom it follows as leader) and :mod:`arceusd.jobs.common.transfers` (files between
daemons). :meth:`JobManager.run` registers who answers each peer message: the leader's, the member's, both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import ParamSpec, TypeVar

import trio

from arceusd.device.node import Node
from arceusd.jobs.common.manager_base import JobContext
from arceusd.jobs.common.ports import JoinResult
from arceusd.jobs.core import JobState, Role
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.leader.commits import Commits, CommitsPorts
from arceusd.jobs.leader.joining import Joining, JoiningPorts
from arceusd.jobs.leader.regrow import Regrowing, RegrowingPorts
from arceusd.jobs.leader.replica_drop import ReplicaDrops, ReplicaDropsPorts
from arceusd.jobs.leader.report_intake import ReportIntake, ReportIntakePorts
from arceusd.jobs.leader.speed_checks import SpeedCheckPorts, SpeedChecks
from arceusd.jobs.leader.standby_sync import StandbySyncing, StandbySyncingPorts
from arceusd.jobs.leader.starting import Starting, StartingPorts
from arceusd.jobs.member.join import Joiner, JoinerPorts
from arceusd.jobs.member.joins_in_flight import JoinsInFlight
from arceusd.jobs.member.link_echo import on_link_echo
from arceusd.jobs.member.local_worker import LocalWorker, LocalWorkerPorts, worker_device
from arceusd.jobs.member.replica_changes import ReplicaChanges, ReplicaChangesPorts
from arceusd.jobs.member.speed_answers import SpeedAnswers, SpeedAnswersPorts
from arceusd.jobs.member.standby_copy import StandbyCopies, StandbyCopiesPorts
from arceusd.jobs.plans.recovery import corrupt_shards
from arceusd.jobs.plans.standby import takeover_offers
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.known import owned_to_resume, read_records
from arceusd.jobs.service.control_methods import ControlMethods, ControlMethodsPorts
from arceusd.jobs.service.driver import ActionTable, Driver, DriverPorts
from arceusd.jobs.service.lending import LendingPorts, answerer, seen_lending
from arceusd.market import hooks
from arceusd.market.hooks import enough_memory
from arceusd.market.progress import job_cost
from arceusd.membership.events import MemberChanged, MemberState
from arceusd.network.peers import PeerService
from protocol.job_wire import (
    ChallengeGo,
    ChallengeOpen,
    DataRequest,
    JobDropReplica,
    JobGo,
    JobGrowReplica,
    JobReport,
    JobStart,
    JobStop,
    LinkEcho,
    ResumeRequest,
    ShardRequest,
    SpeedChallenge,
    StandbyHeld,
    StandbySync,
    WeightsRequest,
)
from protocol.lend_wire import LendQuery
from protocol.messages import JobAnnounce, JoinRequest

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

REJOIN_GRACE_S = 15.0
"""After the owner restarts, how long it waits for the job's old members to join again before planning."""

WAKE_BACKSTOP_S = 5.0
"""The longest the leader loop sleeps without being woken: a safety net, not the way it learns of changes."""


def _standby_shards(job: Job, step: int) -> tuple[str, ...]:
    """The committed shards of ``step`` the standby lacks (all but its own)."""
    shards = job.leading.commits.committed_shards.get(step, {})
    return tuple(name for peer, name in sorted(shards.items()) if peer != job.standby)


class JobManager(JobContext):
    """Every job this daemon knows: the service, and the lifecycle of the jobs it owns or leads. The parts are
    composed, each handed its port, built in ``__init__`` in three groups (the module docstring maps them): the
    leader's parts of a running job, the member's side, the leader's parts that form the plan's workers."""

    def __init__(self, node: Node, peers: PeerService) -> None:
        super().__init__(node, peers)
        self.life = self
        me = node.identity.peer_id
        self.joins = JoinsInFlight()  # this device's joins not yet settled: a start that overtakes one waits
        self._leader_running(node)  # what a running job's members (this device's own worker too) report to
        self._member_side(node)  # this device as a member (its worker's reports and steps go to the parts above)
        self._leader_forming(node)  # joins, plan and start, a rebuild (they call the member's side: this device's)
        self.lending = LendingPorts(node, peers, self.offer)  # what this device and its peers lend
        self.control = ControlMethods(
            ControlMethodsPorts(
                me,
                node.addresses,
                self.jobs,
                self.root,
                self.feed,
                self.leads,
                self.spawn,
                self.offer,
                self.find,
                self.listing,
                self.persist,
                self.lead,
                self.join,
                partial(seen_lending, self.lending),
                partial(job_cost, node),
                peers,
            )
        )
        self.driver = Driver(
            DriverPorts(peers, self.persist, self.spawn, self.leads, self.untrack),
            self._action_table(),
            me,
            node.paths.root,
            self.standbys.sync_owner,
        )
        self._ready = trio.Event()  # set once the job modules are imported and owned jobs restored

    def _leader_running(self, node: Node) -> None:
        """The leader's parts of a running job: speed checks, report intake, commits, the standby's and the owner's
        syncs, replica drops."""
        me, peers, transfers = node.identity.peer_id, self.peers, self.transfers
        self.speed = SpeedChecks(
            SpeedCheckPorts(
                me,
                self.leads,
                self.spawn,
                self.offer,
                peers,
                node.config.worker_threads,
                partial(hooks.wants_timing, node),
            )
        )
        self.intake = ReportIntake(
            ReportIntakePorts(
                me,
                self.jobs,
                self.feed,
                self.request_restart,
                self.leads,
                self.spawn,
                transfers.fetch_shard,
                self.speed.judge,
            )
        )
        self.commits = Commits(
            CommitsPorts(
                me,
                node.identity,
                self.feed,
                self.request_restart,
                self.leads,
                transfers.fetch_shard,
                partial(hooks.on_commit, node),
            )
        )
        self.standbys = StandbySyncing(StandbySyncingPorts(me, self.jobs, self.feed, self.leads, peers))
        self.drops = ReplicaDrops(ReplicaDropsPorts(me, self.feed, self.request_restart, self.spawn, peers))

    def _member_side(self, node: Node) -> None:
        """This device as a member: its stage worker, its answers to speed challenges, the standby's copies, the
        leader's replica changes taken in, announcements and joins."""
        me, peers, transfers = node.identity.peer_id, self.peers, self.transfers
        self.local = LocalWorker(
            LocalWorkerPorts(
                me,
                self.jobs,
                self.feed,
                self.leads,
                self.spawn,
                self.offer,
                self.check_leader,
                self.commanded,
                self.drop_own_worker,
                self.track,
                transfers.fetch_resume,
                transfers.fetch_weights,
                peers,
                node.addresses,
                node.paths.root,
                node.config,
                self.intake.take,
                self.speed.on_step,
                self.joins,
            )
        )
        self.answers = SpeedAnswers(
            SpeedAnswersPorts(self.spawn, self.offer, self.commanded, node.config.worker_threads)
        )
        self.copies = StandbyCopies(
            StandbyCopiesPorts(
                me,
                self.jobs,
                self.feed,
                self.leads,
                self.spawn,
                self.check_leader,
                self.export,
                self.standby_ready,
                transfers,
                peers,
            )
        )
        self.replicas = ReplicaChanges(ReplicaChangesPorts(me, self.feed, self.commanded))
        self.joiner = Joiner(
            JoinerPorts(
                me,
                self.jobs,
                self.root,
                node.config.auto_join,
                self.feed,
                self.spawn,
                self.offer,
                peers,
                partial(hooks.may_auto_join, node),
                self.joins,
            )
        )

    def _leader_forming(self, node: Node) -> None:
        """The leader's parts that form the plan's workers: joins answered and the owner's hand-over (it joins as a
        member does), plan and start (this device's own worker too), a dropped replica rebuilt."""
        me, peers = node.identity.peer_id, self.peers
        self.joining = Joining(
            JoiningPorts(
                me,
                self.jobs,
                self.feed,
                self.leads,
                self.follow_leader,
                peers,
                partial(hooks.join_refusal, node),
                self.joiner.request_join,
            )
        )
        self.starting = Starting(
            StartingPorts(
                me, self.feed, self.spawn, peers, self.local.start_worker, self.local.go, self.commits.repair_checkpoint
            )
        )
        self.regrow = Regrowing(RegrowingPorts(me, self.feed, peers, self.transfers.grown, self.starting.send_go))

    def _action_table(self) -> ActionTable:
        """Who carries out the core's actions (the driver adds its own): each part registered here, the one
        place that knows them all."""
        table, spawn = ActionTable(), self.spawn
        table.on(a.Announce, lambda job, _: self.announce_to_new_peers(job))
        table.on(a.TrackElection, lambda job, x: self.track(job, list(x.members), list(x.ranking)))
        table.on(a.Commit, lambda job, x: spawn(self.commits.commit, job, x))
        table.on(
            a.SyncStandby, lambda job, x: spawn(self.standbys.sync_standby, job, x.step, _standby_shards(job, x.step))
        )
        table.on(a.PrepareTakeover, lambda job, _: spawn(self.take_over, job))
        table.on(a.HandOver, lambda job, x: spawn(self.joining.hand_over, job, x.leader))
        table.on(a.DropReplica, self.drops.drop)
        table.on(a.ReleaseHold, lambda job, _: spawn(self.regrow.release, job))
        table.on_long(a.Plan, lambda job, _: self.starting.plan(job))
        table.on_long(a.SendStart, self.starting.start)
        table.on_long(a.SendGo, self.starting.go_round)
        table.on_long(a.Regrow, self.regrow.regrow)
        return table

    async def _load_modules(self) -> None:
        """Restore the jobs this device owns (:func:`arceusd.jobs.record.known.owned_to_resume`). The job modules are
        torch-free (tensor work runs in child processes, :mod:`arceusd.jobs.procs.filework`), so nothing here stalls
        the event loop on an import."""
        self.known = await trio.to_thread.run_sync(read_records, self.root)  # (arceusd.jobs.record.known)
        me, address = self.node.identity.peer_id, self.node.addresses.get("peer", "")
        for job in await trio.to_thread.run_sync(owned_to_resume, self.root, me, address, REJOIN_GRACE_S):
            self.jobs[job.job_id] = job
            job.offers[me] = await self.offer()
            self.spawn(self.lead, job)
            log.info(
                "job %s (%s): resuming as its owner from step %d (term %d)",
                job.job_id,
                job.spec.name,
                job.committed_step,
                job.term,
            )
        self._ready.set()

    def _gated(self, handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        """``handler``, answering once the owned jobs are restored."""

        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            await self._ready.wait()
            return await handler(*args, **kwargs)

        return wrapper

    # ---------------------------------------------------------------------------------------------- service
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        peers, gate = self.peers, self._gated
        # what the leader (or the owner) receives
        peers.register(JoinRequest, gate(self.joining.on_join_request))
        peers.register(JobReport, gate(self.intake.on_report))
        peers.register(StandbyHeld, gate(self.standbys.on_standby_held))
        # what a member (or a peer the owner announces to) receives
        peers.register(JobAnnounce, gate(self.joiner.on_announce))
        peers.register(LinkEcho, partial(on_link_echo, peers))
        peers.register(JobStart, gate(self.local.on_start))
        peers.register(JobGo, gate(self.local.on_go))
        peers.register(JobStop, gate(self.local.on_stop))
        peers.register(JobDropReplica, gate(self.replicas.on_drop))
        peers.register(JobGrowReplica, gate(self.replicas.on_grow))
        peers.register(SpeedChallenge, gate(self.answers.on_challenge))
        peers.register(ChallengeGo, gate(self.answers.on_go))
        peers.register(ChallengeOpen, gate(self.answers.on_open))
        peers.register(StandbySync, gate(self.copies.on_standby_sync))
        # files, both ways (arceusd.jobs.common.transfers), and what this device lends (arceusd.jobs.service.lending)
        peers.register(ShardRequest, gate(self.transfers.on_shard_request))
        peers.register(ResumeRequest, gate(self.transfers.on_resume_request))
        peers.register(DataRequest, gate(self.transfers.on_data_request))
        peers.register(WeightsRequest, gate(self.transfers.on_weights_request))
        peers.register(LendQuery, gate(answerer(self.lending)))
        peers.listeners.append(self._on_member_changed)
        if self.node.elections is not None:
            self.node.elections.on_leader_change(self._on_leader_change)
        self.node.methods.update({name: gate(method) for name, method in self.control.methods().items()})
        self.node.sections["jobs"] = self.listing
        self.node.sections["announcements"] = self.joiner.announced.summary
        self.node.sections["transfers"] = self.transfers.counters
        self.node.shutdown_hooks.append(self._stop_all_workers)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._load_modules)
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._stop_all_workers()

    async def _stop_all_workers(self) -> None:
        for job in self.jobs.values():
            if job.worker is not None:
                await job.worker.stop(grace=2.0)

    # ---------------------------------------------------------------------------------------------- leader
    async def lead(self, job: Job) -> None:
        """The leader's loop for one job: tell the core time passed (it plans when enough members joined, and
        the owner announces to new peers), run the long actions it queued (plan, start, ``go``, the check of
        who answers before a repartition) one at a time, and wait. It waits on ``job.wake``, which what concerns
        the loop sets (:meth:`Job.poke`: a join, a queued action, a leader change, a peer alive, the end), or
        until the owner's rejoin grace ends; :data:`WAKE_BACKSTOP_S` bounds what a missed wake could cost."""
        try:
            while not job.core.terminal and self.leads(job):
                job.wake = trio.Event()
                self.feed(job, e.Tick(memory_ok=enough_memory(job)))  # needs.memory_total_mib (market)
                if job.leading.loop.queue:
                    await self.driver.run_queue(job)
                    continue
                deadline = time.monotonic() + WAKE_BACKSTOP_S
                lead = job.core.lead
                if lead is not None and lead.gather_until and job.state in (JobState.WAITING, JobState.PAUSED):
                    deadline = min(deadline, lead.gather_until)
                with trio.move_on_at(trio.current_time() + max(0.0, deadline - time.monotonic())):
                    await job.wake.wait()
        finally:
            job.leading.loop.queue.clear()  # a device that stops leading carries out nothing of the old leader's plan

    def feed(self, job: Job, event: e.Event) -> list[a.Action]:
        """Hand ``job``'s core an event and carry out what it answers (:class:`arceusd.jobs.service.driver.Driver`)."""
        return self.driver.feed(job, event)

    def announce_to_new_peers(self, job: Job) -> None:
        alive = self.peers.alive_peers()
        for peer in job.core.to_announce(list(alive)):
            self.spawn(self.joining.announce, job, peer, alive[peer])

    def request_restart(self, job: Job, reason: str) -> None:
        """Ask the core to repartition ``job`` (a leader's; the first reason wins until the new plan runs)."""
        self.feed(job, e.RestartAsked(reason))

    async def join(self, job: Job) -> JoinResult:
        return await self.joiner.join(job)

    # ---------------------------------------------------------------------------------------------- takeover
    def _on_leader_change(self, job_id: str, leader: tuple[str, int] | None) -> None:
        """The job's election chose a leader: the standby takes over; a leader that lost steps down."""
        self.leader_changed(job_id)
        job = self.jobs.get(job_id)
        if job is None or leader is None or job.core.terminal:
            return
        me, (peer, term) = self.node.identity.peer_id, leader
        if peer == me and not self.leads(job):
            if not self.feed(job, e.TakeoverElected(term, self.holds_standby_copy(job))):
                log.warning(
                    "job %s: elected, but this device holds no checked copy of the data (or the initial weights); "
                    "not leading",
                    job_id,
                )
        elif peer != me and self.leads(job):
            log.warning("job %s: %s was elected leader (term %d); stepping down", job_id, peer[:12], term)
            self.feed(job, e.OtherElected(peer, term))
            self.follow_leader(job, peer)

    async def take_over(self, job: Job) -> None:
        """Standby elected after the leader died: gather the survivors and the newest intact checkpoint, then
        lead them from it (the core repartitions)."""
        me, old = self.node.identity.peer_id, job.leader
        if job.plan is None:
            return
        alive = self.peers.alive_peers()  # the members' offers as the leader last had them, at today's address
        old_plan = job.plan_peers()
        job.offers = takeover_offers(job.standby_offers, alive, old, me, job.spec.admission.admits)
        job.offers[me] = await self.offer()
        step, _ = await trio.to_thread.run_sync(corrupt_shards, job.paths.checkpoints, sorted(job.leaders))
        if self.leads(job) or job.leader != old or job.core.terminal:
            return  # led, or another leader was elected, meanwhile
        log.warning(
            "job %s: the leader %s is gone; taking over as its standby (from step %d)", job.job_id, old[:12], step
        )
        job.leader_address = self.node.addresses.get("peer", "")
        self.feed(job, e.TakeoverReady(frozenset(job.offers), step, tuple(p for p in old_plan if p != old)))
        self.spawn(self.lead, job)

    # ---------------------------------------------------------------------------------- checkpoints, the end
    async def export(self, job: Job, step: int, paths: list[Path]) -> None:
        await self.driver.export(job, step, paths)

    def _on_member_changed(self, change: MemberChanged) -> None:
        if change.state is MemberState.ALIVE and change.previous is not MemberState.ALIVE:
            for job in self.jobs.values():  # a peer new or back: the owner's leader loop announces the job to it
                if self.leads(job) and job.role == Role.OWNER and not job.core.terminal:
                    job.poke()
            return
        if change.state not in (MemberState.DEAD, MemberState.LEFT):
            return
        for job in list(self.jobs.values()):
            if self.leads(job):
                self.feed(job, e.MemberDead(change.peer, change.state.value))
            elif change.peer == job.leader and not job.core.terminal:
                self.feed(job, e.LeaderGone(change.state.value))


async def serve_jobs(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Daemon service: the job manager (needs the peer network service started first)."""
    if node.peers is None:
        raise RuntimeError("serve_jobs needs the peer network (serve_peer_network) to start first")
    manager = JobManager(node, node.peers)
    node.jobs = manager
    await manager.run(task_status=task_status)


__all__ = ["JobManager", "serve_jobs", "worker_device"]
