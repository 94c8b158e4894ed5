"""Jobs in the daemon: submit, announce, join, plan, start workers, follow progress, checkpoint, export.

Roles: the *owner* submitted the job (it holds the data and gets the model); *members* joined it. The job's
leader coordinates planning, starting and checkpoint commits; today the leader is the owner at term 1 (the
per-job election in :mod:`arceusd.election_driver` is not yet wired into the job lifecycle, so a job whose owner
dies stops). Every leader command carries (job, term, epoch) and members refuse older ones.

Lifecycle (owner): ``waiting`` (announce to every live peer, collect joins until ``min_members``) ->
``planning`` (partitioner over the members' offers; no fit -> back to ``waiting`` with the reason) ->
``starting`` (every member verifies the plan and starts its worker) -> ``running`` (workers train; checkpoint
shards are reported, copied to the owner and committed under a signed manifest) -> ``done`` (the model is
exported on the owner) or ``failed`` / ``paused`` with a message.

Nothing of a job spec is code: members parse the spec with :func:`arceusd.jobs.spec.spec_from_dict` (no files)
and recompute the plan before starting anything.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from arceusd.control import RequestError
from arceusd.jobs.supervisor import WorkerFailed, WorkerProcess
from arceusd.membership.events import MemberChanged, MemberState
from arceusd.node import Node
from arceusd.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import (
    SHARD_CHUNK,
    JobAck,
    JobGo,
    JobReport,
    JobStart,
    JobStartReply,
    JobStop,
    PeerAddress,
    ShardData,
    ShardRequest,
)
from protocol.messages import Address, JobAnnounce, JoinReply, JoinRequest

log = logging.getLogger(__name__)


@dataclass
class Job:
    job_id: str
    spec: Any  # JobSpec (imported lazily: it pulls in torch)
    spec_bytes: bytes
    spec_hash: str
    owner: str
    owner_address: str
    role: str
    directory: Path
    state: str = "waiting"
    min_members: int = 1
    members: dict[str, Any] = field(default_factory=dict)  # peer -> Offer
    term: int = 1
    epoch: int = 0
    plan: Any = None
    inputs: Any = None
    shares: dict[str, float] = field(default_factory=dict)
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    lr: float | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    history: list[tuple[int, float]] = field(default_factory=list)
    error: str = ""
    model_path: str = ""
    worker: WorkerProcess | None = None
    reports: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    cursors: dict[int, Any] = field(default_factory=dict)
    committed_step: int = 0
    created: float = field(default_factory=time.time)
    finished: trio.Event = field(default_factory=trio.Event)

    def summary(self, full: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job_id": self.job_id, "name": self.spec.name, "owner": self.owner, "role": self.role,
            "state": self.state, "step": self.step, "total_steps": self.total_steps, "loss": self.loss,
            "val_loss": self.val_loss, "val_accuracy": self.val_accuracy, "members": sorted(self.members),
            "error": self.error, "model_path": self.model_path, "spec_hash": self.spec_hash,
        }  # fmt: skip
        if full:
            out.update({
                "term": self.term, "epoch": self.epoch, "lr": self.lr, "samples_per_s": self.samples_per_s,
                "tokens_per_s": self.tokens_per_s, "history": self.history[-200:],
                "committed_step": self.committed_step, "plan": self.plan_summary(),
                "contributions": self.contributions(),
                "model": type(self.spec.model).__name__, "data": self.spec.data.kind,
            })  # fmt: skip
        return out

    def plan_summary(self) -> dict[str, Any] | None:
        if self.plan is None:
            return None
        return {
            "schedule": self.plan.schedule, "micro_batches": self.plan.micro_batches,
            "predicted_step_time_s": self.plan.predicted_step_time_s, "bubble_fraction": self.plan.bubble_fraction,
            "stages": [
                {"index": s.index, "blocks": [s.start, s.end],
                 "devices": [{"peer_id": sh.peer_id, "heads": list(sh.heads), "mlp_columns": list(sh.mlp_columns)}
                             for sh in s.shares]}
                for s in self.plan.stages
            ],
        }  # fmt: skip

    def contributions(self) -> list[dict[str, Any]]:
        """The ledger: each member's share of the model's FLOPs under the plan, and the work that adds up to."""
        if self.inputs is None:
            return []
        per_sample = sum(b.forward_flops_per_sample + b.backward_flops_per_sample for b in self.inputs.blocks)
        batch = self.spec.training.batch_size
        return [
            {"peer_id": peer, "share": round(share, 4), "steps": self.step,
             "tflop": round(share * per_sample * batch * self.step / 1e12, 6)}
            for peer, share in sorted(self.shares.items())
        ]  # fmt: skip


class JobManager:
    def __init__(self, node: Node, peers: PeerService) -> None:
        self.node = node
        self.peers = peers
        self.jobs: dict[str, Job] = {}
        self._offer: Any = None
        self._nursery: trio.Nursery | None = None
        self.root = node.paths.jobs_dir
        self._ready = trio.Event()

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
        self._ready.set()

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
        peers.listeners.append(self._on_member_changed)
        self.node.methods.update({
            "submit": gate(self._m_submit), "join": gate(self._m_join), "jobs": self._m_jobs,
            "job": self._m_job, "cancel": gate(self._m_cancel),
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
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    async def offer(self) -> Any:
        """This device's offer (measured once in a child process, cached on disk for a day)."""
        from arceusd.jobs.planning import Offer

        if self._offer is None:
            result = await trio.run_process(
                [sys.executable, "-m", "arceusd.jobs.probe", str(self.node.paths.root)],
                capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise RequestError(f"measuring this device failed: {result.stderr.decode()[-500:]}")
            m = json.loads(result.stdout.decode().strip().splitlines()[-1])
            self._offer = Offer(self.node.identity.peer_id, self.node.addresses.get("peer", ""),
                                m["flops_per_s"], m["memory_bytes"], m["kind"])  # fmt: skip
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
        if job.role != "owner":
            raise RequestError("only the job's owner can cancel it")
        await self._finish(job, "cancelled", "cancelled by the owner")
        return {"job_id": job.job_id, "state": job.state}

    # ---------------------------------------------------------------------------------------------- owner
    async def _lead(self, job: Job) -> None:
        from arceusd.jobs.planning import PlanError, encode_start, flops_shares, make_plan, worker_stages

        announced: set[str] = set()
        while True:
            while len(job.members) < job.min_members and job.state == "waiting":
                for peer, address in self.peers.alive_peers().items():
                    if peer != self.node.identity.peer_id and peer not in announced:
                        announced.add(peer)
                        self._spawn(self._announce, job, peer, address)
                await trio.sleep(0.3)
            if job.state != "waiting":
                return
            job.state = "planning"
            rtt = {(self.node.identity.peer_id, p): (i.rtt_ms or 1.0) / 1000 for p, i in self.peers.info.items()}
            offers = [job.members[p] for p in sorted(job.members)]
            try:
                job.inputs, job.plan = await trio.to_thread.run_sync(make_plan, job.spec, offers, rtt)
            except PlanError as exc:
                job.state, job.error = "waiting", f"no plan fits yet: {exc}"
                job.min_members = len(job.members) + 1
                log.warning("job %s: %s", job.job_id, job.error)
                continue
            if self.node.identity.peer_id not in job.plan.peer_ids:
                job.state, job.error = "failed", "the plan leaves out the owner, who serves the data"
                return
            job.shares = flops_shares(job.plan, job.inputs)
            job.epoch += 1
            job.state, job.error = "starting", ""
            inputs_data, plan_data = encode_start(job.inputs, job.plan)
            start = JobStart(job.job_id, job.term, job.epoch, job.spec_bytes, plan_data, inputs_data)
            addresses: dict[str, str] = {}
            failures: list[str] = []

            async def start_one(peer: str) -> None:
                if peer == self.node.identity.peer_id:
                    reply = await self._start_worker(job, worker_stages(job.plan), job.plan)
                else:
                    offer = job.members[peer]
                    got = await self.peers.request(offer.address, peer, start, timeout=240.0,
                                                   job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
                    reply = got if isinstance(got, JobStartReply) else JobStartReply(job.job_id, False, "no answer")
                if reply.accepted:
                    addresses[peer] = reply.worker_address
                else:
                    failures.append(f"{peer[:12]}: {reply.reason}")

            async with trio.open_nursery() as nursery:
                for peer in job.plan.peer_ids:
                    nursery.start_soon(start_one, peer)
            if failures:
                await self._finish(job, "failed", "members refused or failed to start: " + "; ".join(failures))
                return
            go = JobGo(job.job_id, job.term, job.epoch, tuple(PeerAddress(p, a) for p, a in sorted(addresses.items())))
            for peer in job.plan.peer_ids:
                if peer == self.node.identity.peer_id:
                    await self._go(job, go)
                else:
                    await self.peers.request(job.members[peer].address, peer, go, timeout=30.0,
                                             job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
            job.state = "running"
            log.info("job %s running on %d devices (epoch %d)", job.job_id, len(addresses), job.epoch)
            return

    async def _announce(self, job: Job, peer: str, address: str) -> None:
        msg = JobAnnounce(job.job_id, job.owner, bytes.fromhex(job.spec_hash), job.spec_bytes)
        await self.peers.request(address, peer, msg, timeout=10.0, job_id=job.job_id)

    async def _on_join_request(self, header: Header, msg: JoinRequest) -> JoinReply:
        from arceusd.jobs.planning import Offer

        job = self.jobs.get(msg.job_id)
        if job is None or job.role != "owner":
            return JoinReply(msg.job_id, False, "this device does not own that job")
        if header.sender != msg.peer_id:
            return JoinReply(msg.job_id, False, "a join must come from the joining device itself")
        if not job.spec.admission.admits(msg.peer_id):
            log.info("job %s: refused %s (not admitted)", job.job_id, msg.peer_id)
            return JoinReply(msg.job_id, False, "not admitted by the job's owner")
        if job.state not in ("waiting",) and msg.peer_id not in job.members:
            return JoinReply(msg.job_id, False, f"the job is {job.state}; new members join at the next plan")
        if msg.flops_per_s <= 0 or msg.free_memory_bytes <= 0:
            return JoinReply(msg.job_id, False, "the offer must have positive speed and memory")
        job.members[msg.peer_id] = Offer(msg.peer_id, f"{msg.address.host}:{msg.address.port}",
                                         msg.flops_per_s, msg.free_memory_bytes)  # fmt: skip
        log.info("job %s: %s joined (%d members)", job.job_id, msg.peer_id[:12], len(job.members))
        return JoinReply(msg.job_id, True, "", tuple(sorted(job.members)))

    # ---------------------------------------------------------------------------------------------- member
    async def _on_announce(self, header: Header, msg: JobAnnounce) -> JobAck:
        from arceusd.jobs.spec import JobSpecError, spec_from_dict

        if header.sender != msg.owner:
            return JobAck(False, "an announcement must come from the job's owner")
        if msg.job_id in self.jobs:
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
        try:
            result = await self.join(job)
            log.info("auto-join %s: %s", job.job_id, result)
        except RequestError as exc:
            log.warning("auto-join %s failed: %s", job.job_id, exc)

    async def join(self, job: Job) -> dict[str, Any]:
        if job.role == "owner":
            return {"job_id": job.job_id, "accepted": True, "reason": "this device owns the job"}
        offer = await self.offer()
        member = self.peers.membership.members.get(job.owner)
        if member is not None and member.address:
            job.owner_address = member.address
        host, _, port = offer.address.rpartition(":")
        request = JoinRequest(job.job_id, self.node.identity.peer_id, Address(host, int(port)),
                              offer.memory_bytes, offer.flops_per_s)  # fmt: skip
        reply = await self.peers.request(job.owner_address, job.owner, request, timeout=10.0, job_id=job.job_id)
        if not isinstance(reply, JoinReply):
            raise RequestError(f"the job's owner {job.owner[:12]} did not answer")
        if reply.accepted:
            job.role, job.state = "member", "joined"
        return {"job_id": job.job_id, "accepted": reply.accepted, "reason": reply.reason}

    def _from_leader(self, header: Header, job: Job | None) -> str:
        """Why a leader command must be refused ('' when it is acceptable)."""
        if job is None:
            return "unknown job"
        if header.sender != job.owner:
            return "only the job's leader may command it"
        if header.term < job.term or (header.term == job.term and header.epoch < job.epoch):
            return f"stale command (term {header.term} epoch {header.epoch}; we are at {job.term}/{job.epoch})"
        return ""

    async def _on_start(self, header: Header, msg: JobStart) -> JobStartReply:
        from arceusd.jobs.planning import PlanRefused, verify_start, worker_stages

        job = self.jobs.get(msg.job_id)
        why = self._from_leader(header, job)
        if why or job is None:
            return JobStartReply(msg.job_id, False, why)
        if job.role != "member":
            return JobStartReply(msg.job_id, False, "this device has not joined the job")
        if msg.spec != job.spec_bytes:
            return JobStartReply(msg.job_id, False, "the spec differs from the announced one")
        try:
            inputs, the_plan = await trio.to_thread.run_sync(verify_start, job.spec, msg.inputs, msg.plan,
                                                             await self.offer())  # fmt: skip
        except PlanRefused as exc:
            log.warning("job %s: refusing the plan: %s", job.job_id, exc)
            return JobStartReply(msg.job_id, False, f"plan refused: {exc}")
        job.term, job.epoch, job.inputs, job.plan = header.term, header.epoch, inputs, the_plan
        from arceusd.jobs.planning import flops_shares

        job.shares = flops_shares(the_plan, inputs)
        return await self._start_worker(job, worker_stages(the_plan), the_plan)

    async def _start_worker(self, job: Job, stages: Any, the_plan: Any) -> JobStartReply:
        from arceusd.worker.protocol import WorkerConfig

        job.directory.mkdir(parents=True, exist_ok=True)
        host = self.node.addresses.get("peer", "127.0.0.1:0").rpartition(":")[0]
        spec_dict = json.loads(job.spec_bytes)
        if job.role == "owner":
            spec_dict["data"] = self._resolved_data(job, spec_dict["data"])
        config = WorkerConfig(
            job_id=job.job_id, term=job.term, epoch=job.epoch, spec=spec_dict, stages=stages,
            micro_batches=the_plan.micro_batches, schedule=self._schedule(job, the_plan),
            peer_id=self.node.identity.peer_id, state_dir=str(self.node.paths.root),
            listen_host=self.node.config.listen_host, owner=job.owner,
            checkpoint_dir=str(job.directory / "checkpoints"),
            checkpoint_interval=job.spec.checkpoint.interval_steps, total_steps=job.total_steps,
            threads=self.node.config.worker_threads,
        )  # fmt: skip
        path = job.directory / f"worker-{job.epoch}.json"
        path.write_text(config.to_json())
        job.worker = WorkerProcess(path, job.directory / "worker.log")
        try:
            port = await job.worker.start()
        except WorkerFailed as exc:
            job.state, job.error = "failed", str(exc)
            return JobStartReply(job.job_id, False, str(exc)[-1500:])
        job.state = "starting"
        return JobStartReply(job.job_id, True, "", f"{host}:{port}")

    @staticmethod
    def _resolved_data(job: Job, data: dict[str, Any]) -> dict[str, Any]:
        """The owner's worker reads the data: give it absolute paths (the spec's are relative to its file)."""
        from arceusd.jobs.spec_types import resolve_path

        out = dict(data)
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
        why = self._from_leader(header, job)
        if why or job is None:
            return JobAck(False, why)
        await self._go(job, msg)
        return JobAck(True)

    async def _go(self, job: Job, msg: JobGo) -> None:
        if job.worker is None:
            return
        await job.worker.send({"cmd": "start", "addresses": {a.peer_id: a.address for a in msg.addresses}})
        job.state = "running"
        self._spawn(self._follow_worker, job, job.worker)

    async def _follow_worker(self, job: Job, worker: WorkerProcess) -> None:
        last_t, last_step = time.monotonic(), job.step
        try:
            async for event in worker.events():
                kind = event.get("event")
                if kind == "step":
                    # the event names the step index just run; job.step counts completed steps
                    job.step, job.loss, job.lr = int(event["step"]) + 1, float(event["loss"]), float(event["lr"])
                    job.history.append((job.step, round(job.loss, 5)))
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
                    event["peer_id"] = self.node.identity.peer_id
                    if job.role == "owner":
                        await self._handle_report(job, event)
                    else:
                        report = JobReport(job.job_id, job.epoch, json.dumps(event))
                        await self.peers.request(job.owner_address, job.owner, report, timeout=30.0,
                                                 job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
        except WorkerFailed as exc:
            job.error = str(exc)
        code = await worker.kill()
        if code not in (0, None) and job.state == "running":
            job.state = "failed"
            job.error = job.error or f"the worker exited with code {code}:\n{worker.log_tail(10)}"
            log.error("job %s: %s", job.job_id, job.error)

    async def _on_report(self, header: Header, msg: JobReport) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or job.role != "owner":
            return JobAck(False, "not the leader of that job")
        if job.plan is None or header.sender not in job.plan.peer_ids or msg.epoch != job.epoch:
            return JobAck(False, "report from outside the current plan")
        try:
            event = json.loads(msg.event)
        except ValueError:
            return JobAck(False, "malformed report")
        if not isinstance(event, dict):
            return JobAck(False, "malformed report")
        event["peer_id"] = header.sender
        await self._handle_report(job, event)
        return JobAck(True)

    async def _handle_report(self, job: Job, event: dict[str, Any]) -> None:
        kind = event.get("event")
        peer = str(event["peer_id"])
        if kind == "error":
            await self._finish(job, "failed", f"worker on {peer[:12]} failed: {event.get('message')}")
        elif kind == "checkpoint":
            step = int(event["step"])
            shard = event.get("shard") or {}
            job.reports.setdefault(step, {})[peer] = shard
            if event.get("cursor") is not None:
                job.cursors[step] = event["cursor"]
            expected = sum(len(s.shares) for s in job.plan.stages) if job.plan else 0
            if len(job.reports[step]) == expected:
                self._spawn(self._commit_checkpoint, job, step)

    async def _commit_checkpoint(self, job: Job, step: int) -> None:
        """Copy every shard of ``step`` to the owner, check it, sign the manifest; export at the last step."""
        from arceusd.checkpoint import Manifest, ShardRecord, atomic_write, commit_manifest, step_dir

        root = job.directory / "checkpoints"
        records = []
        for peer, shard in sorted(job.reports[step].items()):
            name = str(shard["name"])
            path = step_dir(root, step) / name
            if peer != self.node.identity.peer_id and not path.exists():
                data = await self._fetch_shard(job, peer, step, name)
                if data is None:
                    job.error = f"could not copy shard {name} of step {step} from {peer[:12]}"
                    log.warning("job %s: %s", job.job_id, job.error)
                    return
                await trio.to_thread.run_sync(atomic_write, path, data)
            records.append(ShardRecord(name, str(shard["sha256"]), int(shard["size"])))
        manifest = Manifest(job.job_id, job.term, job.epoch, step, tuple(records),
                            {"cursor": job.cursors.get(step)})  # fmt: skip
        try:
            await trio.to_thread.run_sync(commit_manifest, root, manifest, self.node.identity,
                                          job.spec.checkpoint.keep)  # fmt: skip
        except Exception as exc:  # CheckpointError: a shard that does not match its report
            job.error = f"checkpoint {step} not committed: {exc}"
            log.warning("job %s: %s", job.job_id, job.error)
            return
        job.committed_step = max(job.committed_step, step)
        log.info("job %s: checkpoint %d committed", job.job_id, step)
        if step >= job.total_steps:
            await self._export(job, step, [step_dir(root, step) / r.name for r in records])

    async def _fetch_shard(self, job: Job, peer: str, step: int, name: str) -> bytes | None:
        address = job.members[peer].address
        data = bytearray()
        for _ in range(10_000):
            reply = await self.peers.request(address, peer, ShardRequest(job.job_id, step, name, len(data)),
                                             timeout=60.0, job_id=job.job_id)  # fmt: skip
            if not isinstance(reply, ShardData) or reply.total > 1 << 34:
                return None
            data += reply.data
            if len(data) >= reply.total or not reply.data:
                break
        return bytes(data)

    async def _on_shard_request(self, header: Header, msg: ShardRequest) -> ShardData | JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or header.sender != job.owner:
            return JobAck(False, "shards go to the job's owner only")
        from arceusd.checkpoint import _SHARD_NAME, step_dir

        if not _SHARD_NAME.match(msg.name):
            return JobAck(False, "bad shard name")
        path = step_dir(job.directory / "checkpoints", msg.step) / msg.name
        try:
            with path.open("rb") as fh:
                total = os.fstat(fh.fileno()).st_size
                fh.seek(msg.offset)
                return ShardData(total, fh.read(SHARD_CHUNK))
        except OSError:
            return JobAck(False, "no such shard")

    async def _export(self, job: Job, step: int, paths: list[Path]) -> None:
        from arceusd.jobs.export import assemble, write_model

        def work() -> Path:
            state = assemble(job.spec.model, [p.read_bytes() for p in paths])
            extra: dict[str, Any] = {"job_id": job.job_id, "step": step, "name": job.spec.name}
            if job.spec.data.kind == "text":
                from arceusd.data.text import load_text

                extra["vocab"] = "".join(load_text(job.spec.data_path()).vocab.chars)
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
        if job.plan is not None:
            stop = JobStop(job.job_id, job.term, state)
            for peer in job.plan.peer_ids:
                if peer != self.node.identity.peer_id and peer in job.members:
                    self._spawn(self._send_stop, job, peer, stop)
        if job.worker is not None:
            await job.worker.stop(grace=5.0)
        job.finished.set()

    async def _send_stop(self, job: Job, peer: str, stop: JobStop) -> None:
        await self.peers.request(job.members[peer].address, peer, stop, timeout=10.0, job_id=job.job_id,
                                 term=job.term, epoch=job.epoch)  # fmt: skip

    async def _on_stop(self, header: Header, msg: JobStop) -> JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or header.sender != job.owner or header.term < job.term:
            return JobAck(False, "not from this job's leader")
        job.state = msg.reason or "stopped"
        if job.worker is not None:
            await job.worker.stop(grace=5.0)
        return JobAck(True)

    def _on_member_changed(self, change: MemberChanged) -> None:
        if change.state not in (MemberState.DEAD, MemberState.LEFT):
            return
        for job in self.jobs.values():
            if job.role == "owner" and job.state in ("running", "starting") and job.plan is not None:
                if change.peer in job.plan.peer_ids:
                    job.state = "paused"
                    job.error = (f"member {change.peer[:12]} is {change.state.value}; "
                                 f"the last committed checkpoint is step {job.committed_step}")  # fmt: skip
                    log.warning("job %s: %s", job.job_id, job.error)


async def serve_jobs(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Daemon service: the job manager (needs the peer network service started first)."""
    if node.peers is None:
        raise RuntimeError("serve_jobs needs the peer network (serve_peer_network) to start first")
    manager = JobManager(node, node.peers)
    node.jobs = manager
    await manager.run(task_status=task_status)


__all__ = ["Job", "JobManager", "serve_jobs"]
