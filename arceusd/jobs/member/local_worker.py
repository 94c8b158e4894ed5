"""This device's stage worker: start it on the leader's command, let it go, follow its events, report them.

A member answers the leader's :class:`protocol.job_wire.JobStart` by verifying the plan itself, fetching its
resume slice and starting its worker process (:class:`arceusd.jobs.procs.supervisor.WorkerProcess`), and the
:class:`protocol.job_wire.JobGo` by handing the worker its neighbours' addresses (a
:class:`protocol.job_wire.JobStop` stops it: the core's ``StopReceived``). From then on it follows the
worker's events: steps update the job's progress here; checkpoints, witnesses, the end and failures are reported
to the leader as typed :class:`protocol.job_wire.JobReport` values (:mod:`arceusd.jobs.member.reports`; taken in
place when this device leads). The leader's side of those reports: :mod:`arceusd.jobs.leader.report_intake`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from arceusd.device.config import DaemonConfig
from arceusd.jobs.common.ports import CheckLeader, Commanded, Feed, Leads, OwnOffer, Spawn, TakeReport
from arceusd.jobs.common.transfers import job_weights, leader_data
from arceusd.jobs.core import Role, Stamp, actions, events
from arceusd.jobs.judging import claims
from arceusd.jobs.member import reports
from arceusd.jobs.member.joins_in_flight import JoinsInFlight
from arceusd.jobs.plans.grow_start import GrowStart
from arceusd.jobs.plans.initial_weights import Place, needs_weights, place_of, worker_spec_weights
from arceusd.jobs.plans.planning import (
    PlanRefused,
    replica_flops_shares,
    replica_peers,
    replica_sync_config,
    verify_grown_start,
    verify_job_start,
    worker_replicas,
    worker_stages,
)
from arceusd.jobs.plans.recovery import ResumeError, ResumeFile, ResumePoint
from arceusd.jobs.procs.supervisor import WorkerFailed, WorkerProcess
from arceusd.jobs.procs.warm_starts import preloads_for, warm_starts
from arceusd.jobs.record.job import TERMINAL, Job
from arceusd.models.hf.weights_slice import WeightsSliceError
from arceusd.network.peers import PeerService
from arceusd.worker.protocol import ResumeConfig, WorkerConfig
from protocol.envelope import Header
from protocol.errors import RemoteProtocolError
from protocol.job_wire import JobAck, JobGo, JobStart, JobStartReply, JobStop
from protocol.validation import member_ids

if TYPE_CHECKING:
    from partitioner import Plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalWorkerPorts:
    """What :class:`LocalWorker` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: Mapping[str, Job]
    """The jobs this daemon holds, by id."""
    feed: Feed
    leads: Leads
    spawn: Spawn
    offer: OwnOffer
    check_leader: CheckLeader
    commanded: Commanded
    drop_own_worker: Callable[[Job], Awaitable[None]]
    """Stop this device's worker of the job, if any (it is detached first)."""
    track: Callable[[Job, list[str], list[str]], None]
    """Stand in the job's election: ``(job, members, ranking)``."""
    fetch_resume: Callable[[Job, str, int, ResumeFile], Awaitable[ResumeConfig]]
    """This device's resume slice of a step, from the leader (:mod:`arceusd.jobs.common.transfers`)."""
    fetch_weights: Callable[[Job, str, Place], Awaitable[Path]]
    """This device's place's initial weights, from the leader (:mod:`arceusd.jobs.common.transfers`)."""
    peers: PeerService
    """The peer network (a report sent to the leader)."""
    addresses: Mapping[str, str]
    """This daemon's listening addresses (``peer``: the worker listens on its host)."""
    state_root: Path
    """This daemon's state folder (the worker's)."""
    config: DaemonConfig
    """The daemon's configuration (the worker's host, threads and CPUs)."""
    take: TakeReport
    """The leader's side of a report, for this device's own when it leads (``ReportIntake.take``)."""
    on_step: Callable[[Job], None]
    """A step of this device's worker ran: the leader's speed checks (``SpeedChecks.on_step``) look at it."""
    joins: JoinsInFlight
    """This device's joins not yet settled: a start for a job whose join is in flight waits for it."""


class LocalWorker:
    """Starting and following this device's stage worker, and reporting its events to the leader (``ports.take``:
    the leader's side, for this device's own reports when it leads). Imports nothing of :mod:`arceusd.jobs.leader`:
    what it calls there is in its port."""

    def __init__(self, ports: LocalWorkerPorts) -> None:
        self.ports = ports

    async def on_start(self, header: Header, msg: JobStart) -> JobStartReply:
        job = self.ports.jobs.get(msg.job_id)
        if job is None:
            return JobStartReply(msg.job_id, False, "unknown job")
        began = time.monotonic()
        why = await self.ports.check_leader(header, job)
        if why is not None:
            return JobStartReply(msg.job_id, False, why.reason, follows=why.follows)
        if job.role not in (Role.MEMBER, Role.OWNER):
            await self.ports.joins.settled(job.job_id)  # the leader's start overtook the answer to our join, if any
        if job.role not in (Role.MEMBER, Role.OWNER):
            return JobStartReply(msg.job_id, False, "this device has not joined the job")
        if msg.spec != job.spec_bytes:
            return JobStartReply(msg.job_id, False, "the spec differs from the announced one")
        try:
            told = member_ids(msg.members)  # the job's members as the leader holds them
            resume = ResumePoint.from_wire(msg.resume)
            grow = GrowStart.from_wire(msg.grow)  # a spare rebuilding a dropped replica (arceusd.jobs.leader.regrow)
            if grow is not None:
                inputs, replica_plan = await trio.to_thread.run_sync(
                    verify_grown_start, job.spec, msg.inputs, msg.plan, await self.ports.offer(), grow.position
                )
            else:
                inputs, replica_plan = await trio.to_thread.run_sync(
                    verify_job_start, job.spec, msg.inputs, msg.plan, await self.ports.offer(), header.sender
                )
        except (PlanRefused, ResumeError, ValueError, RemoteProtocolError) as exc:
            log.warning("job %s: refusing the start: %s", job.job_id, exc)
            return JobStartReply(msg.job_id, False, f"start refused: {exc}")
        if resume is not None and resume.step != msg.resume_step:
            return JobStartReply(msg.job_id, False, "start refused: the resume step is inconsistent")
        if self.ports.me not in replica_plan.peer_ids:
            if grow is None:  # the plan the leader tells its spares (Starting.tell_spares): this device is one
                job.mark_spare(header.term, header.epoch, told)
                # the plan's stamp and standby: whom it follows if the leader dies (leadership.spare_may_follow)
                standby = msg.standby if msg.standby in replica_plan.peer_ids else ""
                self.ports.feed(job, events.StartReceived(Stamp(header.term, header.epoch), standby))
                log.info("job %s: a spare of plan epoch %d: in no stage, paid nothing", job.job_id, header.epoch)
                await self.ports.drop_own_worker(job)  # a place in an older plan is gone: its worker stops
            return JobStartReply(msg.job_id, False, "start refused: this device has no place in the plan")
        if msg.standby and msg.standby not in replica_plan.peer_ids:
            return JobStartReply(msg.job_id, False, "start refused: the standby is not in the plan")
        verified = time.monotonic()
        await self.ports.drop_own_worker(job)  # a newer epoch replaces whatever ran before
        stamp = Stamp(header.term, header.epoch)
        self.ports.feed(job, events.StartReceived(stamp, msg.standby))
        job.inputs = inputs
        job.plan, job.replica_plan = replica_plan.replicas[0], replica_plan
        job.replica_slots, job.data_shares, job.ring_generation = (
            (grow.slots, grow.shares, grow.generation) if grow is not None else ((), 0, 0)
        )
        job.shares = replica_flops_shares(replica_plan, inputs)
        job.told_members = told or job.told_members
        job.spare_in = None  # a place in the plan
        self.ports.track(job, list(job.plan_peers()), [header.sender, msg.standby])
        local = None
        if resume is not None:
            mine = resume.files.get(self.ports.me)
            if mine is None:
                return JobStartReply(msg.job_id, False, "start refused: no resume slice for this device")
            try:
                local = await self.ports.fetch_resume(job, header.sender, resume.step, mine)
            except (ResumeError, OSError) as exc:
                return JobStartReply(msg.job_id, False, f"could not get the resume slice: {exc}")
        weights = None
        if needs_weights(job.spec.model, resume is not None) and not self.ports.leads(job):
            place = place_of(replica_plan, self.ports.me)
            try:  # only its place's tensors, checked against the signed spec (arceusd.jobs.plans.initial_weights)
                weights = await self.ports.fetch_weights(job, header.sender, place or Place(0, 0))
            except (WeightsSliceError, OSError) as exc:
                log.warning("job %s: %s", job.job_id, exc)
                return JobStartReply(msg.job_id, False, f"could not get the initial weights: {exc}")
        job.step = msg.resume_step
        fetched = time.monotonic()
        reply = await self.start_worker(job, local, weights)
        if reply.accepted:  # (job.worker is the worker just started: start_worker checked it, nothing awaited since)
            for action in self.ports.feed(job, events.WorkerStarted(stamp)):
                if isinstance(action, actions.Refuse):  # a stop came while it started: no worker outlives it
                    log.warning("job %s: %s", job.job_id, action.reason)
                    await self.ports.drop_own_worker(job)
                    return JobStartReply(msg.job_id, False, action.reason)
            # where a slow start went (issue 33; bench/recovery.py prints these lines)
            log.info(
                "job %s: worker of epoch %d listening %.3f s after the start came (plan verified %.3f s, "
                "resume slice fetched %.3f s, worker started %.3f s)",
                job.job_id,
                job.epoch,
                time.monotonic() - began,
                verified - began,
                fetched - verified,
                time.monotonic() - fetched,
            )
        return reply

    async def start_worker(
        self, job: Job, resume: ResumeConfig | None = None, weights: Path | None = None
    ) -> JobStartReply:
        """Start this device's worker for its place in ``job.replica_plan`` (its replica's stages; with
        replicas, every replica's stages and how they sync). ``weights``: a member's slice of the job's initial
        weights (:meth:`arceusd.jobs.common.transfers.Transfers.fetch_weights`); a leader's worker reads its whole
        file."""
        rp = job.replica_plan
        if rp is None:
            return JobStartReply(job.job_id, False, "no plan to start a worker for")
        _, the_plan = replica_peers(rp, self.ports.me)

        job.directory.mkdir(parents=True, exist_ok=True)
        host = self.ports.addresses.get("peer", "127.0.0.1:0").rpartition(":")[0]
        spec_dict = json.loads(job.spec_bytes)
        if self.ports.leads(job):
            spec_dict["data"] = leader_data(job)
        if self.ports.leads(job):  # the owner's file, or a standby's checked copy once it took over
            weights = job_weights(job)
        if weights is None and needs_weights(job.spec.model, resume is not None):
            return JobStartReply(job.job_id, False, "this device holds none of the job's initial weights")
        worker_spec_weights(spec_dict, weights if needs_weights(job.spec.model, resume is not None) else None)
        offer = await self.ports.offer()
        config = WorkerConfig(
            job_id=job.job_id,
            term=job.term,
            epoch=job.epoch,
            spec=spec_dict,
            stages=worker_stages(the_plan),
            micro_batches=the_plan.micro_batches,
            schedule=_schedule(job, the_plan),
            peer_id=self.ports.me,
            state_dir=str(self.ports.state_root),
            listen_host=self.ports.config.listen_host,
            owner=job.leader,
            checkpoint_dir=str(job.paths.checkpoints),
            checkpoint_interval=job.spec.checkpoint.interval_steps,
            total_steps=job.total_steps,
            threads=self.ports.config.worker_threads,
            cpus=self.ports.config.worker_cpus,
            resume=resume,
            device=worker_device(offer.kind),
            replicas=worker_replicas(rp),
            replica_sync=replica_sync_config(job.spec, rp),
            replica_slots=job.replica_slots,
            data_shares=job.data_shares,
            ring_generation=job.ring_generation,
            max_in_flight=the_plan.in_flight_cap if _schedule(job, the_plan) == "1f1b" else 0,
        )
        path = job.paths.worker_config(job.epoch)
        path.write_text(config.to_json())
        if job.local_stopped is not None:  # the previous plan's worker is on its way out: let it go first
            with trio.move_on_after(5.0):
                await job.local_stopped.wait()
        # a stock transformers model: the fork server imports transformers once, for this worker and every later
        # one, re-slicing and export of the job (arceusd.jobs.procs.fork_server)
        await warm_starts().preload(preloads_for(job.spec.model))
        worker = WorkerProcess(path, job.paths.worker_log)
        job.worker = worker
        job.stage_times.clear()  # a new plan: its stage times are not the old one's
        try:
            port = await worker.start()
        except WorkerFailed as exc:
            if job.worker is worker:
                job.worker = None
            return JobStartReply(job.job_id, False, str(exc)[-1500:])
        if job.worker is not worker:  # detached while it started (a stop, a newer plan): never answer for it
            await worker.stop(grace=0.5)
            return JobStartReply(job.job_id, False, "the start was stopped while the worker started")
        return JobStartReply(job.job_id, True, "", f"{host}:{port}")

    async def on_go(self, header: Header, msg: JobGo) -> JobAck:
        job = await self.ports.commanded(header, msg.job_id)
        if isinstance(job, JobAck):
            return job
        for action in self.ports.feed(job, events.GoReceived(Stamp(header.term, header.epoch))):
            if isinstance(action, actions.Refuse):
                return JobAck(False, action.reason)
            if isinstance(action, actions.LetWorkerGo):  # (the core let it go once in this epoch)
                if job.worker is None:  # (the core holds no plan whose worker was detached: a bug if reached)
                    return JobAck(False, f"this device holds no worker for plan epoch {msg.epoch}")
                await self._let_go(job, msg)
        return JobAck(True)

    async def on_stop(self, header: Header, msg: JobStop) -> JobAck:
        """The leader stopped the plan (``replanning``, or the state the job ended in): the core's ``StopReceived``
        stops this device's worker and takes a known state only (a term's command; any epoch)."""
        job = self.ports.jobs.get(msg.job_id)
        if job is None:
            return JobAck(False, "unknown job")
        why = await self.ports.check_leader(header, job, epochs=False)
        if why is not None:
            return JobAck(False, "not from this job's leader", why.follows)
        self.ports.feed(job, events.StopReceived(msg.reason))  # a known state only, never the sender's text (issue #19)
        return JobAck(True)

    async def go(self, job: Job, msg: JobGo) -> None:
        """The leader's own ``go``: let this device's worker start, once per plan epoch (the core's guard,
        :meth:`arceusd.jobs.core.JobCore.let_go`: a ``go`` sent again is a no-op)."""
        if job.worker is not None and job.core.let_go(job.epoch):
            await self._let_go(job, msg)

    async def _let_go(self, job: Job, msg: JobGo) -> None:
        if job.worker is None:
            return
        try:
            await job.worker.send({"cmd": "start", "addresses": {a.peer_id: a.address for a in msg.addresses}})
        except WorkerFailed as exc:
            log.warning("job %s: the worker is gone before go: %s", job.job_id, exc)
        self.ports.spawn(self._follow_worker, job, job.worker, job.epoch)

    async def _follow_worker(self, job: Job, worker: WorkerProcess, epoch: int) -> None:
        finished = False
        try:
            async for event in worker.events():
                if job.worker is not worker:
                    break  # replaced by a newer plan epoch: its events no longer count
                kind = event.get("event")
                if kind == "step":
                    self._on_step(job, event)
                    job.throughput.add(time.monotonic(), job.step)
                elif kind == "eval":
                    job.val_loss = float(event["val_loss"])
                    job.val_accuracy = event.get("val_accuracy")
                elif kind in ("checkpoint", "witness", "done", "error"):
                    finished = finished or kind in ("done", "error")
                    await self._report(job, epoch, event)
        except WorkerFailed as exc:
            job.error = str(exc)
        code = await worker.kill()
        if job.worker is not worker or finished or job.state in TERMINAL:
            return
        await self._report(
            job, epoch, {"event": "lost", "message": f"the worker exited with code {code}: {worker.log_tail(3)}"}
        )

    def _on_step(self, job: Job, event: dict[str, Any]) -> None:
        # the event names the step index just run; job.step counts completed steps
        job.step, job.loss, job.lr = int(event["step"]) + 1, float(event["loss"]), float(event["lr"])
        job.record_loss(job.step, job.loss)
        job.ring_bytes = max(0, int(event.get("ring_bytes", 0)))
        job.stage_times.append(
            claims.StageTime(
                *(
                    float(event.get(k, 0.0))
                    for k in ("seconds", "wait_seconds", "wait_up_seconds", "wait_down_seconds", "group_wait_seconds")
                )
            )
        )
        job.credit(1)
        self.ports.on_step(job)  # the leader's speed checks (issue #19)
        recovery = job.leading.loop.recoveries[-1] if job.leading.loop.recoveries else None
        if recovery is not None and recovery.first_step_after_s is None and recovery.epoch == job.epoch:
            recovery.first_step_after_s = round(time.monotonic() - recovery.began, 3)
            log.info("job %s: training again %.2f s after the failure", job.job_id, recovery.first_step_after_s)

    async def _report(self, job: Job, epoch: int, event: dict[str, Any]) -> None:
        """A worker event for the leader, typed once here (:func:`arceusd.jobs.member.reports.report_of_event`): handled
        in place when this device leads, sent as that :class:`protocol.job_wire.JobReport` from a member."""
        me = self.ports.me
        if event.get("event") in ("checkpoint", "witness"):  # its measured speed beside the plan's (issue #19)
            event = {**event, **claims.own_step_times(job, me)}
        try:
            report = reports.report_of_event(job.job_id, epoch, event)
        except ValueError as exc:
            log.warning("job %s: a worker event no report can carry: %s", job.job_id, exc)
            return
        if self.ports.leads(job):
            await self.ports.take(job, me, report)
            return
        await self.ports.peers.request(
            job.leader_address, job.leader, report, timeout=30.0, job_id=job.job_id, term=job.term, epoch=epoch
        )


def worker_device(kind: str) -> str:
    """The torch device a worker trains on, from this device's measured kind (cpu, cuda or mps)."""
    return kind if kind in ("cuda", "mps") else "cpu"


def _schedule(job: Job, the_plan: Plan) -> str:
    forced = job.spec.training.schedule
    return str(the_plan.schedule if forced == "auto" else forced)


__all__ = ["LocalWorker", "worker_device"]
