"""Jobs in the daemon: submit, announce, join, plan, start workers, follow progress, checkpoint, export.

Roles: the *owner* submitted the job (it holds the data and gets the model); *members* joined it. The job's
*leader* coordinates planning, starting, checkpoint commits and repartitions; it serves the data and signs the
checkpoints. The owner leads while it lives. Each plan names a *standby* member, which receives the data set
once and, after every commit, the signed manifest and the other workers' shards (:mod:`arceusd.jobs.standby`).
The job's election (:mod:`arceusd.election`, the leader ranked first, the standby second) lets the standby win
a new term once membership declares the leader dead and a majority of the plan agrees; it then leads: gathers
the survivors' shards, re-slices, and carries on to the end (the model is saved on it). Without a majority, or
without a standby that holds the data, the members pause until the owner returns. An owner that returns after
its standby took over is told by its members who leads (:data:`HANDED_OVER`) and joins that leader as a member;
so is an owner that membership declared dead while it lived (a stall under load): its members refuse its commands
naming the leader they follow (:mod:`arceusd.jobs.leadership`), and it joins that leader instead of repartitioning
until the job fails. Either way the leader hands the owner the final checkpoint and the owner exports the model
too (it is the user's).
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
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from arceusd.control import RequestError
from arceusd.jobs import leadership
from arceusd.jobs.job import TERMINAL, Job
from arceusd.jobs.supervisor import WorkerFailed, WorkerProcess
from arceusd.membership.events import MemberChanged, MemberState
from arceusd.node import Node
from arceusd.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import (
    SHARD_CHUNK,
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
    ShardData,
    ShardRequest,
    StandbySync,
)
from protocol.messages import Address, JobAnnounce, JoinReply, JoinRequest

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
REJOIN_GRACE_S = 15.0
"""After the owner restarts, how long it waits for the job's old members to join again before planning."""

MAX_RESTARTS_PER_CHECKPOINT = 4
"""Repartitions that resume from the same checkpoint before the job is declared failed."""

LINK_TTL_S = 600.0
"""How long a measured link (round trip, bandwidth, per-message cost) is used for plans before it is measured
again."""

JOB_DONE = "the job is done"
"""A leader's answer to a join once the job finished (what a returning owner learns the end from)."""

HANDED_OVER = leadership.HANDED_OVER
"""A member's answer to its returning owner's announce (and its refusal of any command from a peer it does not
follow), followed by the peer id that leads the job now (:func:`arceusd.jobs.leadership.refusal`)."""


class JobManager:
    def __init__(self, node: Node, peers: PeerService) -> None:
        self.node = node
        self.peers = peers
        self.jobs: dict[str, Job] = {}
        self._offer: Any = None
        self._nursery: trio.Nursery | None = None
        self.root = node.paths.jobs_dir
        self._ready = trio.Event()
        self._links: dict[str, tuple[float, Any]] = {}  # peer -> (when measured, partitioner Link)

    @staticmethod
    def _preload() -> None:
        """Import the torch-heavy job modules in a worker thread, so no handler stalls the event loop on them."""
        import arceusd.checkpoint
        import arceusd.jobs.export
        import arceusd.jobs.planning
        import arceusd.jobs.spec
        import arceusd.worker.protocol  # noqa: F401

    async def _load_modules(self) -> None:
        await trio.to_thread.run_sync(self._preload)
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

    def _persist(self, job: Job) -> None:
        """The owner's durable record of a job (enough to resume it after this daemon restarts)."""
        from arceusd.checkpoint import atomic_write

        if job.role != "owner":
            return
        record = {"job_id": job.job_id, "owner": job.owner, "spec_hash": job.spec_hash,
                  "base_dir": str(job.spec.base_dir), "term": job.term, "epoch": job.epoch, "state": job.state,
                  "members": sorted(job.members), "model_path": job.model_path}  # fmt: skip
        try:
            atomic_write(job.directory / OWNER_FILE, json.dumps(record, indent=1).encode())
        except OSError as exc:
            log.warning("job %s: cannot save its state: %s", job.job_id, exc)

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
        peers.register(ShardRequest, gate(self._on_shard_request))
        peers.register(ResumeRequest, gate(self._on_resume_request))
        peers.register(StandbySync, gate(self._on_standby_sync))
        peers.register(DataRequest, gate(self._on_data_request))
        peers.register(LinkEcho, self._on_link_echo)
        peers.listeners.append(self._on_member_changed)
        if self.node.elections is not None:
            self.node.elections.on_leader_change(self._on_leader_change)
        self.node.methods.update({
            "submit": gate(self._m_submit), "join": gate(self._m_join), "jobs": gate(self._m_jobs),
            "job": gate(self._m_job), "cancel": gate(self._m_cancel), "leave": gate(self._m_leave),
        })  # fmt: skip
        self.node.sections["jobs"] = lambda: [j.summary() for j in self.jobs.values()]
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

    def _spawn(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the manager's nursery; a failure is logged (and fails its job when it is the
        leader loop), never allowed to take the daemon down."""
        assert self._nursery is not None

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                log.exception("job task %s failed", getattr(fn, "__name__", fn))
                job = args[0] if args and isinstance(args[0], Job) else None
                if job is not None and fn == self._lead and job.state not in TERMINAL:
                    await self._finish(job, "failed", f"internal error in the job's leader: {exc!r}")

        self._nursery.start_soon(guarded)

    async def offer(self) -> Any:
        """This device's offer (measured once in a child process, cached on disk for a day); the memory it lends
        is capped by ``lend_memory_mib`` when the device's owner set one."""
        from arceusd.jobs.planning import Offer

        if self._offer is None:
            result = await trio.run_process(
                [sys.executable, "-m", "arceusd.jobs.probe", str(self.node.paths.root),
                 str(self.node.config.worker_threads)],
                capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise RequestError(f"measuring this device failed: {result.stderr.decode()[-500:]}")
            m = json.loads(result.stdout.decode().strip().splitlines()[-1])
            memory = int(m["memory_bytes"])
            if self.node.config.lend_memory_mib:  # the device's owner caps what a job may use
                memory = min(memory, self.node.config.lend_memory_mib << 20)
            self._offer = Offer(self.node.identity.peer_id, self.node.addresses.get("peer", ""),
                                m["flops_per_s"], memory, m["kind"], float(m.get("block_efficiency", 1.0)),
                                float(m.get("dispatch_s", 0.0)), float(m.get("adamw_s_per_param", 0.0)),
                                float(m.get("sgd_s_per_param", 0.0)))  # fmt: skip
        return self._offer

    def find(self, job_ref: str) -> Job:
        matches = [j for jid, j in self.jobs.items() if jid.startswith(job_ref)] if job_ref else []
        if len(matches) != 1:
            known = ", ".join(sorted(self.jobs)) or "none"
            raise RequestError(f"no job matches {job_ref!r} (known jobs: {known})" if not matches
                               else f"{job_ref!r} matches several jobs; give more of the id")  # fmt: skip
        return matches[0]

    # ---------------------------------------------------------------------------------------------- control
    async def _m_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        from arceusd.jobs.spec import JobSpecError, job_id, load_spec, spec_hash, to_dict

        path = params.get("spec_path")
        if not isinstance(path, str):
            raise RequestError("submit needs 'spec_path'")
        min_members = int(params.get("min_members", 1))
        if min_members < 1:
            raise RequestError("min_members must be >= 1")
        try:
            spec = await trio.to_thread.run_sync(load_spec, path)
        except JobSpecError as exc:
            raise RequestError(str(exc)) from None
        except OSError as exc:
            raise RequestError(f"cannot read the job spec {path}: {exc.strerror}") from None
        digest = spec_hash(spec)
        jid = job_id(digest, self.node.identity.peer_id, os.urandom(16))
        spec_bytes = json.dumps(to_dict(spec), sort_keys=True).encode()
        job = Job(jid, spec, spec_bytes, digest, self.node.identity.peer_id, self.node.addresses.get("peer", ""),
                  "owner", self.root / jid, min_members=min_members,
                  total_steps=spec.training.steps)  # fmt: skip
        job.directory.mkdir(parents=True, exist_ok=True)
        (job.directory / "spec.json").write_bytes(spec_bytes)
        self.jobs[jid] = job
        job.members[self.node.identity.peer_id] = await self.offer()
        self._persist(job)
        self._spawn(self._lead, job)
        log.info("job %s (%s) submitted; waiting for %d member(s)", jid, spec.name, min_members)
        return {"job_id": jid, "spec_hash": digest, "name": spec.name, "directory": str(job.directory)}

    async def _m_join(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        return await self.join(job)

    async def _m_jobs(self, _params: dict[str, Any]) -> list[dict[str, Any]]:
        return [j.summary() for j in sorted(self.jobs.values(), key=lambda j: j.created)]

    async def _m_job(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.find(str(params.get("job_id", ""))).summary(full=True)

    async def _m_cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        if job.role != "owner" and not self._leads(job):
            raise RequestError("only the job's owner or its leader can cancel it")
        await self._finish(job, "cancelled", "cancelled by the owner")
        return {"job_id": job.job_id, "state": job.state}

    async def _m_leave(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        if job.role == "owner":
            raise RequestError("the owner cannot leave its own job (it serves the data); cancel it instead")
        if job.role != "member":
            raise RequestError(f"this device is not a member of job {job.job_id[:12]}")
        if self._leads(job):
            raise RequestError("this device leads the job now (its owner is gone); cancel it instead")
        job.role, job.state = "seen", "left"
        report = JobReport(job.job_id, job.epoch, json.dumps({"event": "leave"}))
        reply = await self.peers.request(job.leader_address, job.leader, report, timeout=10.0, job_id=job.job_id,
                                         term=job.term, epoch=job.epoch)  # fmt: skip
        told = isinstance(reply, JobAck) and reply.ok
        await self._drop_own_worker(job)  # after the leader knows why our links are about to break
        return {"job_id": job.job_id, "reason": "" if told else "the leader did not answer; it will notice"}
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
        return len(job.members) >= job.min_members

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
        old = job.plan.peer_ids if job.plan is not None else ()
        job.plan, job.reports = None, {}
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

    async def _drop_own_worker(self, job: Job) -> None:
        worker, job.worker = job.worker, None
        if worker is not None:
            await worker.stop(grace=0.5)

    async def _plan_and_start(self, job: Job) -> None:
        """Plan over ``job.members``, slice the resume checkpoint, start every worker, then send ``go``."""
        from arceusd.jobs.planning import (
            PlanError,
            encode_start,
            estimated_links,
            flops_shares,
            make_plan,
            worker_stages,
        )
        from arceusd.jobs.recovery import prepare_resume

        resuming = job.state == "recovering" or job.committed_step > 0
        job.state = "planning"
        me = self.node.identity.peer_id
        rtt = {(me, p): (i.rtt_ms or 1.0) / 1000 for p, i in self.peers.info.items()}
        offers = [job.members[p] for p in sorted(job.members)]
        measured = await self._measure_links(job)
        job.links = {p: {"rtt_ms": round(m.rtt_s * 1e3, 3), "bandwidth_mb_s": round(m.bandwidth_bytes_per_s / 1e6, 2),
                         "message_ms": round(m.message_s * 1e3, 4)} for p, m in measured.items()}  # fmt: skip
        links = estimated_links(me, measured, sorted(job.members))
        try:
            job.inputs, job.plan = await trio.to_thread.run_sync(make_plan, job.spec, offers, rtt, links)
        except PlanError as exc:
            job.state = "paused" if resuming else "waiting"
            job.error = f"no plan fits the {len(offers)} member(s): {exc}" + (
                "; paused until more capacity joins" if resuming else "")  # fmt: skip
            job.min_members = len(job.members) + 1
            log.warning("job %s: %s", job.job_id, job.error)
            return
        if me not in job.plan.peer_ids:
            await self._finish(job, "failed", "the plan leaves out the owner, who serves the data")
            return
        job.shares = flops_shares(job.plan, job.inputs)
        job.epoch += 1
        job.state = "starting"
        job.standby = self._choose_standby(job)
        self._track(job, list(job.plan.peer_ids), [me, job.standby])
        stages = worker_stages(job.plan)
        resume = None
        if resuming:
            replicas = await self._repair_checkpoint(job)
            resume = await trio.to_thread.run_sync(prepare_resume, job.directory, job.spec.model, stages,
                                                   job.epoch, sorted(job.leaders), replicas)  # fmt: skip
        start_step = resume.step if resume is not None else 0
        job.resume_files = {p: f.name for p, f in resume.files.items()} if resume is not None else {}
        job.step = start_step
        job.history = [h for h in job.history if h[0] <= start_step]
        if job.recoveries and job.recoveries[-1].epoch == job.epoch:
            job.recoveries[-1].resumed_step = start_step
        inputs_data, plan_data = encode_start(job.inputs, job.plan)
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
                reply = await self._start_worker(job, stages, job.plan, local)
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
                for peer in job.plan.peer_ids:
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
        for peer in job.plan.peer_ids:
            if peer == me:
                await self._go(job, go)
            else:
                await self.peers.request(reach[peer], peer, go, timeout=30.0,
                                         job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
        if job.state == "starting":
            job.state = "running"
        job.error = ""
        log.info("job %s running on %d devices (term %d, epoch %d, from step %d)", job.job_id, len(addresses),
                 job.term, job.epoch, start_step)  # fmt: skip

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
                data = await self._fetch_shard(job, peer, step, record.name)
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
                job.plan, job.reports, job.restart_reason = None, {}, ""
            if reply.accepted:
                job.state = "joined"
                job.error = f"{leader[:12]} leads the job (its standby took over while this device was away)"
            elif reply.reason == JOB_DONE:
                job.state = "done"
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
        offer = Offer(msg.peer_id, f"{msg.address.host}:{msg.address.port}", msg.flops_per_s,
                      msg.free_memory_bytes, msg.kind, msg.block_efficiency, msg.dispatch_s, msg.adamw_s_per_param,
                      msg.sgd_s_per_param, msg.message_s)  # fmt: skip
        try:
            offer.check()
        except ValueError as exc:
            return JoinReply(msg.job_id, False, f"the offer is not usable: {exc}")
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
        from arceusd.jobs.spec import JobSpecError, spec_from_dict

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
            return JobAck(False, "bad spec")
        member = self.peers.membership.members.get(msg.owner)
        owner_address = member.address if member is not None else ""
        job = Job(msg.job_id, spec, msg.spec, msg.spec_hash.hex(), msg.owner, owner_address, "seen",
                  self.root / msg.job_id, state="announced", total_steps=spec.training.steps)  # fmt: skip
        self.jobs[msg.job_id] = job
        log.info("job %s (%s) announced by %s", msg.job_id, spec.name, msg.owner[:12])
        if self.node.config.auto_join:
            self._spawn(self._auto_join, job)
        return JobAck(True)

    async def _auto_join(self, job: Job) -> None:
        """Join an announced job; an owner that does not answer yet (e.g. still restoring its jobs after a
        restart) is asked again a few times, backing off."""
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

    async def _check_leader(self, header: Header, job: Job | None, epochs: bool = True) -> str:
        """Why a leader command must be refused ('' when it is acceptable).

        Acceptable: from our leader, not older than what we have (``epochs=False``: only the term counts); or
        with a newer term from the peer the job's election made leader (a standby that took over), which then
        becomes our leader. A refusal because we follow another peer names it (:func:`leadership.refusal`), so
        a leader that was replaced while membership thought it dead learns whom to join."""
        if job is None:
            return "unknown job"
        verdict = leadership.judge_command(header.sender, header.term, header.epoch, job.leader, job.term,
                                           job.epoch, epochs)  # fmt: skip
        if isinstance(verdict, leadership.Accept):
            return ""
        if isinstance(verdict, leadership.Refuse):
            return verdict.reason
        if await self._elected(job, header.sender):
            log.info("job %s: following %s, elected leader (term %d)", job.job_id, header.sender[:12], header.term)
            self._follow_leader(job, header.sender)
            job.term = header.term
            return ""
        return leadership.refusal(job.leader, job.term)  # tells a replaced leader whom we follow

    def _follow_leader(self, job: Job, peer: str) -> None:
        member = self.peers.membership.members.get(peer)
        job.leader = peer
        job.leader_address = member.address if member is not None else job.leader_address
        job.leaders.add(peer)

    async def _elected(self, job: Job, peer: str, wait_s: float = 3.0) -> bool:
        """Whether the job's election has ``peer`` as leader (waiting a little: its announce may still be on its
        way when its first command arrives)."""
        elections = self.node.elections
        if elections is None:
            return False
        with trio.move_on_after(wait_s):
            while True:
                current = elections.leader(job.job_id)
                if current is not None and current[0] == peer:
                    return True
                await trio.sleep(0.05)
        return False

    def _leads(self, job: Job) -> bool:
        return job.leader == self.node.identity.peer_id

    def _track(self, job: Job, members: list[str], ranking: list[str]) -> None:
        """Elect the job's leader among the plan's members: the leader first, then the standby."""
        if self.node.elections is None:
            return
        try:
            self.node.elections.track(job.job_id, members, [p for p in ranking if p])
        except ValueError as exc:
            log.warning("job %s: cannot track its election: %s", job.job_id, exc)

    def _choose_standby(self, job: Job) -> str:
        """The plan member that stands by to lead: the one offering the most memory (ties: lowest id)."""
        me = self.node.identity.peer_id
        others = [p for p in job.plan.peer_ids if p != me and p in job.members]
        if not others:
            return ""
        return str(min(others, key=lambda p: (-job.members[p].memory_bytes, p)))

    # ---------------------------------------------------------------------------------------------- standby
    async def _sync_standby(self, job: Job, step: int, shards: tuple[str, ...]) -> None:
        """Leader: tell the standby that ``step`` is committed (the signed manifest), the shards to copy from us
        (every one but its own: then each shard has three copies, its writer's, ours and the standby's), and the
        data set's files, so it can lead if we die."""
        from arceusd.checkpoint import MANIFEST_NAME, step_dir
        from arceusd.jobs.standby import data_files, offers_to_wire

        standby = job.standby
        offer = job.members.get(standby)
        if not standby or offer is None:
            return
        manifest = await trio.to_thread.run_sync((step_dir(job.directory / "checkpoints", step) / MANIFEST_NAME)
                                                 .read_bytes)  # fmt: skip
        names = tuple(p.name for p in data_files(self._leader_data(job)))
        offers = offers_to_wire(job.members[p] for p in sorted(job.members) if job.plan and p in job.plan.peer_ids)
        sync = StandbySync(job.job_id, step, manifest, shards, names, offers)
        reply = await self.peers.request(offer.address, standby, sync, timeout=10.0, job_id=job.job_id,
                                         term=job.term, epoch=job.epoch)  # fmt: skip
        if not (isinstance(reply, JobAck) and reply.ok):
            log.warning("job %s: the standby %s refused checkpoint %d: %s", job.job_id, standby[:12], step,
                        getattr(reply, "reason", "no answer"))  # fmt: skip
            leader = leadership.followed_leader(reply.reason) if isinstance(reply, JobAck) else None
            if leader is not None and leader != self.node.identity.peer_id:
                await self._hand_over(job, leader)

    async def _on_standby_sync(self, header: Header, msg: StandbySync) -> JobAck:
        from arceusd.checkpoint import CheckpointError, parse_manifest
        from arceusd.jobs.standby import StandbyError, check_names, offers_from_wire

        job = self.jobs.get(msg.job_id)
        why = await self._check_leader(header, job, epochs=False)
        if why or job is None:
            return JobAck(False, why)
        if job.role == "owner" and not self._leads(job):
            return await self._receive_final(job, header.sender, msg)
        if job.standby != self.node.identity.peer_id:
            return JobAck(False, "this device is not the job's standby")
        try:
            manifest, _ = parse_manifest(msg.manifest, sorted(job.leaders), "the leader's manifest")
            if manifest.job_id != job.job_id or manifest.step != msg.step:
                raise CheckpointError("the manifest is for another job or step")
            if not set(msg.shards) <= {r.name for r in manifest.shards}:
                raise CheckpointError("the sync names shards the manifest does not list")
            if job.standby_data is None:
                check_names(job.spec.data.kind, msg.data_files)
            offers = offers_from_wire(msg.offers, job.plan.peer_ids if job.plan is not None else ())
        except (CheckpointError, StandbyError) as exc:
            log.warning("job %s: refusing a standby sync: %s", job.job_id, exc)
            return JobAck(False, f"refused: {exc}")
        job.standby_offers = offers
        self._spawn(self._standby_copy, job, header.sender, msg, manifest)
        return JobAck(True)

    async def _sync_owner(self, job: Job, step: int, names: list[str]) -> None:
        """A leader that is not the job's owner (its standby took over): hand the owner, when it joined this
        leader, the final checkpoint (the signed manifest and its shards' names) before exporting, so the model
        lands on the owner's disk as well. The owner copies, checks and exports before it answers; a failure
        only costs the owner its copy (the model is still saved here)."""
        from arceusd.checkpoint import MANIFEST_NAME, step_dir

        offer = job.members.get(job.owner)
        if job.owner == self.node.identity.peer_id or offer is None:
            return
        manifest = await trio.to_thread.run_sync((step_dir(job.directory / "checkpoints", step) / MANIFEST_NAME)
                                                 .read_bytes)  # fmt: skip
        sync = StandbySync(job.job_id, step, manifest, tuple(names))
        reply = await self.peers.request(offer.address, job.owner, sync, timeout=60.0, job_id=job.job_id,
                                         term=job.term, epoch=job.epoch)  # fmt: skip
        if not (isinstance(reply, JobAck) and reply.ok):
            log.warning("job %s: the owner %s did not take the final checkpoint: %s", job.job_id, job.owner[:12],
                        getattr(reply, "reason", "no answer"))  # fmt: skip

    async def _receive_final(self, job: Job, leader: str, msg: StandbySync) -> JobAck:
        """Owner that handed its job over: copy the final checkpoint from the leader, check every shard against
        the leader's signed manifest, and export the model here (the answer says whether that worked)."""
        from arceusd.checkpoint import CheckpointError, parse_manifest, step_dir

        try:
            manifest, _ = parse_manifest(msg.manifest, sorted(job.leaders), "the leader's manifest")
            if manifest.job_id != job.job_id or manifest.step != msg.step or msg.step < job.total_steps:
                raise CheckpointError("the owner takes the final checkpoint of its own job only")
            if set(msg.shards) != {r.name for r in manifest.shards}:
                raise CheckpointError("the sync must name exactly the manifest's shards")
        except CheckpointError as exc:
            log.warning("job %s: refusing the final checkpoint: %s", job.job_id, exc)
            return JobAck(False, f"refused: {exc}")
        folder = step_dir(job.directory / "checkpoints", msg.step)
        async with job.sync_lock:
            failed = await self._copy_step(job, leader, msg, {r.name: r for r in manifest.shards})
            if failed is not None:
                return JobAck(False, f"shard {failed} of step {msg.step} did not arrive intact")
            job.committed_step = max(job.committed_step, msg.step)
            if not job.model_path:  # "" until exported (a repeated sync exports once)
                await self._export(job, msg.step, [folder / r.name for r in manifest.shards])
        return JobAck(bool(job.model_path), job.error[:400])

    async def _standby_copy(self, job: Job, leader: str, msg: StandbySync, manifest: Any) -> None:
        """Standby: copy the data (once) and the leader's shards of a committed step; each is checked before
        it is kept; the manifest is written last, so a step is complete here only when all of it is."""
        from arceusd.checkpoint import prune

        async with job.sync_lock:
            if job.standby_data is None and msg.data_files and not await self._copy_data(job, leader, msg.data_files):
                return
            failed = await self._copy_step(job, leader, msg, {r.name: r for r in manifest.shards})
            if failed is not None:
                log.warning("job %s: the leader's shard %s of step %d did not arrive intact", job.job_id, failed,
                            msg.step)  # fmt: skip
                return
            await trio.to_thread.run_sync(prune, job.directory / "checkpoints", job.spec.checkpoint.keep)
            job.committed_step = max(job.committed_step, msg.step)

    async def _copy_step(self, job: Job, leader: str, msg: StandbySync, records: Mapping[str, Any]) -> str | None:
        """Copy the leader's shards ``msg.shards`` of step ``msg.step`` (each checked against its manifest record;
        one already here and intact is kept), then the manifest, last: the step is complete here only when all
        of it is. Returns the name of a shard that did not arrive intact (nothing more is written then)."""
        from arceusd.checkpoint import MANIFEST_NAME, atomic_write, file_matches, matches, step_dir

        folder = step_dir(job.directory / "checkpoints", msg.step)
        for name in msg.shards:
            if await trio.to_thread.run_sync(file_matches, folder / name, records[name]):
                continue
            data = await self._download(job, leader, job.leader_address,
                                        lambda offset, n=name: ShardRequest(job.job_id, msg.step, n, offset))
            if data is None or not matches(data, records[name]):
                return name
            await trio.to_thread.run_sync(atomic_write, folder / name, data)
        await trio.to_thread.run_sync(atomic_write, folder / MANIFEST_NAME, msg.manifest)
        return None

    async def _copy_data(self, job: Job, leader: str, names: tuple[str, ...]) -> bool:
        """Standby: download the leader's data files and check them against the spec's digest; a copy that
        does not arrive whole or does not match is removed, never kept half-written."""
        import shutil

        from arceusd.checkpoint import atomic_write
        from arceusd.jobs.standby import DATA_FOLDER, StandbyError, check_copy, copy_entry

        folder = job.directory / DATA_FOLDER
        for index, name in enumerate(names):
            data = await self._download(job, leader, job.leader_address,
                                        lambda offset, i=index: DataRequest(job.job_id, i, offset))  # fmt: skip
            if data is None:
                log.warning("job %s: the leader did not serve data file %s", job.job_id, name)
                break
            await trio.to_thread.run_sync(atomic_write, folder / name, data)
        else:
            entry = copy_entry(job.directory, json.loads(job.spec_bytes)["data"], names)
            try:
                await trio.to_thread.run_sync(check_copy, entry, job.spec.data.sha256)
                job.standby_data = entry
                log.info("job %s: holding a checked copy of the data as the standby", job.job_id)
                return True
            except StandbyError as exc:
                log.warning("job %s: %s", job.job_id, exc)
        await trio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
        return False

    async def _on_data_request(self, header: Header, msg: DataRequest) -> ShardData | JobAck:
        from arceusd.jobs.standby import data_files

        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job) or header.sender != job.standby:
            return JobAck(False, "the data goes to the job's standby only")
        files = data_files(self._leader_data(job))
        if not 0 <= msg.index < len(files):
            return JobAck(False, "no such data file")
        return _serve_chunk(files[msg.index], msg.offset)

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
                       if p in alive and p in job.plan.peer_ids and p not in (old, me)}  # fmt: skip
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

    async def _on_start(self, header: Header, msg: JobStart) -> JobStartReply:
        from arceusd.jobs.planning import PlanRefused, flops_shares, verify_start, worker_stages
        from arceusd.jobs.recovery import ResumeError, ResumePoint

        job = self.jobs.get(msg.job_id)
        why = await self._check_leader(header, job)
        if why or job is None:
            return JobStartReply(msg.job_id, False, why)
        if job.role not in ("member", "owner"):
            return JobStartReply(msg.job_id, False, "this device has not joined the job")
        if msg.spec != job.spec_bytes:
            return JobStartReply(msg.job_id, False, "the spec differs from the announced one")
        try:
            resume = ResumePoint.from_wire(msg.resume)
            inputs, the_plan = await trio.to_thread.run_sync(verify_start, job.spec, msg.inputs, msg.plan,
                                                             await self.offer())  # fmt: skip
        except (PlanRefused, ResumeError) as exc:
            log.warning("job %s: refusing the start: %s", job.job_id, exc)
            return JobStartReply(msg.job_id, False, f"start refused: {exc}")
        if resume is not None and resume.step != msg.resume_step:
            return JobStartReply(msg.job_id, False, "start refused: the resume step is inconsistent")
        if msg.standby and msg.standby not in the_plan.peer_ids:
            return JobStartReply(msg.job_id, False, "start refused: the standby is not in the plan")
        await self._drop_own_worker(job)  # a newer epoch replaces whatever ran before
        job.term, job.epoch, job.inputs, job.plan = header.term, header.epoch, inputs, the_plan
        job.shares = flops_shares(the_plan, inputs)
        job.standby = msg.standby
        self._track(job, list(the_plan.peer_ids), [header.sender, msg.standby])
        local = None
        if resume is not None:
            mine = resume.files.get(self.node.identity.peer_id)
            if mine is None:
                return JobStartReply(msg.job_id, False, "start refused: no resume slice for this device")
            try:
                local = await self._fetch_resume(job, header.sender, resume.step, mine)
            except (ResumeError, OSError) as exc:
                return JobStartReply(msg.job_id, False, f"could not get the resume slice: {exc}")
        job.step = msg.resume_step
        return await self._start_worker(job, worker_stages(the_plan), the_plan, local)

    async def _fetch_resume(self, job: Job, leader: str, step: int, mine: Any) -> Any:
        """Download this device's resume slice from the leader, check it, store it; its ResumeConfig."""
        from arceusd.checkpoint import atomic_write
        from arceusd.jobs.recovery import ResumeError, check_file, resume_dir
        from arceusd.worker.protocol import ResumeConfig

        data = await self._download(job, leader, job.leader_address,
                                    lambda offset: ResumeRequest(job.job_id, job.epoch, mine.name, offset))  # fmt: skip
        if data is None:
            raise ResumeError("the leader did not serve it")
        check_file(data, mine)
        path = resume_dir(job.directory, job.epoch) / mine.name
        await trio.to_thread.run_sync(atomic_write, path, data)
        return ResumeConfig(step, str(path), None)

    async def _download(self, job: Job, peer: str, address: str, request: Any) -> bytes | None:
        """A file in :data:`SHARD_CHUNK` pieces: ``request(offset)`` is the message for the next piece."""
        data = bytearray()
        for _ in range(10_000):
            reply = await self.peers.request(address, peer, request(len(data)), timeout=60.0, job_id=job.job_id)
            if not isinstance(reply, ShardData) or reply.total > 1 << 34:
                return None
            data += reply.data
            if len(data) >= reply.total or not reply.data:
                break
        return bytes(data)

    async def _on_resume_request(self, header: Header, msg: ResumeRequest) -> ShardData | JobAck:
        from arceusd.jobs.recovery import resume_dir

        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job):
            return JobAck(False, "not the leader of that job")
        if msg.epoch != job.epoch or job.resume_files.get(header.sender) != msg.name:
            return JobAck(False, "that resume slice is not this device's in the current plan")
        return _serve_chunk(resume_dir(job.directory, msg.epoch) / msg.name, msg.offset)

    async def _start_worker(self, job: Job, stages: Any, the_plan: Any, resume: Any = None) -> JobStartReply:
        from arceusd.worker.protocol import WorkerConfig

        job.directory.mkdir(parents=True, exist_ok=True)
        host = self.node.addresses.get("peer", "127.0.0.1:0").rpartition(":")[0]
        spec_dict = json.loads(job.spec_bytes)
        if self._leads(job):
            spec_dict["data"] = self._leader_data(job)
        offer = await self.offer()
        config = WorkerConfig(
            job_id=job.job_id, term=job.term, epoch=job.epoch, spec=spec_dict, stages=stages,
            micro_batches=the_plan.micro_batches, schedule=self._schedule(job, the_plan),
            peer_id=self.node.identity.peer_id, state_dir=str(self.node.paths.root),
            listen_host=self.node.config.listen_host, owner=job.leader,
            checkpoint_dir=str(job.directory / "checkpoints"),
            checkpoint_interval=job.spec.checkpoint.interval_steps, total_steps=job.total_steps,
            threads=self.node.config.worker_threads, cpus=self.node.config.worker_cpus, resume=resume,
            device=worker_device(offer.kind),
        )  # fmt: skip
        path = job.directory / f"worker-{job.epoch}.json"
        path.write_text(config.to_json())
        worker = WorkerProcess(path, job.directory / "worker.log")
        job.worker = worker
        job.stage_times.clear()  # a new plan: its stage times are not the old one's
        try:
            port = await worker.start()
        except WorkerFailed as exc:
            if job.worker is worker:
                job.worker = None
            return JobStartReply(job.job_id, False, str(exc)[-1500:])
        job.state = "starting"
        return JobStartReply(job.job_id, True, "", f"{host}:{port}")

    @staticmethod
    def _leader_data(job: Job) -> dict[str, Any]:
        """The data entry of the leader's worker (it serves the batches): on the owner the spec's files with
        absolute paths (the spec's are relative to its file), on a standby that took over its checked copy."""
        from arceusd.jobs.spec_types import resolve_path

        if job.role != "owner":
            if job.standby_data is None:
                raise RuntimeError("this device leads the job without a checked copy of its data (a bug)")
            return dict(job.standby_data)
        out = dict(json.loads(job.spec_bytes)["data"])
        for key in ("dir", "path"):
            if isinstance(out.get(key), str):
                out[key] = str(resolve_path(out[key], job.spec.base_dir).resolve())
        return out

    @staticmethod
    def _schedule(job: Job, the_plan: Any) -> str:
        forced = job.spec.training.schedule
        return str(the_plan.schedule if forced == "auto" else forced)

    async def _on_go(self, header: Header, msg: JobGo) -> JobAck:
        job = self.jobs.get(msg.job_id)
        why = await self._check_leader(header, job)
        if why or job is None:
            return JobAck(False, why)
        if header.epoch != job.epoch:
            return JobAck(False, f"go for epoch {header.epoch}, but this device started epoch {job.epoch}")
        await self._go(job, msg)
        return JobAck(True)

    async def _go(self, job: Job, msg: JobGo) -> None:
        if job.worker is None:
            return
        try:
            await job.worker.send({"cmd": "start", "addresses": {a.peer_id: a.address for a in msg.addresses}})
        except WorkerFailed as exc:
            log.warning("job %s: the worker is gone before go: %s", job.job_id, exc)
        job.state = "running"
        self._spawn(self._follow_worker, job, job.worker, job.epoch)

    async def _follow_worker(self, job: Job, worker: WorkerProcess, epoch: int) -> None:
        last_t, last_step = time.monotonic(), job.step
        finished = False
        try:
            async for event in worker.events():
                if job.worker is not worker:
                    break  # replaced by a newer plan epoch: its events no longer count
                kind = event.get("event")
                if kind == "step":
                    self._on_step(job, event)
                    now = time.monotonic()
                    if now - last_t >= 1.0:
                        steps = job.step - last_step
                        job.samples_per_s = steps * job.spec.training.batch_size / (now - last_t)
                        block = getattr(job.spec.model, "block_size", None)
                        job.tokens_per_s = job.samples_per_s * block if block else None
                        last_t, last_step = now, job.step
                elif kind == "eval":
                    job.val_loss = float(event["val_loss"])
                    job.val_accuracy = event.get("val_accuracy")
                elif kind in ("checkpoint", "done", "error"):
                    finished = finished or kind in ("done", "error")
                    await self._report(job, epoch, event)
        except WorkerFailed as exc:
            job.error = str(exc)
        code = await worker.kill()
        if job.worker is not worker or finished or job.state in TERMINAL:
            return
        await self._report(job, epoch, {"event": "lost",
                                        "message": f"the worker exited with code {code}: {worker.log_tail(3)}"})

    def _on_step(self, job: Job, event: dict[str, Any]) -> None:
        # the event names the step index just run; job.step counts completed steps
        job.step, job.loss, job.lr = int(event["step"]) + 1, float(event["loss"]), float(event["lr"])
        job.history.append((job.step, round(job.loss, 5)))
        job.stage_times.append((float(event.get("seconds", 0.0)), float(event.get("wait_seconds", 0.0))))
        job.credit(1)
        recovery = job.recoveries[-1] if job.recoveries else None
        if recovery is not None and recovery.first_step_after_s is None and recovery.epoch == job.epoch:
            recovery.first_step_after_s = round(time.monotonic() - recovery.began, 3)
            log.info("job %s: training again %.2f s after the failure", job.job_id, recovery.first_step_after_s)

    async def _report(self, job: Job, epoch: int, event: dict[str, Any]) -> None:
        """A worker event for the leader: handled here on the owner, sent as a JobReport from a member."""
        event["peer_id"] = self.node.identity.peer_id
        if self._leads(job):
            await self._handle_report(job, event)
            return
        report = JobReport(job.job_id, epoch, json.dumps(event))
        await self.peers.request(job.leader_address, job.leader, report, timeout=30.0,
                                 job_id=job.job_id, term=job.term, epoch=epoch)  # fmt: skip

    async def _on_report(self, header: Header, msg: JobReport) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job):
            return JobAck(False, "not the leader of that job")
        try:
            event = json.loads(msg.event)
        except ValueError:
            return JobAck(False, "malformed report")
        if not isinstance(event, dict):
            return JobAck(False, "malformed report")
        if event.get("event") == "leave" and header.sender in job.members:
            del job.members[header.sender]
            job.announced.add(header.sender)  # do not invite it straight back
            log.info("job %s: %s left", job.job_id, header.sender[:12])
            if job.plan is not None and header.sender in job.plan.peer_ids:
                self._request_restart(job, f"member {header.sender[:12]} left the job")
            return JobAck(True)
        if job.plan is None or header.sender not in job.plan.peer_ids or msg.epoch != job.epoch:
            job.stale_reports += 1
            return JobAck(False, f"report from outside the current plan epoch ({msg.epoch}; now {job.epoch})")
        event["peer_id"] = header.sender
        await self._handle_report(job, event)
        return JobAck(True)

    async def _handle_report(self, job: Job, event: dict[str, Any]) -> None:
        kind = event.get("event")
        peer = str(event["peer_id"])
        if kind in ("error", "lost"):
            # A worker's failure is usually a neighbour's: a killed process breaks its links. Repartition;
            # a job that fails again and again at the same checkpoint gives up (_restart).
            self._request_restart(job, f"worker on {peer[:12]} {'failed' if kind == 'error' else 'was lost'}: "
                                       f"{str(event.get('message'))[:300]}")  # fmt: skip
        elif kind == "checkpoint":
            step = int(event["step"])
            shard = event.get("shard") or {}
            job.reports.setdefault(step, {})[peer] = shard
            if event.get("cursor") is not None:
                job.cursors[step] = event["cursor"]
            expected = sum(len(s.shares) for s in job.plan.stages) if job.plan else 0
            if len(job.reports[step]) == expected:
                self._spawn(self._commit_checkpoint, job, step, job.term, job.epoch)

    async def _commit_checkpoint(self, job: Job, step: int, term: int, epoch: int) -> None:
        """Copy every shard of ``step`` to the owner, check it, sign the manifest; export at the last step."""
        from arceusd.checkpoint import Manifest, ShardRecord, atomic_write, commit_manifest, file_matches, step_dir

        root = job.directory / "checkpoints"
        records, for_standby = [], []
        for peer, shard in sorted(job.reports.get(step, {}).items()):
            record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))
            if peer != job.standby:
                for_standby.append(record.name)
            path = step_dir(root, step) / record.name
            if peer != self.node.identity.peer_id and not await trio.to_thread.run_sync(file_matches, path, record):
                data = await self._fetch_shard(job, peer, step, record.name)
                if data is None:
                    job.error = f"could not copy shard {record.name} of step {step} from {peer[:12]}"
                    log.warning("job %s: %s", job.job_id, job.error)
                    return
                await trio.to_thread.run_sync(atomic_write, path, data)
            records.append(record)
        if job.epoch != epoch:
            return  # repartitioned meanwhile: the new plan resumes from an earlier step
        manifest = Manifest(job.job_id, term, epoch, step, tuple(records), {"cursor": job.cursors.get(step)})
        try:
            await trio.to_thread.run_sync(commit_manifest, root, manifest, self.node.identity,
                                          job.spec.checkpoint.keep)  # fmt: skip
        except Exception as exc:  # CheckpointError: a shard that does not match its report
            job.error = f"checkpoint {step} not committed: {exc}"
            log.warning("job %s: %s", job.job_id, job.error)
            return
        job.committed_step = max(job.committed_step, step)
        for done in [s for s in job.reports if s <= step]:
            job.reports.pop(done, None)
            job.cursors.pop(done, None)
        log.info("job %s: checkpoint %d committed", job.job_id, step)
        if job.standby and step < job.total_steps:
            self._spawn(self._sync_standby, job, step, tuple(for_standby))
        if step >= job.total_steps:
            await self._sync_owner(job, step, [r.name for r in records])
            await self._export(job, step, [step_dir(root, step) / r.name for r in records])
        elif job.rebalance and job.epoch == epoch:
            self._request_restart(job, "rebalancing onto the member(s) that joined")

    async def _fetch_shard(self, job: Job, peer: str, step: int, name: str) -> bytes | None:
        offer = job.members.get(peer)
        if offer is None:
            return None
        return await self._download(job, peer, offer.address,
                                    lambda offset: ShardRequest(job.job_id, step, name, offset))  # fmt: skip

    async def _on_shard_request(self, header: Header, msg: ShardRequest) -> ShardData | JobAck:
        from arceusd.checkpoint import SHARD_NAME, step_dir

        job = self.jobs.get(msg.job_id)
        if job is None:
            return JobAck(False, "unknown job")
        to_standby = self._leads(job) and header.sender in (job.standby, job.owner)  # the owner: its model
        if not to_standby and header.sender != job.leader and not await self._elected(job, header.sender):
            return JobAck(False, "shards go to the job's leader (and the leader's to its standby) only")
        if not SHARD_NAME.match(msg.name):
            return JobAck(False, "bad shard name")
        return _serve_chunk(step_dir(job.directory / "checkpoints", msg.step) / msg.name, msg.offset)

    async def _export(self, job: Job, step: int, paths: list[Path]) -> None:
        from arceusd.jobs.export import assemble, write_model

        def work() -> Path:
            state = assemble(job.spec.model, [p.read_bytes() for p in paths])
            extra: dict[str, Any] = {"job_id": job.job_id, "step": step, "name": job.spec.name}
            if job.spec.data.kind == "text":
                from arceusd.data.text import load_text

                extra["vocab"] = "".join(load_text(Path(self._leader_data(job)["path"])).vocab.chars)
            return write_model(job.directory, job.spec.model, state, extra)

        try:
            path = await trio.to_thread.run_sync(work)
        except Exception as exc:
            await self._finish(job, "failed", f"exporting the model failed: {exc}")
            return
        job.model_path = str(path)
        log.info("job %s: model saved to %s", job.job_id, path)
        await self._finish(job, "done", "")

    async def _finish(self, job: Job, state: str, error: str) -> None:
        job.state, job.error = state, error
        if job.plan is not None and self._leads(job):  # a device that does not lead commands nobody
            stop = JobStop(job.job_id, job.term, state)
            for peer in sorted(set(job.plan.peer_ids) | ({job.owner} & set(job.members))):
                if peer != self.node.identity.peer_id and peer in job.members:
                    self._spawn(self._send_stop, job, peer, stop, job.members[peer].address)
        await self._drop_own_worker(job)
        self._persist(job)
        job.finished.set()
        job.poke()

    async def _send_stop(self, job: Job, peer: str, stop: JobStop, address: str) -> None:
        await self.peers.request(address, peer, stop, timeout=10.0, job_id=job.job_id, term=job.term,
                                 epoch=job.epoch)  # fmt: skip

    async def _on_stop(self, header: Header, msg: JobStop) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or await self._check_leader(header, job, epochs=False):
            return JobAck(False, "not from this job's leader")
        job.state = msg.reason or "stopped"
        await self._drop_own_worker(job)
        return JobAck(True)

    def _on_member_changed(self, change: MemberChanged) -> None:
        if change.state not in (MemberState.DEAD, MemberState.LEFT):
            return
        for job in self.jobs.values():
            if self._leads(job):
                job.announced.discard(change.peer)  # announce again if it comes back
                in_plan = job.plan is not None and change.peer in job.plan.peer_ids
                if change.peer in job.members and job.state in ("waiting", "paused"):
                    del job.members[change.peer]
                if in_plan or job.state == "recovering":
                    self._request_restart(job, f"member {change.peer[:12]} is {change.state.value}")
            elif change.peer == job.leader and job.state not in TERMINAL:
                job.state, job.error = "paused", f"the job's leader {job.leader[:12]} is {change.state.value}"
                self._spawn(self._drop_own_worker, job)


def worker_device(kind: str) -> str:
    """The torch device a worker trains on, from this device's measured kind (cpu, cuda or mps)."""
    return kind if kind in ("cuda", "mps") else "cpu"


def _serve_chunk(path: Path, offset: int) -> ShardData | JobAck:
    try:
        with path.open("rb") as fh:
            total = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return ShardData(total, fh.read(SHARD_CHUNK))
    except OSError:
        return JobAck(False, "no such file")


async def serve_jobs(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Daemon service: the job manager (needs the peer network service started first)."""
    if node.peers is None:
        raise RuntimeError("serve_jobs needs the peer network (serve_peer_network) to start first")
    manager = JobManager(node, node.peers)
    node.jobs = manager
    await manager.run(task_status=task_status)


__all__ = ["JobManager", "serve_jobs", "worker_device"]
