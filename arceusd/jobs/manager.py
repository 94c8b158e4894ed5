"""Jobs in the daemon: the lifecycle and leadership of each job this device owns, leads or serves.

Roles: the *owner* submitted the job (it holds the data and gets the model); *members* joined it. The job's
*leader* coordinates planning, starting, checkpoint commits and repartitions; it serves the data and signs the
checkpoints. The owner leads while it lives. Each plan names a *standby* member, which receives the data set
once and, after every commit, the signed manifest and the other workers' shards. The job's election
(:mod:`arceusd.election`, the leader ranked first, the standby second) lets the standby win a new term once
membership declares the leader dead and a majority of the plan agrees; it then leads (:meth:`JobManager._take_over`):
gathers the survivors' shards, re-slices, and carries on to the end (the model is saved on it). Without a
majority, or without a standby that holds the data, the members pause until the owner returns. An owner that
returns after its standby took over is told by its members who leads (:data:`HANDED_OVER`) and joins that leader
as a member; so is an owner that membership declared dead while it lived (a stall under load): its members refuse
its commands naming the leader they follow (:mod:`arceusd.jobs.leadership`), and it joins that leader instead of
repartitioning until the job fails. Either way the leader hands the owner the final checkpoint and the owner
exports the model too (it is the user's).
Each repartition starts a new term and plan epoch; every leader command carries (job, term, epoch) and members
refuse older ones and any sender that is neither their leader nor the election's winner of a newer term.

Lifecycle (owner): ``waiting`` (announce to every live peer, collect joins until ``min_members``) ->
``planning`` (partitioner over the members' offers; no fit -> back to ``waiting`` with the reason) ->
``starting`` (every member verifies the plan and starts its worker) -> ``running`` (workers train; checkpoint
shards are reported, copied to the owner and committed under a signed manifest) -> ``done`` (the model is
exported on the owner) or ``failed`` with a message.

Recovery: a plan member found dead or leaving (membership), or a worker lost or failing, makes the leader
``recovering``: stop the old workers, plan over the live members, re-slice the newest verified checkpoint for
the new plan (:mod:`arceusd.jobs.recovery`), and start again from that step: nothing skipped, nothing applied
twice. If the live members cannot hold the model the job is ``paused`` and resumes when capacity returns. A device
that joins a running job gets work at the next committed checkpoint (a rebalance).

Nothing of a job spec is code: members parse the spec with :func:`arceusd.jobs.spec.spec_from_dict` (no files)
and recompute the plan before starting anything.

This module owns that orchestration: the service (:meth:`JobManager.run`, restoring owned jobs after a restart),
the leader's loop (gather, repartition, take over), member changes, exporting and finishing. The rest lives
beside it, composed (each part an object handed the shared context and the lifecycle it calls back into,
:class:`arceusd.jobs.manager_base.Lifecycle`):

- :mod:`arceusd.jobs.manager_base`: the shared state (:class:`JobContext`, which the manager is), the manager's
  nursery, this device's offer, and whom it follows as leader (the check of a leader's command);
- :mod:`arceusd.jobs.control_methods`: the control-socket methods (``submit``, ``join``, ``jobs``, ``job``,
  ``cancel``, ``leave``), ``JobManager.control``;
- :mod:`arceusd.jobs.local_worker`: starting and following this device's stage worker, and the workers' reports,
  ``JobManager.local``;
- :mod:`arceusd.jobs.standby_sync`: the leader's syncs to its standby and to the owner, ``JobManager.standbys``;
- :mod:`arceusd.jobs.commits`: committing checkpoints and repairing a damaged one, ``JobManager.commits``;
- :mod:`arceusd.jobs.joining`: announcements, joins and the owner's hand-over, ``JobManager.joining``;
- :mod:`arceusd.jobs.starting`: planning a plan epoch and starting it (start, ``go``), ``JobManager.starting``;
- :mod:`arceusd.jobs.transfers`: serving and fetching files between daemons (shards, resume slices, the data).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import trio

from arceusd.jobs import filework, lifecycle
from arceusd.jobs.claims import stop_state
from arceusd.jobs.commits import Commits
from arceusd.jobs.control_methods import ControlMethods
from arceusd.jobs.core import MAX_RESTARTS_PER_CHECKPOINT
from arceusd.jobs.job import TERMINAL, Job
from arceusd.jobs.joining import HANDED_OVER, JOB_DONE, Joining
from arceusd.jobs.local_worker import LocalWorker, worker_device
from arceusd.jobs.manager_base import OWNER_FILE, JobContext
from arceusd.jobs.standby_sync import StandbySyncing
from arceusd.jobs.starting import Starting
from arceusd.jobs.transfers import leader_data
from arceusd.market.hooks import enough_memory
from arceusd.membership.events import MemberChanged, MemberState
from arceusd.node import Node
from arceusd.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import (
    DataRequest,
    JobAck,
    JobGo,
    JobReport,
    JobStart,
    JobStop,
    LinkEcho,
    ResumeRequest,
    ShardRequest,
    StandbySync,
)
from protocol.messages import JobAnnounce, JoinRequest

log = logging.getLogger(__name__)

REJOIN_GRACE_S = 15.0
"""After the owner restarts, how long it waits for the job's old members to join again before planning."""

WAKE_BACKSTOP_S = 5.0
"""The longest the leader loop sleeps without being woken: a safety net, not the way it learns of changes."""


class JobManager(JobContext):
    """Every job this daemon knows: the service, and the lifecycle of the jobs it owns or leads (the
    :class:`arceusd.jobs.manager_base.Lifecycle` its parts call back into). The parts are composed, each handed
    the shared context (this manager) and the lifecycle: ``control`` (the control-socket methods), ``local``
    (this device's stage worker and the workers' reports), ``standbys`` (the standby's and the owner's copies),
    ``commits`` (checkpoint commits), ``joining`` (announcements and joins), ``starting`` (plan and start)."""

    def __init__(self, node: Node, peers: PeerService) -> None:
        super().__init__(node, peers)
        self.life = self
        self.control = ControlMethods(self, self)
        self.local = LocalWorker(self, self)
        self.standbys = StandbySyncing(self, self)
        self.commits = Commits(self, self, self.standbys)
        self.joining = Joining(self, self)
        self.starting = Starting(self, self, self.local, self.commits)
        self._ready = trio.Event()  # set once the job modules are imported and owned jobs restored

    async def _load_modules(self) -> None:
        """Restore the jobs this device owns. The job modules are torch-free (tensor work runs in child
        processes, :mod:`arceusd.jobs.filework`), so nothing here stalls the event loop on an import."""
        for job in await trio.to_thread.run_sync(self._restore_owned_jobs):
            self.jobs[job.job_id] = job
            job.members[self.node.identity.peer_id] = await self.offer()
            self.spawn(self.lead, job)
            log.info("job %s (%s): resuming as its owner from step %d (term %d)", job.job_id, job.spec.name,
                     job.committed_step, job.term)  # fmt: skip
        self._ready.set()

    def _restore_owned_jobs(self) -> list[Job]:
        """Jobs this device owns that had not ended when it stopped (crash, reboot): they resume from their
        newest committed checkpoint once members rejoin. A job whose saved state does not verify is skipped
        with a warning, never half-restored."""
        from arceusd.checkpoint import committed_steps
        from arceusd.jobs.spec import JobSpecError, parse_spec, spec_hash

        restored: list[Job] = []
        if not self.root.is_dir():
            return restored
        for directory in sorted(self.root.iterdir()):
            path = directory / OWNER_FILE
            if not path.is_file():
                continue
            try:
                saved = json.loads(path.read_bytes())
                spec_bytes = (directory / "spec.json").read_bytes()
                spec = parse_spec(json.loads(spec_bytes), base_dir=Path(saved["base_dir"]),
                                  source=str(directory / "spec.json"))  # fmt: skip
                if saved["job_id"] != directory.name or spec_hash(spec) != saved["spec_hash"]:
                    raise ValueError("the saved spec does not match the job's id or hash")
                if saved["owner"] != self.node.identity.peer_id:
                    raise ValueError("owned by another identity")
                if saved["state"] in TERMINAL:
                    continue
                committed = committed_steps(directory / "checkpoints")
                job = Job(saved["job_id"], spec, spec_bytes, saved["spec_hash"], saved["owner"],
                          self.node.addresses.get("peer", ""), "owner", directory, state="waiting",
                          min_members=1, term=int(saved["term"]) + 1, epoch=int(saved["epoch"]),
                          total_steps=spec.training.steps, committed_step=committed[-1] if committed else 0,
                          step=committed[-1] if committed else 0)  # fmt: skip
                job.gather_until = time.monotonic() + REJOIN_GRACE_S
                job.expected_members = set(saved.get("members", [])) - {self.node.identity.peer_id}
                restored.append(job)
            except (OSError, ValueError, KeyError, TypeError, JobSpecError) as exc:
                log.warning("not resuming the job in %s: %s", directory, exc)
        return restored

    def _gated(self, handler: Any) -> Any:
        async def wrapper(*args: Any) -> Any:
            await self._ready.wait()
            return await handler(*args)

        return wrapper

    # ---------------------------------------------------------------------------------------------- service
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        peers, gate = self.peers, self._gated
        peers.register(JobAnnounce, gate(self.joining.on_announce))
        peers.register(JoinRequest, gate(self.joining.on_join_request))
        peers.register(JobStart, gate(self.local.on_start))
        peers.register(JobGo, gate(self.local.on_go))
        peers.register(JobStop, gate(self._on_stop))
        peers.register(JobReport, gate(self.local.on_report))
        peers.register(ShardRequest, gate(self.transfers.on_shard_request))
        peers.register(ResumeRequest, gate(self.transfers.on_resume_request))
        peers.register(StandbySync, gate(self.standbys.on_standby_sync))
        peers.register(DataRequest, gate(self.transfers.on_data_request))
        peers.register(LinkEcho, self.starting.on_link_echo)
        peers.listeners.append(self._on_member_changed)
        if self.node.elections is not None:
            self.node.elections.on_leader_change(self._on_leader_change)
        self.node.methods.update({name: gate(method) for name, method in self.control.methods().items()})
        self.node.sections["jobs"] = lambda: [j.summary() for j in self.jobs.values()]
        self.node.sections["announcements"] = self.joining.announced.summary
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
        """The leader's loop for one job: gather members, plan and start; repartition on failures, departures
        and joins; stop when the job ends. It waits on ``job.wake``, which what concerns the loop sets
        (:meth:`Job.poke`: a join, a report, a restart asked for, a leader change, a peer alive, the end), or
        until the owner's rejoin grace ends; :data:`WAKE_BACKSTOP_S` bounds what a missed wake could cost."""
        while job.state not in TERMINAL and self.leads(job):
            job.wake = trio.Event()
            if job.role == "owner":
                self._announce_to_new_peers(job)  # new peers, and old ones back from the dead, may join
            if job.state in ("waiting", "paused"):
                if self._enough_members(job):
                    job.gather_until = 0.0
                    await self.starting.plan_and_start(job)
                    self.persist(job)
                    continue
            elif job.restart_reason and job.state in ("running", "starting", "recovering"):
                await self._restart(job)
                continue
            deadline = time.monotonic() + WAKE_BACKSTOP_S
            if job.gather_until and job.state in ("waiting", "paused"):
                deadline = min(deadline, job.gather_until)
            with trio.move_on_at(trio.current_time() + max(0.0, deadline - time.monotonic())):
                await job.wake.wait()

    @staticmethod
    def _enough_members(job: Job) -> bool:
        if job.gather_until:  # resuming after our own restart: wait for the old members, not for long
            back = job.expected_members <= set(job.members)
            return back or time.monotonic() >= job.gather_until
        return len(job.members) >= job.min_members and enough_memory(job)  # needs.memory_total_mib (market)

    def _announce_to_new_peers(self, job: Job) -> None:
        for peer, address in self.peers.alive_peers().items():
            if peer != self.node.identity.peer_id and peer not in job.announced:
                job.announced.add(peer)
                self.spawn(self.joining.announce, job, peer, address)

    def request_restart(self, job: Job, reason: str) -> None:
        """Ask the leader loop to repartition ``job`` (the first reason wins until the restart runs)."""
        if not self.leads(job) or job.state in TERMINAL or job.state in ("waiting", "paused"):
            return
        if not job.restart_reason:
            log.warning("job %s: repartitioning: %s", job.job_id, reason)
            job.restart_reason = reason
        if job.start_scope is not None:  # a start in progress would wait for a member that is gone
            job.start_scope.cancel()
        job.poke()

    async def _restart(self, job: Job) -> None:
        """Stop the current plan's workers and start a new plan epoch over the live members, resumed from the
        newest verified checkpoint. A job that keeps failing at the same checkpoint fails after a few tries."""
        from arceusd.jobs.job import Recovery

        reason, job.restart_reason = job.restart_reason, ""
        tries = job.restarts_at.get(job.committed_step, 0) + 1
        job.restarts_at[job.committed_step] = tries
        if tries > MAX_RESTARTS_PER_CHECKPOINT:
            await self.finish(job, "failed", f"{reason} (gave up after {tries - 1} repartitions that made no "
                               f"progress past step {job.committed_step})")  # fmt: skip
            return
        recovery = Recovery(reason, job.epoch + 1, job.step)
        previous = job.recoveries[-1] if job.recoveries else None
        if previous is not None and previous.first_step_after_s is None:  # the same incident, another attempt
            recovery.began, recovery.began_at = previous.began, previous.began_at
            recovery.lost_step = previous.lost_step
        job.recoveries.append(recovery)
        job.state, job.error = "recovering", reason
        job.term += 1
        old = job.plan_peers()
        job.plan, job.replica_plan, job.reports = None, None, {}
        job.witnesses, job.complete = {}, {}
        await self.drop_own_worker(job)
        stop = JobStop(job.job_id, job.term, "replanning")
        alive = self.peers.alive_peers()
        for peer in old:
            if peer != self.node.identity.peer_id and peer in alive and peer in job.members:
                self.spawn(self._send_stop, job, peer, stop, job.members[peer].address)
        # The old plan's members are asked with a handshake, whatever membership says right now: a worker's broken
        # link is faster than membership. A member that joined since (not in the old plan) is kept while
        # membership sees it live: it asked to join moments ago, and a daemon that just restarted can be too busy
        # (importing torch) to answer a handshake in time, while a leader that is not the owner could never
        # invite it back (only the owner announces jobs). If it then fails to start, the next restart drops it.
        live = {p for p, m in self.peers.membership.members.items()
                if m.state in (MemberState.ALIVE, MemberState.SUSPECT)}  # fmt: skip
        reachable = await self._reachable(job, [p for p in job.members if p in old])
        reachable |= {p for p in job.members if p not in old and p in live}
        for peer in list(job.members):
            if peer != self.node.identity.peer_id and peer not in reachable:
                # dead, left or not answering; the owner invites it back when membership sees it alive
                del job.members[peer]
                job.announced.discard(peer)
        job.rebalance = False
        await self.starting.plan_and_start(job)
        self.persist(job)

    async def _reachable(self, job: Job, peers: list[str], timeout: float = 1.0) -> set[str]:
        """The members among ``peers`` whose daemon answers a handshake within ``timeout`` (and ourselves)."""
        me = self.node.identity.peer_id
        answered = {me}

        async def probe(peer: str) -> None:
            offer = job.members.get(peer)
            if offer is not None and await self.peers.hello(offer.address, timeout) is not None:
                answered.add(peer)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                if peer != me:
                    nursery.start_soon(probe, peer)
        return answered

    async def hand_over(self, job: Job, leader: str) -> None:
        await self.joining.hand_over(job, leader)

    async def join(self, job: Job) -> dict[str, Any]:
        return await self.joining.join(job)

    # ---------------------------------------------------------------------------------------------- takeover
    def _on_leader_change(self, job_id: str, leader: tuple[str, int] | None) -> None:
        """The job's election chose a leader: the standby takes over; a leader that lost steps down."""
        self.leader_changed(job_id)
        job = self.jobs.get(job_id)
        if job is None or leader is None or job.state in TERMINAL:
            return
        me, (peer, term) = self.node.identity.peer_id, leader
        if peer == me and not self.leads(job):
            if job.standby != me or job.standby_data is None:
                log.warning("job %s: elected, but this device holds no checked copy of the data; not leading",
                            job_id)  # fmt: skip
                return
            self.spawn(self._take_over, job, term)
        elif peer != me and self.leads(job):
            log.warning("job %s: %s was elected leader (term %d); stepping down", job_id, peer[:12], term)
            self.follow_leader(job, peer)
            job.state, job.error = "paused", f"{peer[:12]} leads the job now"
            if job.start_scope is not None:
                job.start_scope.cancel()
            self.spawn(self.drop_own_worker, job)
            job.poke()

    async def _take_over(self, job: Job, election_term: int) -> None:
        """Standby elected after the leader died: lead the survivors from the newest verified checkpoint."""
        from dataclasses import replace

        from arceusd.jobs.recovery import corrupt_shards

        me, old = self.node.identity.peer_id, job.leader
        if job.plan is None:
            return
        alive = self.peers.alive_peers()  # the members' offers as the leader last had them, at today's address
        job.members = {p: replace(o, address=alive[p]) for p, o in job.standby_offers.items()
                       if p in alive and p in job.plan_peers() and p not in (old, me)}  # fmt: skip
        job.members[me] = await self.offer()
        job.leader, job.leader_address = me, self.node.addresses.get("peer", "")
        job.leaders.add(me)
        step, _ = await trio.to_thread.run_sync(corrupt_shards, job.directory / "checkpoints", sorted(job.leaders))
        job.committed_step = step
        job.min_members, job.gather_until = 1, 0.0
        job.state = "running"
        job.restart_reason = ""
        log.warning("job %s: the leader %s is gone; taking over as its standby (election term %d, from step %d)",
                    job.job_id, old[:12], election_term, step)  # fmt: skip
        self.request_restart(job, f"the leader {old[:12]} is gone; its standby {me[:12]} took over")
        self.spawn(self.lead, job)

    # ---------------------------------------------------------------------------------- checkpoints, the end
    async def commit_checkpoint(self, job: Job, step: int, term: int, epoch: int) -> None:
        await self.commits.commit_checkpoint(job, step, term, epoch)

    async def export(self, job: Job, step: int, paths: list[Path]) -> None:
        """Assemble the model from the shards at ``paths`` (in a child process) and finish the job."""
        vocab = str(leader_data(job)["path"]) if job.spec.data.kind == "text" else None
        try:
            path = await filework.export_model(job.directory, job.spec_bytes, job.job_id, step, paths, vocab)
        except Exception as exc:
            await self.finish(job, "failed", f"exporting the model failed: {exc}")
            return
        job.model_path = str(path)
        log.info("job %s: model saved to %s", job.job_id, path)
        await self.finish(job, "done", "")

    async def finish(self, job: Job, state: str, error: str) -> None:
        """End ``job``: tell the members (a leader), stop our worker, and leave the job's election once the
        members were told (leaving first would let them elect a standby for a job that is over)."""
        job.state, job.error = state, error
        stops: list[tuple[str, str]] = []
        if job.plan is not None and self.leads(job):  # a device that does not lead commands nobody
            stops = [(peer, job.members[peer].address)
                     for peer in sorted(set(job.plan_peers()) | ({job.owner} & set(job.members)))
                     if peer != self.node.identity.peer_id and peer in job.members]  # fmt: skip
        self.spawn(self._stop_members_then_untrack, job, JobStop(job.job_id, job.term, state), stops)
        await self.drop_own_worker(job)
        self.persist(job)
        job.finished.set()
        job.poke()

    async def _stop_members_then_untrack(self, job: Job, stop: JobStop, stops: list[tuple[str, str]]) -> None:
        async with trio.open_nursery() as nursery:
            for peer, address in stops:
                nursery.start_soon(self._send_stop, job, peer, stop, address)
        if lifecycle.ends_election(job.state):
            self.untrack(job)

    async def _send_stop(self, job: Job, peer: str, stop: JobStop, address: str) -> None:
        await self.peers.request(address, peer, stop, timeout=10.0, job_id=job.job_id, term=job.term,
                                 epoch=job.epoch)  # fmt: skip

    async def _on_stop(self, header: Header, msg: JobStop) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or await self.check_leader(header, job, epochs=False):
            return JobAck(False, "not from this job's leader")
        job.state = stop_state(msg.reason)  # a known state only, never the sender's text (issue #19)
        await self.drop_own_worker(job)
        if lifecycle.ends_election(job.state):
            self.untrack(job)
        return JobAck(True)

    def _on_member_changed(self, change: MemberChanged) -> None:
        if change.state is MemberState.ALIVE and change.previous is not MemberState.ALIVE:
            for job in self.jobs.values():  # a peer new or back: the owner's leader loop announces the job to it
                if self.leads(job) and job.role == "owner" and job.state not in TERMINAL:
                    job.poke()
            return
        if change.state not in (MemberState.DEAD, MemberState.LEFT):
            return
        for job in self.jobs.values():
            if self.leads(job):
                job.announced.discard(change.peer)  # announce again if it comes back
                in_plan = change.peer in job.plan_peers()
                if change.peer in job.members and job.state in ("waiting", "paused"):
                    del job.members[change.peer]
                if in_plan or job.state == "recovering":
                    self.request_restart(job, f"member {change.peer[:12]} is {change.state.value}")
            elif change.peer == job.leader and job.state not in TERMINAL:
                job.state, job.error = "paused", f"the job's leader {job.leader[:12]} is {change.state.value}"
                self.spawn(self.drop_own_worker, job)


async def serve_jobs(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Daemon service: the job manager (needs the peer network service started first)."""
    if node.peers is None:
        raise RuntimeError("serve_jobs needs the peer network (serve_peer_network) to start first")
    manager = JobManager(node, node.peers)
    node.jobs = manager
    await manager.run(task_status=task_status)


__all__ = ["HANDED_OVER", "JOB_DONE", "OWNER_FILE", "JobManager", "serve_jobs", "worker_device"]
