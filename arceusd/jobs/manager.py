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
the leader's loop (gather, plan and start, repartition, take over, hand over), announcements and joins, member
changes, and committing, exporting and finishing. The rest of :class:`JobManager` lives beside it:

- :mod:`arceusd.jobs.manager_base`: the shared state, the manager's nursery, this device's offer, and whom it
  follows as leader (the check of a leader's command);
- :mod:`arceusd.jobs.control_methods`: the control-socket methods (``submit``, ``join``, ``jobs``, ``job``,
  ``cancel``, ``leave``);
- :mod:`arceusd.jobs.local_worker`: starting and following this device's stage worker, and the workers' reports;
- :mod:`arceusd.jobs.standby_sync`: the leader's syncs to its standby and to the owner;
- :mod:`arceusd.jobs.transfers`: serving and fetching files between daemons (shards, resume slices, the data).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import trio

from arceusd.announce_guard import AnnounceGuard
from arceusd.control import RequestError
from arceusd.jobs import claims, filework, leadership, lifecycle, shard_checks
from arceusd.jobs.claims import check_offer_bounds, stop_state
from arceusd.jobs.control_methods import ControlMethods
from arceusd.jobs.core import MAX_RESTARTS_PER_CHECKPOINT
from arceusd.jobs.job import TERMINAL, Job
from arceusd.jobs.local_worker import LocalWorker, worker_device
from arceusd.jobs.manager_base import OWNER_FILE
from arceusd.jobs.standby_sync import StandbySyncing, choose_standby
from arceusd.jobs.transfers import leader_data
from arceusd.market.hooks import enough_memory, join_refusal, may_auto_join, on_commit
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
    JobStartReply,
    JobStop,
    LinkEcho,
    PeerAddress,
    ResumeRequest,
    ShardRequest,
    StandbySync,
)
from protocol.messages import Address, JobAnnounce, JoinReply, JoinRequest

log = logging.getLogger(__name__)

REJOIN_GRACE_S = 15.0
"""After the owner restarts, how long it waits for the job's old members to join again before planning."""

LINK_TTL_S = 600.0
"""How long a measured link (round trip, bandwidth, per-message cost) is used for plans before it is measured
again."""

JOB_DONE = "the job is done"
"""A leader's answer to a join once the job finished (what a returning owner learns the end from)."""

HANDED_OVER = leadership.HANDED_OVER
"""A member's answer to its returning owner's announce (and its refusal of any command from a peer it does not
follow), followed by the peer id that leads the job now (:func:`arceusd.jobs.leadership.refusal`)."""


class JobManager(ControlMethods, LocalWorker, StandbySyncing):
    """Every job this daemon knows: the service, and the lifecycle of the jobs it owns or leads."""

    def __init__(self, node: Node, peers: PeerService) -> None:
        super().__init__(node, peers)
        self._ready = trio.Event()  # set once the job modules are imported and owned jobs restored
        self._links: dict[str, tuple[float, Any]] = {}  # peer -> (when measured, partitioner Link)
        self.announced = AnnounceGuard()  # bounds and validates what strangers announce

    async def _load_modules(self) -> None:
        """Restore the jobs this device owns. The job modules are torch-free (tensor work runs in child
        processes, :mod:`arceusd.jobs.filework`), so nothing here stalls the event loop on an import."""
        for job in await trio.to_thread.run_sync(self._restore_owned_jobs):
            self.jobs[job.job_id] = job
            job.members[self.node.identity.peer_id] = await self.offer()
            self._spawn(self._lead, job)
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
        peers.register(JobAnnounce, gate(self._on_announce))
        peers.register(JoinRequest, gate(self._on_join_request))
        peers.register(JobStart, gate(self._on_start))
        peers.register(JobGo, gate(self._on_go))
        peers.register(JobStop, gate(self._on_stop))
        peers.register(JobReport, gate(self._on_report))
        peers.register(ShardRequest, gate(self.transfers.on_shard_request))
        peers.register(ResumeRequest, gate(self.transfers.on_resume_request))
        peers.register(StandbySync, gate(self._on_standby_sync))
        peers.register(DataRequest, gate(self.transfers.on_data_request))
        peers.register(LinkEcho, self._on_link_echo)
        peers.listeners.append(self._on_member_changed)
        if self.node.elections is not None:
            self.node.elections.on_leader_change(self._on_leader_change)
        self.node.methods.update({
            "submit": gate(self._m_submit), "join": gate(self._m_join), "jobs": gate(self._m_jobs),
            "job": gate(self._m_job), "cancel": gate(self._m_cancel), "leave": gate(self._m_leave),
        })  # fmt: skip
        self.node.sections["jobs"] = lambda: [j.summary() for j in self.jobs.values()]
        self.node.sections["announcements"] = self.announced.summary
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
    async def _lead(self, job: Job) -> None:
        """The leader's loop for one job: gather members, plan and start; repartition on failures, departures
        and joins; stop when the job ends. Every wait is on ``job.wake`` with a short timeout."""
        while job.state not in TERMINAL and self._leads(job):
            job.wake = trio.Event()
            if job.role == "owner":
                self._announce_to_new_peers(job)  # new peers, and old ones back from the dead, may join
            if job.state in ("waiting", "paused"):
                if self._enough_members(job):
                    job.gather_until = 0.0
                    await self._plan_and_start(job)
                    self._persist(job)
                    continue
            elif job.restart_reason and job.state in ("running", "starting", "recovering"):
                await self._restart(job)
                continue
            with trio.move_on_after(0.3):
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
                self._spawn(self._announce, job, peer, address)

    def _request_restart(self, job: Job, reason: str) -> None:
        """Ask the leader loop to repartition ``job`` (the first reason wins until the restart runs)."""
        if not self._leads(job) or job.state in TERMINAL or job.state in ("waiting", "paused"):
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
            await self._finish(job, "failed", f"{reason} (gave up after {tries - 1} repartitions that made no "
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
        await self._drop_own_worker(job)
        stop = JobStop(job.job_id, job.term, "replanning")
        alive = self.peers.alive_peers()
        for peer in old:
            if peer != self.node.identity.peer_id and peer in alive and peer in job.members:
                self._spawn(self._send_stop, job, peer, stop, job.members[peer].address)
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
        await self._plan_and_start(job)
        self._persist(job)

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

    async def _plan_and_start(self, job: Job) -> None:
        """Plan over ``job.members``, slice the resume checkpoint, start every worker, then send ``go``."""
        from arceusd.jobs.planning import (
            PlanError,
            encode_job_start,
            estimated_links,
            make_job_plan,
            replica_flops_shares,
        )
        resuming = job.state == "recovering" or job.committed_step > 0
        job.state = "planning"
        me = self.node.identity.peer_id
        rtt = {(me, p): (i.rtt_ms or 1.0) / 1000 for p, i in self.peers.info.items()}
        # a member measured far slower than it offered is planned at its measured speed (issue #19)
        offers = [claims.discounted(job.members[p], job.discounts.get(p, 1.0)) for p in sorted(job.members)]
        measured = await self._measure_links(job)
        job.links = {p: {"rtt_ms": round(m.rtt_s * 1e3, 3), "bandwidth_mb_s": round(m.bandwidth_bytes_per_s / 1e6, 2),
                         "message_ms": round(m.message_s * 1e3, 4)} for p, m in measured.items()}  # fmt: skip
        links = estimated_links(me, measured, sorted(job.members))
        try:
            job.inputs, job.replica_plan = await trio.to_thread.run_sync(make_job_plan, job.spec, offers, rtt, links,
                                                                         me)  # fmt: skip
        except PlanError as exc:
            job.state = "paused" if resuming else "waiting"
            job.error = f"no plan fits the {len(offers)} member(s): {exc}" + (
                "; paused until more capacity joins" if resuming else "")  # fmt: skip
            job.min_members = len(job.members) + 1
            log.warning("job %s: %s", job.job_id, job.error)
            return
        job.plan = job.replica_plan.replicas[0]  # the first replica's devices write the checkpoint shards
        if me not in job.plan_peers():
            await self._finish(job, "failed", "the plan leaves out the owner, who serves the data")
            return
        job.shares = replica_flops_shares(job.replica_plan, job.inputs)
        job.epoch += 1
        job.link_waits.clear()  # who waits on whom depends on the plan: judged afresh (claims.seen_by_neighbours)
        job.seen.clear()
        self._spawn(shard_checks.prefetch_shapes, job)  # ready by the plan's first checkpoint
        job.state = "starting"
        job.standby = choose_standby(job, me)
        self._track(job, list(job.plan_peers()), [me, job.standby])
        inputs_data, plan_data = encode_job_start(job.spec, job.inputs, job.replica_plan)
        resume = None
        if resuming:
            replicas = await self._repair_checkpoint(job)
            resume = await filework.prepare_resume(job.directory, job.spec_bytes, plan_data, job.epoch,
                                                   sorted(job.leaders), replicas)  # fmt: skip
        start_step = resume.step if resume is not None else 0
        job.resume_files = {p: f.name for p, f in resume.files.items()} if resume is not None else {}
        job.step = start_step
        job.history = [h for h in job.history if h[0] <= start_step]
        if job.recoveries and job.recoveries[-1].epoch == job.epoch:
            job.recoveries[-1].resumed_step = start_step
        start = JobStart(job.job_id, job.term, job.epoch, job.spec_bytes, plan_data, inputs_data, start_step,
                         resume.to_wire() if resume is not None else b"", job.standby)  # fmt: skip
        addresses: dict[str, str] = {}
        failures: list[tuple[str, str]] = []
        reach = {o.peer_id: o.address for o in offers}  # as planned: a member may leave meanwhile

        async def start_one(peer: str) -> None:
            if peer == me:
                local = None
                if resume is not None:
                    from arceusd.worker.protocol import ResumeConfig

                    local = ResumeConfig(start_step, str(resume.directory / resume.files[me].name), resume.cursor)
                reply = await self._start_worker(job, local)
            else:
                got = await self.peers.request(reach[peer], peer, start, timeout=240.0,
                                               job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
                reply = got if isinstance(got, JobStartReply) else JobStartReply(job.job_id, False, "no answer")
            if reply.accepted:
                addresses[peer] = reply.worker_address
            else:
                failures.append((peer, reply.reason))

        epoch = job.epoch
        with trio.CancelScope() as scope:
            job.start_scope = scope
            async with trio.open_nursery() as nursery:
                for peer in job.plan_peers():
                    nursery.start_soon(start_one, peer)
        job.start_scope = None
        if job.epoch != epoch or job.state in TERMINAL or not self._leads(job):
            return  # replanned, ended, or handed over (to the leader our members follow) meanwhile
        if scope.cancelled_caught:
            failures.append(("", "a member of the new plan failed while it started"))
        outcome = leadership.start_outcome(me, failures)
        if isinstance(outcome, leadership.HandOver):
            # Membership declared us dead meanwhile and the standby took over: its members refuse us and say
            # so. Commanding again cannot succeed (we would only fail the job); join the new leader instead.
            log.warning("job %s: the members follow %s now; handing over", job.job_id, outcome.leader[:12])
            job.state = "running"  # the restart path if the hand-over does not happen
            await self._hand_over(job, outcome.leader)
            if self._leads(job):
                self._request_restart(job, f"members follow {outcome.leader[:12]}, who did not take us in")
            return
        if isinstance(outcome, leadership.Restart):
            reason = outcome.reason
            if resuming or job.restart_reason:
                job.state = "running"  # let the leader loop take the restart path
                self._request_restart(job, reason)
            else:
                await self._finish(job, "failed", reason)
            return
        go = JobGo(job.job_id, job.term, job.epoch, tuple(PeerAddress(p, a) for p, a in sorted(addresses.items())))
        pending, attempt = list(job.plan_peers()), 0
        while True:
            attempt += 1
            unacknowledged = await self._send_go(job, go, pending, reach)
            if job.epoch != epoch or job.state in TERMINAL or not self._leads(job):
                return
            decided = lifecycle.after_go(unacknowledged, attempt)
            if isinstance(decided, lifecycle.ResendGo):
                log.warning("job %s: go not acknowledged by %s; sending it again", job.job_id,
                            ", ".join(p[:12] for p in decided.peers))  # fmt: skip
                pending = list(decided.peers)
                continue
            if isinstance(decided, lifecycle.RestartPlan):
                job.state = "running"  # the leader loop's restart path
                self._request_restart(job, decided.reason)
                return
            break
        if job.state == "starting":
            job.state = "running"
        job.error = ""
        log.info("job %s running on %d devices (term %d, epoch %d, from step %d)", job.job_id, len(addresses),
                 job.term, job.epoch, start_step)  # fmt: skip

    async def _send_go(self, job: Job, go: JobGo, peers: list[str], reach: dict[str, str]) -> dict[str, str]:
        """Send ``go`` to ``peers`` in plan order (as before); the ones that did not acknowledge it, with why."""
        me = self.node.identity.peer_id
        unacknowledged: dict[str, str] = {}

        async def one(peer: str) -> None:
            if peer == me:
                await self._go(job, go)
                return
            reply = await self.peers.request(reach[peer], peer, go, timeout=30.0,
                                             job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
            if not isinstance(reply, JobAck):
                unacknowledged[peer] = "no answer"
            elif not reply.ok:
                unacknowledged[peer] = reply.reason or "refused"

        for peer in peers:
            await one(peer)
        return unacknowledged

    async def _measure_links(self, job: Job) -> dict[str, Any]:
        """Leader: the link to each member, measured over the transport (``arceusd.profile.measure_link``: round
        trip, bandwidth, per-message cost) one member at a time, reused for :data:`LINK_TTL_S`. A member that
        does not echo in time keeps the defaults (round trip from membership, nominal bandwidth)."""
        from arceusd.profile import measure_link
        from partitioner import Link

        me, now, out = self.node.identity.peer_id, time.monotonic(), {}
        for peer in sorted(job.members):
            if peer == me:
                continue
            cached = self._links.get(peer)
            if cached is not None and now - cached[0] < LINK_TTL_S:
                out[peer] = cached[1]
                continue
            address = job.members[peer].address

            async def echo(data: bytes, peer: str = peer, address: str = address) -> bytes:
                reply = await self.peers.request(address, peer, LinkEcho(data), timeout=10.0)
                if not isinstance(reply, LinkEcho):
                    raise ValueError(f"{peer[:12]} did not echo")
                return reply.payload

            try:
                with trio.fail_after(20):
                    m = await measure_link(echo)
            except (ValueError, trio.TooSlowError) as exc:
                log.warning("job %s: could not measure the link to %s: %s", job.job_id, peer[:12], exc)
                continue
            link = Link(round(m.rtt_s, 6), float(f"{m.bandwidth_bytes_per_s:.4g}"), round(m.message_s, 7))
            self._links[peer] = (now, link)
            out[peer] = link
        return out

    async def _on_link_echo(self, header: Header, msg: LinkEcho) -> LinkEcho | JobAck:
        if header.sender not in self.peers.membership.members:
            return JobAck(False, "echoes are for peers in the membership view")
        return LinkEcho(msg.payload)

    async def _repair_checkpoint(self, job: Job) -> list[Path]:
        """Copy from members every shard of the newest committed step whose local copy is missing or corrupt;
        return the replica roots to read them from (empty when the local copies are intact)."""
        from arceusd.checkpoint import atomic_write, matches, step_dir
        from arceusd.jobs.recovery import corrupt_shards

        root = job.directory / "checkpoints"
        step, bad = await trio.to_thread.run_sync(corrupt_shards, root, sorted(job.leaders))
        if not bad:
            return []
        replicas = job.directory / "replicas"
        for record in bad:
            log.warning("job %s: shard %s of step %d is missing or corrupt here; fetching a replica",
                        job.job_id, record.name, step)  # fmt: skip
            for peer in sorted(job.members):
                if peer == self.node.identity.peer_id:
                    continue
                data = await self.transfers.fetch_shard(job, peer, step, record)
                if data is not None and matches(data, record):
                    await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / record.name, data)
                    break
            else:
                log.warning("job %s: no member has an intact copy of %s", job.job_id, record.name)
        manifest = step_dir(root, step) / "manifest.json"
        await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / "manifest.json", manifest.read_bytes())
        return [replicas]

    async def _announce(self, job: Job, peer: str, address: str) -> None:
        msg = JobAnnounce(job.job_id, job.owner, bytes.fromhex(job.spec_hash), job.spec_bytes)
        reply = await self.peers.request(address, peer, msg, timeout=10.0, job_id=job.job_id)
        leader = leadership.followed_leader(reply.reason) if isinstance(reply, JobAck) and not reply.ok else None
        if leader is not None:
            await self._hand_over(job, leader)

    async def _hand_over(self, job: Job, leader: str) -> None:
        """Owner, back after its standby took the job over: ask that leader to take this device in as a member
        (its signed answer confirms it leads). A finished job is recorded as finished there."""
        me = self.node.identity.peer_id
        async with job.sync_lock:
            if not self._leads(job) or job.role != "owner" or leader == me or job.state in TERMINAL:
                return
            member = self.peers.membership.members.get(leader)
            if member is None or not member.address:
                log.warning("job %s: a member says %r leads it, who is not a live peer here", job.job_id, leader)
                return
            reply = await self._request_join(job, leader, member.address)
            if reply is None:
                return
            if reply.accepted or reply.reason == JOB_DONE:
                self._follow_leader(job, leader)
                # Terms and epochs count the leader's commands; ours (raised by our own repartitions while we
                # still thought we led) say nothing about the new leader's, which must not look stale to us.
                job.term, job.epoch = 0, 0
                if job.start_scope is not None:
                    job.start_scope.cancel()
                await self._drop_own_worker(job)
                job.plan, job.replica_plan, job.reports, job.restart_reason = None, None, {}, ""
                job.witnesses, job.complete = {}, {}
            if reply.accepted:
                job.state = "joined"
                job.error = f"{leader[:12]} leads the job (its standby took over while this device was away)"
            elif reply.reason == JOB_DONE:
                job.state = "done"
                self._untrack(job)
                job.error = f"the job finished on {leader[:12]}, which took over as its leader; the model is there"
            else:
                log.warning("job %s: %s leads it and refused this device: %s", job.job_id, leader[:12],
                            reply.reason)  # fmt: skip
                return
            log.info("job %s: %s", job.job_id, job.error)
            self._persist(job)
            job.poke()

    async def _request_join(self, job: Job, leader: str, address: str) -> JoinReply | None:
        offer = await self.offer()
        host, _, port = offer.address.rpartition(":")
        request = JoinRequest(job.job_id, self.node.identity.peer_id, Address(host, int(port)),
                              offer.memory_bytes, offer.flops_per_s, offer.block_efficiency, offer.dispatch_s,
                              offer.adamw_s_per_param, offer.sgd_s_per_param, offer.message_s,
                              offer.kind)  # fmt: skip
        reply = await self.peers.request(address, leader, request, timeout=10.0, job_id=job.job_id)
        return reply if isinstance(reply, JoinReply) else None

    async def _on_join_request(self, header: Header, msg: JoinRequest) -> JoinReply:
        from arceusd.jobs.planning import Offer

        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job):
            return JoinReply(msg.job_id, False, "this device does not lead that job")
        if header.sender != msg.peer_id:
            return JoinReply(msg.job_id, False, "a join must come from the joining device itself")
        if not job.spec.admission.admits(msg.peer_id):
            log.info("job %s: refused %s (not admitted)", job.job_id, msg.peer_id)
            return JoinReply(msg.job_id, False, "not admitted by the job's owner")
        if job.state in TERMINAL:
            return JoinReply(msg.job_id, False, JOB_DONE if job.state == "done" else f"the job is {job.state}")
        if msg.flops_per_s <= 0 or msg.free_memory_bytes <= 0:
            return JoinReply(msg.job_id, False, "the offer must have positive speed and memory")
        why = check_offer_bounds(msg.free_memory_bytes, msg.flops_per_s) or job.excluded.get(msg.peer_id)
        if why:  # a physically implausible offer, or a member excluded for a bad report (issue #19)
            return JoinReply(msg.job_id, False, f"refused: {why}")
        offer = Offer(msg.peer_id, f"{msg.address.host}:{msg.address.port}", msg.flops_per_s,
                      msg.free_memory_bytes, msg.kind, msg.block_efficiency, msg.dispatch_s, msg.adamw_s_per_param,
                      msg.sgd_s_per_param, msg.message_s)  # fmt: skip
        try:
            offer.check()
        except ValueError as exc:
            return JoinReply(msg.job_id, False, f"the offer is not usable: {exc}")
        refused = join_refusal(self.node, job, offer)  # the job's needs and budget (arceusd.market)
        if refused is not None:
            return JoinReply(msg.job_id, False, refused[:1000])
        new = msg.peer_id not in job.members
        job.members[msg.peer_id] = offer
        if new:
            log.info("job %s: %s joined (%d members)", job.job_id, msg.peer_id[:12], len(job.members))
            if job.state in ("running", "starting", "recovering", "planning"):
                job.rebalance = True  # it gets work at the next checkpoint
            job.poke()
        return JoinReply(msg.job_id, True, "", tuple(sorted(job.members)))

    # ---------------------------------------------------------------------------------------------- member
    async def _on_announce(self, header: Header, msg: JobAnnounce) -> JobAck:
        from arceusd.jobs.spec import JobSpecError, spec_from_dict, spec_hash

        refused = self.announced.admit(header.sender, msg, known=msg.job_id in self.jobs, now=time.monotonic())
        if refused is not None:
            return JobAck(False, refused)
        if header.sender != msg.owner:
            return JobAck(False, "an announcement must come from the job's owner")
        known = self.jobs.get(msg.job_id)
        if known is not None:
            if known.role == "member" and known.leader != msg.owner:
                return JobAck(False, HANDED_OVER + known.leader)  # the owner is back after its standby took over
            if known.role == "member" and known.state not in TERMINAL:
                self._spawn(self._auto_join, known)  # the owner lost us (we were declared dead): join again
            return JobAck(True)
        try:
            spec = spec_from_dict(json.loads(msg.spec))
        except (JobSpecError, ValueError) as exc:
            log.warning("ignoring job %s: bad spec: %s", msg.job_id, exc)
            return JobAck(False, self.announced.refuse("bad_spec"))
        if spec_hash(spec) != msg.spec_hash.hex():
            return JobAck(False, self.announced.refuse("spec_hash_mismatch"))
        member = self.peers.membership.members.get(msg.owner)
        owner_address = member.address if member is not None else ""
        job = Job(msg.job_id, spec, msg.spec, msg.spec_hash.hex(), msg.owner, owner_address, "seen",
                  self.root / msg.job_id, state="announced", total_steps=spec.training.steps)  # fmt: skip
        self.jobs[msg.job_id] = job
        for old in self.announced.added(msg.job_id, msg.owner):
            stale = self.jobs.get(old)
            if stale is not None and stale.role == "seen" and stale.state == "announced":
                del self.jobs[old]
        log.info("job %s (%s) announced by %s", msg.job_id, spec.name, msg.owner[:12])
        if self.node.config.auto_join:
            self._spawn(self._auto_join, job)
        return JobAck(True)

    async def _auto_join(self, job: Job) -> None:
        """Join an announced job; an owner that does not answer yet (e.g. still restoring its jobs after a
        restart) is asked again a few times, backing off. The device's policy and the job's needs decide first
        (``arceusd.market``)."""
        if not await may_auto_join(self.node, job):
            return
        for attempt in range(6):
            try:
                result = await self.join(job)
                log.info("auto-join %s: %s", job.job_id, result)
                return
            except RequestError as exc:
                log.warning("auto-join %s failed (attempt %d): %s", job.job_id, attempt + 1, exc)
            await trio.sleep(min(4.0, 0.5 * 2**attempt))

    async def join(self, job: Job) -> dict[str, Any]:
        if job.role == "owner":
            return {"job_id": job.job_id, "accepted": True, "reason": "this device owns the job"}
        member = self.peers.membership.members.get(job.leader)
        if member is not None and member.address:
            job.leader_address = member.address
            if job.leader == job.owner:
                job.owner_address = member.address
        reply = await self._request_join(job, job.leader, job.leader_address)
        if reply is None:
            raise RequestError(f"the job's leader {job.leader[:12]} did not answer")
        if reply.accepted:
            job.role = "member"
            if job.state in ("announced", "seen", "left"):
                job.state = "joined"
        return {"job_id": job.job_id, "accepted": reply.accepted, "reason": reply.reason}

    # ---------------------------------------------------------------------------------------------- takeover
    def _on_leader_change(self, job_id: str, leader: tuple[str, int] | None) -> None:
        """The job's election chose a leader: the standby takes over; a leader that lost steps down."""
        job = self.jobs.get(job_id)
        if job is None or leader is None or job.state in TERMINAL:
            return
        me, (peer, term) = self.node.identity.peer_id, leader
        if peer == me and not self._leads(job):
            if job.standby != me or job.standby_data is None:
                log.warning("job %s: elected, but this device holds no checked copy of the data; not leading",
                            job_id)  # fmt: skip
                return
            self._spawn(self._take_over, job, term)
        elif peer != me and self._leads(job):
            log.warning("job %s: %s was elected leader (term %d); stepping down", job_id, peer[:12], term)
            self._follow_leader(job, peer)
            job.state, job.error = "paused", f"{peer[:12]} leads the job now"
            if job.start_scope is not None:
                job.start_scope.cancel()
            self._spawn(self._drop_own_worker, job)
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
        self._request_restart(job, f"the leader {old[:12]} is gone; its standby {me[:12]} took over")
        self._spawn(self._lead, job)

    # ---------------------------------------------------------------------------------- checkpoints, the end
    async def _commit_checkpoint(self, job: Job, step: int, term: int, epoch: int) -> None:
        """Commit ``step`` (:meth:`_commit_once`); a failure of the final checkpoint is retried, then fails the
        job (:func:`arceusd.jobs.lifecycle.after_commit_failure`); an earlier one is superseded by the next."""
        async with job.commit_lock:  # one at a time, in step order (trio's lock is fair): receipts chain
            await self._commit_in_turn(job, step, term, epoch)

    async def _commit_in_turn(self, job: Job, step: int, term: int, epoch: int) -> None:
        attempt = 0
        while True:
            if self._commit_moot(job, epoch):
                return  # repartitioned meanwhile, or the job ended while this one waited (e.g. its budget is spent)
            error = await self._commit_once(job, step, term, epoch)
            if error is None or self._commit_moot(job, epoch):
                return
            attempt += 1
            decision = lifecycle.after_commit_failure(step, job.total_steps, attempt, error)
            log.warning("job %s: checkpoint %d not committed (attempt %d): %s", job.job_id, step, attempt, error)
            if isinstance(decision, lifecycle.RetryCommit):
                await trio.sleep(decision.delay_s)
            elif isinstance(decision, lifecycle.FailJob):
                await self._finish(job, "failed", decision.error)
                return
            else:
                job.error = decision.error
                return

    def _commit_moot(self, job: Job, epoch: int) -> bool:
        """Whether a commit of plan ``epoch`` no longer counts: a repartition was asked for (a member failed, was
        excluded or left: the new plan resumes from the last commit before it) or ran, or the job ended."""
        return (job.epoch != epoch or job.plan is None or bool(job.restart_reason) or job.state in TERMINAL
                or not self._leads(job))  # fmt: skip

    async def _commit_once(self, job: Job, step: int, term: int, epoch: int) -> str | None:
        """Copy every shard of ``step`` to the owner, check it, sign the manifest; export at the last step.
        Returns why it failed, or None (committed, or moot: repartitioned meanwhile)."""
        from arceusd.checkpoint import Manifest, ShardRecord, atomic_write, file_matches, step_dir

        root = job.directory / "checkpoints"
        records, for_standby = [], []
        for peer, shard in sorted(job.reports.get(step, {}).items()):
            record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))
            if peer != job.standby:
                for_standby.append(record.name)
            path = step_dir(root, step) / record.name
            if peer != self.node.identity.peer_id and not await trio.to_thread.run_sync(file_matches, path, record):
                data = await self.transfers.fetch_shard(job, peer, step, record)
                if data is None:
                    return f"could not copy shard {record.name} of step {step} from {peer[:12]}"
                await trio.to_thread.run_sync(atomic_write, path, data)
            records.append(record)
        if self._commit_moot(job, epoch):
            return None  # the new plan resumes from an earlier step
        if job.plan is None or len(records) != sum(len(st.shares) for st in job.plan.stages):
            return f"checkpoint {step} has {len(records)} shard(s), not one per place in the plan"  # never committed
        try:
            refused = await shard_checks.check_contents(job, step_dir(root, step), step, self.node.identity.peer_id)
        except (OSError, RuntimeError) as exc:  # this device's trouble (FileworkError too): nobody is excluded
            return f"checkpoint {step} not checked: {exc}"
        if refused is not None and not self._commit_moot(job, epoch):  # a non-finite or misshapen shard
            self._request_restart(job, refused)
        if refused is not None or self._commit_moot(job, epoch):
            return None  # never committed
        manifest = Manifest(job.job_id, term, epoch, step, tuple(records), {"cursor": job.cursors.get(step)})
        try:
            await trio.to_thread.run_sync(self._commit_manifest, root, manifest, job.spec.checkpoint.keep)
        except Exception as exc:  # CheckpointError: a shard that does not match its report
            return f"checkpoint {step} not committed: {exc}"
        stop = on_commit(self.node, job, step, term, epoch)  # receipts; a reason when the budget is spent (market)
        job.committed_step = max(job.committed_step, step)
        job.record_checkpoint(step)
        for done in [s for s in {*job.reports, *job.witnesses, *job.complete} if s <= step]:
            job.reports.pop(done, None)
            job.cursors.pop(done, None)
            job.witnesses.pop(done, None)
            job.complete.pop(done, None)
        log.info("job %s: checkpoint %d committed", job.job_id, step)
        if job.standby and step < job.total_steps:
            self._spawn(self._sync_standby, job, step, tuple(for_standby))
        if step >= job.total_steps:
            await self._sync_owner(job, step, [r.name for r in records])
            await self._export(job, step, [step_dir(root, step) / r.name for r in records])
        elif stop is not None:
            await self._finish(job, "failed", stop)
        elif job.rebalance and job.epoch == epoch:
            self._request_restart(job, "rebalancing onto the member(s) that joined")
        return None

    def _commit_manifest(self, root: Path, manifest: Any, keep: int) -> None:
        """Check the shards against ``manifest`` and sign it (a thread: file reads and hashing)."""
        from arceusd.checkpoint import commit_manifest

        commit_manifest(root, manifest, self.node.identity, keep)

    async def _export(self, job: Job, step: int, paths: list[Path]) -> None:
        """Assemble the model from the shards at ``paths`` (in a child process) and finish the job."""
        vocab = str(leader_data(job)["path"]) if job.spec.data.kind == "text" else None
        try:
            path = await filework.export_model(job.directory, job.spec_bytes, job.job_id, step, paths, vocab)
        except Exception as exc:
            await self._finish(job, "failed", f"exporting the model failed: {exc}")
            return
        job.model_path = str(path)
        log.info("job %s: model saved to %s", job.job_id, path)
        await self._finish(job, "done", "")

    async def _finish(self, job: Job, state: str, error: str) -> None:
        """End ``job``: tell the members (a leader), stop our worker, and leave the job's election once the
        members were told (leaving first would let them elect a standby for a job that is over)."""
        job.state, job.error = state, error
        stops: list[tuple[str, str]] = []
        if job.plan is not None and self._leads(job):  # a device that does not lead commands nobody
            stops = [(peer, job.members[peer].address)
                     for peer in sorted(set(job.plan_peers()) | ({job.owner} & set(job.members)))
                     if peer != self.node.identity.peer_id and peer in job.members]  # fmt: skip
        self._spawn(self._stop_members_then_untrack, job, JobStop(job.job_id, job.term, state), stops)
        await self._drop_own_worker(job)
        self._persist(job)
        job.finished.set()
        job.poke()

    async def _stop_members_then_untrack(self, job: Job, stop: JobStop, stops: list[tuple[str, str]]) -> None:
        async with trio.open_nursery() as nursery:
            for peer, address in stops:
                nursery.start_soon(self._send_stop, job, peer, stop, address)
        if lifecycle.ends_election(job.state):
            self._untrack(job)

    async def _send_stop(self, job: Job, peer: str, stop: JobStop, address: str) -> None:
        await self.peers.request(address, peer, stop, timeout=10.0, job_id=job.job_id, term=job.term,
                                 epoch=job.epoch)  # fmt: skip

    async def _on_stop(self, header: Header, msg: JobStop) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or await self._check_leader(header, job, epochs=False):
            return JobAck(False, "not from this job's leader")
        job.state = stop_state(msg.reason)  # a known state only, never the sender's text (issue #19)
        await self._drop_own_worker(job)
        if lifecycle.ends_election(job.state):
            self._untrack(job)
        return JobAck(True)

    def _on_member_changed(self, change: MemberChanged) -> None:
        if change.state not in (MemberState.DEAD, MemberState.LEFT):
            return
        for job in self.jobs.values():
            if self._leads(job):
                job.announced.discard(change.peer)  # announce again if it comes back
                in_plan = change.peer in job.plan_peers()
                if change.peer in job.members and job.state in ("waiting", "paused"):
                    del job.members[change.peer]
                if in_plan or job.state == "recovering":
                    self._request_restart(job, f"member {change.peer[:12]} is {change.state.value}")
            elif change.peer == job.leader and job.state not in TERMINAL:
                job.state, job.error = "paused", f"the job's leader {job.leader[:12]} is {change.state.value}"
                self._spawn(self._drop_own_worker, job)


async def serve_jobs(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Daemon service: the job manager (needs the peer network service started first)."""
    if node.peers is None:
        raise RuntimeError("serve_jobs needs the peer network (serve_peer_network) to start first")
    manager = JobManager(node, node.peers)
    node.jobs = manager
    await manager.run(task_status=task_status)


__all__ = ["HANDED_OVER", "JOB_DONE", "OWNER_FILE", "JobManager", "serve_jobs", "worker_device"]
