"""The stage-worker process: ``python -m arceusd.worker --config <path.json>``, supervised by the daemon.

Owns: one job's data plane on this device. Start-up: pin its cores (when asked) and threads, load the device
identity (its peer id must be the config's), validate the spec, build only this worker's slice (``build_stage``)
and its engine (optionally reloaded from ``resume.tensors_path``), load the data set if this device owns the
job, listen on the transport and say ``listening``. On ``start`` (every worker's address): open the streams
of ``WireFabric`` (each to the peer id the plan names there: another peer answering is refused), then train steps
``[resume.step or 0, total_steps)``:

- each step: the next batch from the prefetcher (stage 0: inputs, last stage: targets), ``launch_step`` in a
  worker thread (the engine blocks on the links; the trio loop stays free to move frames), a ``step`` event: at
  once, or, for the job's only worker (``StageEngine.solo``), after the next step is queued, so a GPU is never
  left idle while the worker reports (``pending_step.py``; a step with a checkpoint or an evaluation after it is
  reported at once);
- after ``c`` completed steps with ``c % checkpoint_interval == 0`` (interval > 0) or ``c == total_steps``:
  write this worker's shard ``stage{s}-rank{r}.safetensors`` under ``checkpoint_dir/step-<c>/`` (tensors =
  ``StageEngine.state_tensors()``, safetensors metadata = the slice and its tensor-parallel split, so the
  daemon can gather a full model), a ``checkpoint`` event, then an evaluation pass through the pipeline
  (forward only, no grad) and an ``eval`` event; also an eval at multiples of the spec's
  ``eval_interval_steps``;
- then ``done`` and exit 0.

Data-parallel replicas (``config.replicas``): the worker is one replica's copy of its stage; its engine gets a
``ReplicaSync`` over the ``ring`` streams of ``WireFabric`` (all-reduce of the gradients every step, or DiLoCo's
outer step every ``diloco_h`` steps), its data share is the replica's 1/R of each batch, ``step`` events carry
the bytes it sent to its ring, and only replica 0 writes checkpoint shards (all-reduce keeps the replicas
bit-identical; DiLoCo's shards carry the common anchor).

The daemon's replica commands on stdin (``drop_replica``, ``grow_replica``, ``go_on``, ``retire``) are
``replica_control.ReplicaControl``'s: the ring goes on without a dropped replica (the sync that broke is redone
over the smaller ring; the first replica left writes the shards, witnesses stop when one replica is left), holds
after a checkpoint for its rebuild and grows back, and the data owner's worker retires to serve the others.

``stop`` on stdin (or stdin closing) exits 0 at once; any failure emits ``error`` and exits 1. Gradient norm:
the engine always clips with ``max_grad_norm = grad_clip`` or ``inf`` when the spec has no clipping (a scale
of exactly 1), so ``grad_norm`` is always reported. Learning rate: the spec's ``TrainingSpec.lr_at``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import os
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
import trio

from arceusd.base import failpoints
from arceusd.base.identity import load_or_create_identity
from arceusd.data.batches import BatchSource
from arceusd.data.sampler import Cursor
from arceusd.files import outer_witness
from arceusd.files.checkpoint import shard_file_name, write_shard
from arceusd.files.safetensors_io import load_bytes, save_bytes
from arceusd.jobs.procs.source import open_batch_source
from arceusd.jobs.spec.parsed import TrainingSpec
from arceusd.jobs.spec.schema import JobSpec, spec_from_dict
from arceusd.models.build import loss_sum, tied_pair
from arceusd.models.config import MLPConfig
from arceusd.models.hf.lora import hold_base
from arceusd.transport import Stream, open_transport
from arceusd.worker.affinity import pin_cpus
from arceusd.worker.collective import TimedCollective
from arceusd.worker.datafeed import Batch, DataClient, DataServer, Prefetcher, eval_batch_count
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import LinkError
from arceusd.worker.optim import AdamWConfig, LRSchedule, OptimizerConfig, SGDConfig
from arceusd.worker.pending_step import PendingStep
from arceusd.worker.protocol import (
    CheckpointEvent,
    Command,
    DoneEvent,
    DropReplicaCommand,
    ErrorEvent,
    EvalEvent,
    Event,
    GoOnCommand,
    GrowReplicaCommand,
    Listening,
    ReplicaSyncConfig,
    RetireCommand,
    ShardInfo,
    StartCommand,
    StepEvent,
    StopCommand,
    WitnessEvent,
    WorkerConfig,
    WorkerProtocolError,
    parse_command,
)
from arceusd.worker.replica_control import ReplicaCommand, ReplicaControl
from arceusd.worker.replicas import (
    DiLoCoConfig,
    ReplicaCodec,
    ReplicaConfig,
    ReplicaSync,
    SyncMode,
)
from arceusd.worker.ring import RingError
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.schedule_timing import deferring_pays
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.threads import pin_threads
from arceusd.worker.wire_links import PHASE_EVAL, PHASE_TRAIN, WireFabric
from protocol.compression import Bf16Codec, Fp16Codec, Int8BlockCodec, TopKCodec
from protocol.errors import RemoteProtocolError
from protocol.tensors import RAW, TensorCodec


class WorkerStopped(Exception):
    """The daemon said ``stop`` (or closed our stdin)."""


@dataclass(frozen=True)
class SpecLR(LRSchedule):
    """The job spec's learning-rate rule (``TrainingSpec.lr_at``) as the engine's ``LRSchedule``."""

    training: TrainingSpec | None = None

    def __call__(self, step: int) -> float:
        if self.training is None:
            return self.max_lr
        return self.training.lr_at(step)


def defer_weights(config: WorkerConfig) -> bool:
    """Whether this job's backwards defer weights' gradients: where the timed replay of the schedule with the
    plan's stage times says it pays (equal stages assumed when the start command carries no times)."""
    if config.max_in_flight:
        return False  # a capped 1F1B defers none: a deferred micro-batch keeps its stash (schedule.one_f_one_b)
    times = [st.micro_batch_s for st in config.stages]
    known = [t for t in times if t is not None]
    return deferring_pays(
        config.schedule, known if len(known) == len(times) else [1.0] * len(times), config.micro_batches
    )


def optimizer_config(t: TrainingSpec) -> OptimizerConfig:
    if t.optimizer == "sgd":
        return SGDConfig(lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    return AdamWConfig(lr=t.lr, beta1=t.betas[0], beta2=t.betas[1], weight_decay=t.weight_decay)


def codec_for(t: TrainingSpec) -> TensorCodec:
    """The wire codec of activations and gradients named by the spec's ``compression``."""
    if t.compression == "fp16":
        return Fp16Codec()
    if t.compression == "bf16":
        return Bf16Codec()
    if t.compression == "int8":
        return Int8BlockCodec()
    if t.compression == "topk":
        return TopKCodec(ratio=t.topk_fraction)
    return RAW


def replica_config(count: int, sync: ReplicaSyncConfig, one_core: bool = False) -> ReplicaConfig:
    """The engine's ``ReplicaConfig`` from the worker config's ``replica_sync``; ``one_core``: the worker is
    pinned to one CPU core (no overlap of the all-reduce with the backward: it would only share that core)."""
    return ReplicaConfig(
        replicas=count,
        overlap=not one_core,
        mode=SyncMode.DILOCO if sync.mode == "diloco" else SyncMode.ALLREDUCE,
        bucket_bytes=sync.bucket_bytes,
        diloco=DiLoCoConfig(sync.diloco_h, sync.outer_lr, sync.outer_momentum, ReplicaCodec(sync.codec)),
        grad_codec=ReplicaCodec(sync.grad_codec),
    )


def shard_name(stage: int, rank: int) -> str:
    return shard_file_name(stage, rank)


@dataclass
class _StepLoop:
    """The training loop's figures per step, and the step queued but not yet reported."""

    samples: int
    """This replica's share of the global batch."""
    block: int
    """Tokens per sample (an MLP's sample is one example: 1)."""
    n_eval: int
    in_flight: tuple[PendingStep, float] | None = None
    """A step queued on the device and not yet reported, with the time it began."""
    reported_at: float = 0.0
    """When the last step was reported (``time.perf_counter``)."""


class EventWriter:
    """Writes one JSON event per line to the daemon and flushes it."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def emit(self, event: Event) -> None:
        self._out.write(event.to_line() + "\n")
        self._out.flush()


class Worker:
    """One stage worker (see the module docstring); ``run`` is its whole life."""

    def __init__(self, config: WorkerConfig, events: EventWriter) -> None:
        self.config = config
        self.events = events
        self.built_s = 0.0  # how long building this worker took (its stage, engine, resume): for the log
        self.spec: JobSpec = spec_from_dict(config.spec)
        self.stage, self.rank = config.position()
        self.num_stages = len(config.stages)
        self.is_first = self.stage == 0
        self.is_last = self.stage == self.num_stages - 1
        self.is_owner = config.peer_id == config.owner
        self.source: BatchSource | None = None
        self.server: DataServer | None = None
        self.fabric = WireFabric(
            config,
            codec_for(self.spec.training),
            data_handler=self._serve_data,
            tied=tied_pair(self.spec.model) is not None,
        )
        st = config.stages[self.stage]
        split = st.split()
        group = TimedCollective(self.fabric.collective()) if split is not None else None  # its waits are reported
        weights = getattr(self.spec.model, "weights", None)  # a stock LM's initial weights (only its blocks read)
        module = build_stage(
            self.spec.model,
            self.spec.seed,
            StageSpec(st.start, st.end, split, self.rank),
            group,
            weights=Path(weights) if weights else None,
        )
        t = self.spec.training
        if getattr(self.spec.model, "lora", None) is not None and t.precision == "bf16":
            hold_base(module, torch.bfloat16)  # a LoRA job's frozen base: what bf16 autocast computes with
        self.replica = config.slot_of()  # this worker's replica slot: its share of each batch
        self.control = ReplicaControl(self)
        replicas = None
        if config.replica_count() > 1 and config.replica_sync is not None:
            if t.batch_size % (config.share_count() * config.micro_batches):
                raise WorkerProtocolError(
                    f"batch_size {t.batch_size} does not split into {config.share_count()} replicas x "
                    f"{config.micro_batches} micro-batches"
                )
            one_core = config.device == "cpu" and len(config.cpus) == 1
            replicas = ReplicaSync(
                replica_config(config.replica_count(), config.replica_sync, one_core),
                self.fabric.ring_link(),
                self.fabric.ring.change,
                change_timeout_s=config.link_timeout_s,
            )
        self.engine = StageEngine(
            module,
            self.fabric.links(),
            EngineConfig(
                stage=self.stage,
                num_stages=self.num_stages,
                num_micro_batches=config.micro_batches,
                schedule=ScheduleKind(config.schedule),
                optimizer=optimizer_config(t),
                lr_schedule=SpecLR(max_lr=t.lr, training=t),
                max_grad_norm=t.grad_clip if t.grad_clip > 0 else math.inf,
                autocast_bf16=t.precision == "bf16",
                device=config.device,
                defer_weights=defer_weights(config),
                max_in_flight=config.max_in_flight,
            ),
            replicas=replicas,
            group_timer=group,
            tied=self.fabric.tied_link() if module.tied is not None else None,  # the tied embedding's other end
        )
        self.start_step = 0
        if config.resume is not None:
            state = load_bytes(Path(config.resume.tensors_path).read_bytes())
            self.engine.load_state_tensors(state, config.resume.step)
            self.start_step = config.resume.step
        self._data_ready = trio.Event()

    # -- data -----------------------------------------------------------------------------------------------

    def load_data(self) -> None:
        """On the owner: load the data set and check the resume cursor against it."""
        if not self.is_owner:
            return
        self.source = open_batch_source(self.spec, eval_batch_size=1000)
        self.server = DataServer(self.source, self.config, self.config.total_steps)
        resume = self.config.resume
        if resume is not None and resume.cursor is not None:
            at = self.source.step_of(Cursor.from_dict(dict(resume.cursor)))
            if at != resume.step:
                raise WorkerProtocolError(f"resume cursor {dict(resume.cursor)} is step {at}, not {resume.step}")

    async def _serve_data(self, stream: Stream) -> None:
        await self._data_ready.wait()
        if self.server is None:
            self.fabric.refused["not_owner"] += 1
            return
        await self.server.serve(stream)

    # -- life -----------------------------------------------------------------------------------------------

    async def run(self, commands: trio.abc.ReceiveStream) -> None:
        """Listen, wait for ``start``, train, report. Raises WorkerStopped on ``stop``."""
        identity = load_or_create_identity(Path(self.config.state_dir))
        if identity.peer_id != self.config.peer_id:
            raise WorkerProtocolError(
                f"the identity in {self.config.state_dir} is peer {identity.peer_id}, "
                f"but the config says this worker is {self.config.peer_id}"
            )
        began = time.monotonic()
        await trio.to_thread.run_sync(self.load_data)
        self._data_ready.set()
        loaded = time.monotonic()
        async with open_transport(
            identity,
            self.config.listen_host,
            0,
            unary_handler=_refuse_calls,
            stream_handler=self.fabric.handle_stream,
        ) as transport:
            self.events.emit(Listening(transport.port))
            # where a slow start went (issue 33): the daemon's log has the whole start, this its parts
            print(
                f"stage worker: listening (stage built {self.built_s:.3f} s, data {loaded - began:.3f} s, "
                f"transport {time.monotonic() - loaded:.3f} s)",
                file=sys.stderr,
            )
            async with trio.open_nursery() as nursery:
                start: list[StartCommand] = []
                started = trio.Event()
                nursery.start_soon(_read_commands, commands, start, started, self.control.command)
                await started.wait()
                await self.fabric.connect(transport, start[0].addresses, nursery)
                client = None
                if self.is_first or self.is_last:
                    if self.is_owner:
                        client = DataClient(local=self.server, timeout_s=self.config.link_timeout_s)
                    else:
                        stream = await transport.connect_stream(
                            start[0].addresses[self.config.owner],
                            self.fabric.purpose("data"),
                            expect_peer_id=self.config.owner,
                        )
                        client = DataClient(stream=stream, timeout_s=self.config.link_timeout_s)
                await self._train(nursery, client)
                if client is not None:
                    await client.aclose()
                if self.server is not None and self.config.replica_count() > 1:
                    # retired: the other replicas fetch their data here until their end (or until the daemon stops us)
                    bound = math.inf if self.control.retired.is_set() else self.config.link_timeout_s
                    left = await self.server.wait_clients_done(bound)
                    if left:
                        print(f"stage worker: replicas {sorted(left)} did not finish fetching data", file=sys.stderr)
                await self.fabric.aclose()
                nursery.cancel_scope.cancel()

    async def _train(self, nursery: trio.Nursery, client: DataClient | None) -> None:
        cfg = self.config
        prefetch = Prefetcher(client, self.is_first, self.is_last, self.start_step, cfg.total_steps)
        nursery.start_soon(prefetch.run)
        loop = _StepLoop(
            samples=self.spec.training.batch_size // cfg.share_count(),  # this replica's share of the global batch
            block=int(getattr(self.spec.model, "block_size", 1)),  # an MLP's sample is one example
            n_eval=eval_batch_count(self.spec),
        )
        step = self.start_step
        try:
            with self.control.training:
                for step in range(self.start_step, cfg.total_steps):
                    await self._step(step, prefetch, loop)
        except (LinkError, RingError) as exc:  # a neighbour of this replica is gone
            if not await self.control.retire_after(exc):
                raise
        if self.control.retired.is_set():
            print(f"stage worker: retired at step {step} (its replica was dropped); serving the data", file=sys.stderr)
        self.events.emit(DoneEvent(step if self.control.retired.is_set() else cfg.total_steps))

    async def _step(self, step: int, prefetch: Prefetcher, loop: _StepLoop) -> None:
        """One training step queued; the previous step reported once this one is queued behind it (a worker alone
        on a GPU keeps it busy while it reports: ``pending_step.py``); this step reported at once, with its
        checkpoint, witness and evaluation and a hold for a rebuild after it, when it has any of those."""
        failpoints.hit("worker.step")
        x, y = await prefetch.next(step)
        began = time.perf_counter()
        self.fabric.phase, self.fabric.step = PHASE_TRAIN, step
        pending = await trio.to_thread.run_sync(self.engine.launch_step, x, y, abandon_on_cancel=True)
        if loop.in_flight is not None:
            await self._report(loop)
        loop.in_flight = (pending, began)
        done = step + 1
        cfg, t = self.config, self.spec.training
        checkpoint = done == cfg.total_steps or (cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0)
        evaluate = checkpoint or (t.eval_interval_steps and done % t.eval_interval_steps == 0)
        if checkpoint or evaluate or not self.engine.solo:
            await self._report(loop)
        ring = self.fabric.ring
        if checkpoint and ring.first_replica == self.replica:  # replicas hold the same stage state: the first's
            shard_digest = await self._checkpoint(done)  # is the shard (replica 0's, until it is dropped)
        else:
            shard_digest = None
        if checkpoint and len(ring.replicas) > 1:  # every replica: what it holds alike, for the leader
            await self._witness(done, shard_digest)
        if evaluate and loop.n_eval:
            batches = await prefetch.eval_batches(loop.n_eval)
            loss, acc = await trio.to_thread.run_sync(self._evaluate, done, batches, abandon_on_cancel=True)
            self.events.emit(EvalEvent(done, loss, acc))
        if checkpoint and done == self.control.hold_at and done < cfg.total_steps:
            await self.control.hold(done)

    async def _report(self, loop: _StepLoop) -> None:
        """The step in flight's ``step`` event (its loss read back now), or the error of a step that diverged. Its
        seconds: from its start, or from the previous report when it queued behind that step (its own time on the
        device, in a steady run)."""
        assert loop.in_flight is not None
        pending, began = loop.in_flight
        loop.in_flight = None
        result = await trio.to_thread.run_sync(pending.result, abandon_on_cancel=True)
        if not (math.isfinite(result.loss) and math.isfinite(result.grad_norm or 0.0)):
            raise RuntimeError(f"step {result.step}: loss {result.loss} is not finite; training diverged")
        now = time.perf_counter()
        seconds = now - max(began, loop.reported_at)
        loop.reported_at = now
        self.events.emit(
            StepEvent(
                result.step,
                result.loss,
                result.lr,
                float(result.grad_norm or 0.0),
                loop.samples,
                loop.samples * loop.block,
                seconds,
                result.wait_s,
                result.optimizer_s,
                self.fabric.ring_bytes,
                result.wait_up_s,
                result.wait_down_s,
                result.group_wait_s,
            )
        )

    def _shard(self, step: int) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """This worker's checkpoint shard of ``step``: its state tensors (copied) and the shard's metadata."""
        st = self.config.stages[self.stage]
        split = st.split()
        metadata = {
            "job_id": self.config.job_id,
            "step": str(step),
            "stage": str(self.stage),
            "rank": str(self.rank),
            "start": str(st.start),
            "end": str(st.end),
            "tp_heads": ",".join(str(h) for h in split.heads) if split else "",
            "tp_columns": ",".join(str(c) for c in split.columns) if split else "",
        }
        return {k: v.detach().clone() for k, v in self.engine.state_tensors().items()}, metadata

    async def _checkpoint(self, step: int) -> str:
        """Write this worker's shard of ``step`` and report it; returns the shard's sha256."""
        tensors, metadata = self._shard(step)
        record = await trio.to_thread.run_sync(
            write_shard,
            Path(self.config.checkpoint_dir),
            step,
            shard_name(self.stage, self.rank),
            tensors,
            metadata,
        )
        cursor = self.source.cursor(step).to_dict() if self.source is not None else None
        self.events.emit(
            CheckpointEvent(
                step,
                ShardInfo(record.name, record.sha256, record.size),
                cursor,
                self.engine.param_bytes(),
                self.engine.optimizer_state_bytes(),
            )
        )
        return record.sha256

    async def _witness(self, step: int, shard_digest: str | None) -> None:
        """Emit the digest of the state every replica of this place holds alike (``WitnessEvent``): with the
        gradients averaged every step, the digest of the shard the first replica writes (``shard_digest`` there,
        the same bytes serialised here elsewhere); with DiLoCo, of the outer anchor and momentum."""
        if self.config.replica_sync is not None and self.config.replica_sync.mode == "diloco":
            tensors = {
                k: v.detach().clone() for k, v in self.engine.state_tensors().items() if outer_witness.is_outer(k)
            }
            metadata = outer_witness.metadata(step, self.stage, self.rank)  # what the leader rebuilds from a shard
        elif shard_digest is not None:
            self.events.emit(WitnessEvent(step, shard_digest))
            return
        else:
            tensors, metadata = self._shard(step)
        data = await trio.to_thread.run_sync(save_bytes, tensors, metadata)
        self.events.emit(WitnessEvent(step, hashlib.sha256(data).hexdigest()))  # = outer_witness.digest_of

    def _evaluate(self, step: int, batches: list[Batch]) -> tuple[float, float | None]:
        """Forward-only pass of the eval batches through the pipeline (compute thread), all-reduced."""
        fabric, module = self.fabric, self.engine.module
        fabric.phase, fabric.step = PHASE_EVAL, step
        links = self.engine.links
        loss_total = correct = count = 0.0
        module.eval()
        device = self.engine.device
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.engine.config.autocast_bf16)
        with torch.no_grad(), autocast:
            for i, (x, y) in enumerate(batches):
                inp = x.to(device) if self.is_first and x is not None else links.recv_activation(i).to(device)
                out = module(inp)
                if not self.is_last:
                    if self.rank == 0:
                        links.send_activation(i, out)
                    continue
                if y is None:
                    raise RuntimeError("the last stage got no eval targets (a bug)")
                y = y.to(device)
                loss_total += float(loss_sum(out, y))
                count += y.numel()
                correct += float((out.argmax(dim=-1) == y).sum())
        module.train()
        report = self.is_last and self.rank == 0
        total_loss, total_count, total_correct = links.allreduce_scalars(
            (loss_total, count, correct) if report else (0.0, 0.0, 0.0)
        )
        is_mlp = isinstance(self.spec.model, MLPConfig)
        return total_loss / max(total_count, 1.0), (total_correct / max(total_count, 1.0) if is_mlp else None)


async def _refuse_calls(request: bytes) -> bytes:
    raise RemoteProtocolError("no_unary_service", "a stage worker answers no unary calls")


async def _commands(stream: trio.abc.ReceiveStream) -> AsyncGenerator[Command, None]:
    """The daemon's commands on ``stream``, one JSON object a line, until it closes (``WorkerProtocolError`` for
    a line that is not one)."""
    buffer = b""
    while chunk := await stream.receive_some(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield parse_command(line.decode("utf-8", "replace"))


async def _read_commands(
    commands: trio.abc.ReceiveStream,
    start: list[StartCommand],
    started: trio.Event,
    replicas: Callable[[ReplicaCommand], Awaitable[None]],
) -> None:
    async with contextlib.aclosing(_commands(commands)) as received:
        async for command in received:
            if isinstance(command, StopCommand):
                raise WorkerStopped("stop command")
            if isinstance(command, DropReplicaCommand | GrowReplicaCommand | GoOnCommand | RetireCommand):
                await replicas(command)
                continue
            if started.is_set():
                raise WorkerProtocolError("a second start command")
            start.append(command)
            started.set()
    raise WorkerStopped("stdin closed: the daemon is gone")


async def _main(config: WorkerConfig, events: EventWriter) -> int:
    commands = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    try:
        began = time.monotonic()
        worker = Worker(config, events)
        worker.built_s = time.monotonic() - began
        await worker.run(commands)
    except BaseException as exc:
        if _holds(exc, WorkerStopped):  # told to stop: what failed beside it is the stopping itself
            return 0
        if _holds(exc, LinkError) and await _stop_follows(commands, STOP_GRACE_S):
            return 0
        raise
    return 0


STOP_GRACE_S = 1.0
"""How long a worker whose link failed waits for its own stop command before it reports the failure: the
daemon stops every worker of a job at once, and a neighbour that stopped first ends its streams."""


def _holds(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup):
        match, _ = exc.split(kind)
        return match is not None
    return False


async def _stop_follows(commands: trio.abc.ReceiveStream, grace_s: float) -> bool:
    """Whether a stop command (or the end of stdin) arrives on ``commands`` within ``grace_s``."""
    with trio.move_on_after(grace_s):
        try:
            async with contextlib.aclosing(_commands(commands)) as received:
                async for command in received:
                    if isinstance(command, StopCommand):
                        return True
            return True  # stdin closed: the daemon is gone
        except (trio.BrokenResourceError, trio.ClosedResourceError, WorkerProtocolError, ValueError):
            return False
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arceusd.worker", description="Arceus stage worker")
    parser.add_argument("--config", required=True, help="path of the worker config JSON written by the daemon")
    args = parser.parse_args(argv)
    events = EventWriter(sys.stdout)
    code = 1
    try:
        config = WorkerConfig.from_json(Path(args.config).read_text())
        note = pin_cpus(config.cpus)  # first: the threads started from here on inherit the cores
        if note is not None:
            print(f"stage worker: {note}", file=sys.stderr)
        pin_threads(config.threads)
        code = trio.run(_main, config, events)
    except BaseException as exc:  # report every failure to the daemon, then exit non-zero
        message = _describe(exc)
        print(f"stage worker failed: {message}", file=sys.stderr)
        with contextlib.suppress(Exception):
            events.emit(ErrorEvent(message))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # compute threads may still block in torch; leave at once


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        leaves = exc.exceptions
        return "; ".join(_describe(e) for e in leaves)
    return f"{type(exc).__name__}: {exc}"
