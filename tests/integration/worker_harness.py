"""Plays the daemon for stage-worker processes: writes configs, spawns ``python -m arceusd.worker``, reads
events.

Also the single-process reference (a plain PyTorch loop on the same batches) and the gathering of a full model
from the workers' checkpoint shards, shared by the worker integration tests. Every wait is bounded and
``WorkerJob`` kills its children on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from arceusd.base.identity import load_or_create_identity
from arceusd.files.checkpoint import step_dir
from arceusd.files.safetensors_io import load_bytes
from arceusd.jobs.procs.source import open_batch_source
from arceusd.jobs.spec.schema import JobSpec, parse_spec, to_dict
from arceusd.models.build import build_reference_model, loss_mean
from arceusd.models.config import GPTConfig
from arceusd.worker.protocol import (
    DoneEvent,
    ErrorEvent,
    Event,
    Listening,
    MemberConfig,
    ReplicaSyncConfig,
    StageConfig,
    StartCommand,
    StepEvent,
    StopCommand,
    WorkerConfig,
    parse_event,
)
from arceusd.worker.tensor_parallel import TPSplit, gather_tensor

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
MNIST_DIR = DATA / "mnist"
SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"

START_S = 120.0
"""How long the workers of a job may take to say they listen: each is a cold ``python -m arceusd.worker`` that
imports torch, all at once on two cores. At 30 s, with three workers beside other work (load 6-7), the
tensor-parallel and 3-worker exactness tests timed out before any worker had listened (3 of 6 runs)."""

Layout = Sequence[tuple[int, int, TPSplit | None]]
"""(start, end, tensor-parallel split or None) per stage."""


def make_spec(doc: Mapping[str, Any]) -> JobSpec:
    """Validate a spec document with its data files checked (paths absolute)."""
    return parse_spec(dict(doc), base_dir=ROOT, check_files=True)


def stock_lm_spec(tmp: Path, name: str, config: Mapping[str, Any], steps: int, **sections: Any) -> JobSpec:
    """A stock LM (``config``: its ``config.json`` as a dict) on 20,000 characters of Tiny Shakespeare and the
    shipped BPE tokenizer, trained ``steps`` steps of SGD with momentum and clipping (exact to compare: clipping
    below the gradient's norm, no AdamW noise on rare rows); ``sections``: more of the spec (``lora``)."""
    text = tmp / "text.txt"
    text.write_text(SHAKESPEARE.read_text()[:20000])
    return make_spec(
        {
            "name": name,
            "seed": 5,
            "model": {"type": "hf", "config": dict(config), "block_size": 16},
            "data": {
                "kind": "tokens",
                "path": str(text),
                "tokenizer": str(DATA / "tokenizers" / "shakespeare-bpe.json"),
                "val_fraction": 0.1,
            },
            **sections,
            "training": {
                "steps": steps,
                "batch_size": 8,
                "micro_batches": 2,
                "optimizer": "sgd",
                "lr": 0.5,
                "momentum": 0.9,
                "grad_clip": 0.5,
                "eval_iters": 1,
            },
        }
    )


def mnist_spec(layer_sizes: Sequence[int], steps: int, *, batch: int = 32, micro: int = 4, **training: Any) -> JobSpec:
    return make_spec(
        {
            "name": "mnist-test",
            "seed": 7,
            "model": {"type": "mlp", "layer_sizes": list(layer_sizes)},
            "data": {"kind": "mnist", "dir": str(MNIST_DIR), "train_count": 8000, "holdout_count": 2000},
            "training": {
                "steps": steps,
                "batch_size": batch,
                "micro_batches": micro,
                "optimizer": "sgd",
                "lr": 0.05,
                "momentum": 0.9,
                **training,
            },
        }
    )


def gpt_spec(
    steps: int,
    *,
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 32,
    block: int = 16,
    batch: int = 8,
    micro: int = 4,
    eval_iters: int = 2,
    **training: Any,
) -> JobSpec:
    return make_spec(
        {
            "name": "gpt-test",
            "seed": 11,
            "model": {
                "type": "gpt",
                "n_layer": n_layer,
                "n_head": n_head,
                "n_embd": n_embd,
                "block_size": block,
                "vocab_size": 65,
            },
            "data": {"kind": "text", "path": str(SHAKESPEARE), "val_fraction": 0.1},
            "training": {
                "steps": steps,
                "batch_size": batch,
                "micro_batches": micro,
                "optimizer": "adamw",
                "lr": 3e-3,
                "weight_decay": 0.1,
                "eval_iters": eval_iters,
                **training,
            },
        }
    )


@dataclass
class WorkerProc:
    peer_id: str
    stage: int
    rank: int
    state_dir: Path
    config_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    events: list[Event] = field(default_factory=list)
    inbox: queue.Queue[Event | None] = field(default_factory=queue.Queue)
    port: int = 0
    replica: int = 0

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self.inbox.put(parse_event(line))
        self.inbox.put(None)

    def next_event(self, deadline: float) -> Event | None:
        """The next event, or None once stdout closed; TimeoutError past ``deadline`` (monotonic)."""
        try:
            ev = self.inbox.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(
                f"worker stage {self.stage} rank {self.rank}: no event in time; log:\n" + self.log()
            ) from None
        if ev is not None:
            self.events.append(ev)
        return ev

    def send(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def log(self) -> str:
        try:
            return self.log_path.read_text()[-4000:]
        except OSError:
            return "(no log)"

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class WorkerJob:
    """One job's workers as processes on 127.0.0.1 (context manager: children are always killed)."""

    def __init__(
        self,
        tmp: Path,
        spec: JobSpec,
        layout: Layout,
        *,
        micro_batches: int | None = None,
        schedule: str = "gpipe",
        total_steps: int | None = None,
        checkpoint_interval: int = 0,
        owner: tuple[int, int] = (0, 0),
        threads: int = 1,
        link_timeout_s: float = 60.0,
        job_id: str = "job-test",
        cpus: Sequence[tuple[int, ...]] | None = None,
        devices: Sequence[str] | None = None,
        replicas: int = 1,
        replica_sync: ReplicaSyncConfig | None = None,
    ) -> None:
        """``cpus``: the cores of each worker, in worker order (replica, stage, then rank); None: none pinned.
        ``devices``: each worker's torch device in the same order; None: all on the CPU. ``replicas`` > 1:
        that many copies of the layout, synced as ``replica_sync`` says (default: all-reduce); ``owner`` is a
        (stage, rank) of replica 0."""
        self.tmp = tmp
        self.spec = spec
        self.layout = list(layout)
        self.checkpoint_dir = tmp / "checkpoints"
        self.workers: list[WorkerProc] = []
        all_stages: list[tuple[StageConfig, ...]] = []
        for rep in range(replicas):
            stages = []
            for s, (start, end, split) in enumerate(self.layout):
                members = []
                for r in range(1 if split is None else split.world_size):
                    tag = f"{s}-{r}" if replicas == 1 else f"{rep}-{s}-{r}"
                    state = tmp / f"state-{tag}"
                    pid = load_or_create_identity(state).peer_id
                    config_path, log_path = tmp / f"worker-{tag}.json", tmp / f"worker-{tag}.log"
                    self.workers.append(WorkerProc(pid, s, r, state, config_path, log_path, replica=rep))
                    heads, cols = (split.heads[r], split.columns[r]) if split is not None else (0, 0)
                    members.append(MemberConfig(pid, heads, cols))
                stages.append(StageConfig(start, end, tuple(members)))
            all_stages.append(tuple(stages))
        owner_pid = next(w.peer_id for w in self.workers if (w.replica, w.stage, w.rank) == (0, *owner))
        sync = (replica_sync or ReplicaSyncConfig()) if replicas > 1 else None
        self.configs: dict[str, WorkerConfig] = {}
        for i, w in enumerate(self.workers):
            cfg = WorkerConfig(
                job_id=job_id,
                term=1,
                epoch=1,
                spec=to_dict(spec),
                stages=all_stages[w.replica],
                replicas=tuple(all_stages) if replicas > 1 else (),
                replica_sync=sync,
                micro_batches=micro_batches or spec.training.micro_batches,
                schedule=schedule,
                peer_id=w.peer_id,
                state_dir=str(w.state_dir),
                listen_host="127.0.0.1",
                owner=owner_pid,
                checkpoint_dir=str(self.checkpoint_dir),
                checkpoint_interval=checkpoint_interval,
                total_steps=total_steps or spec.training.steps,
                threads=threads,
                link_timeout_s=link_timeout_s,
                cpus=cpus[i] if cpus is not None else (),
                device=devices[i] if devices is not None else "cpu",
            )
            w.config_path.write_text(cfg.to_json())
            self.configs[w.peer_id] = cfg

    def __enter__(self) -> WorkerJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def spawn(self) -> None:
        for w in self.workers:
            self._spawn_one(w)

    def _spawn_one(self, w: WorkerProc) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        with w.log_path.open("wb") as log:
            w.proc = subprocess.Popen(
                [sys.executable, "-m", "arceusd.worker", "--config", str(w.config_path)],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
            )
        threading.Thread(target=w._read, daemon=True).start()

    def new_identity(self, tag: str) -> tuple[str, Path]:
        """A fresh device identity for a worker added later: its peer id and state folder."""
        state = self.tmp / f"state-{tag}"
        return load_or_create_identity(state).peer_id, state

    def add_worker(self, config: WorkerConfig, tag: str, stage: int = 0, rank: int = 0, replica: int = 0) -> WorkerProc:
        """Start one more worker with ``config`` (its identity from :meth:`new_identity`); killed with the rest."""
        w = WorkerProc(
            config.peer_id,
            stage,
            rank,
            Path(config.state_dir),
            self.tmp / f"worker-{tag}.json",
            self.tmp / f"worker-{tag}.log",
            replica=replica,
        )
        w.config_path.write_text(config.to_json())
        self.workers.append(w)
        self.configs[w.peer_id] = config
        self._spawn_one(w)
        return w

    def wait_listening(self, timeout: float = START_S) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        for w in self.workers:
            ev = w.next_event(deadline)
            if not isinstance(ev, Listening):
                raise AssertionError(f"worker {w.stage}/{w.rank} said {ev!r} instead of listening:\n{w.log()}")
            w.port = ev.port
        return {w.peer_id: f"127.0.0.1:{w.port}" for w in self.workers}

    def start(self, addresses: Mapping[str, str] | None = None, timeout: float = START_S) -> dict[str, str]:
        """Spawn, wait for every 'listening', send 'start' (``addresses`` overrides the real ones)."""
        self.spawn()
        real = self.wait_listening(timeout)
        for w in self.workers:
            w.send(StartCommand(dict(addresses or real)).to_line())
        return real

    def run(self, timeout: float = 60.0) -> None:
        """Collect events until every worker said done (AssertionError on an error event) and exited 0."""
        deadline = time.monotonic() + timeout
        self.run_events(timeout)
        for w in self.workers:
            assert w.proc is not None
            code = w.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, f"worker {w.stage}/{w.rank} exited {code}:\n{w.log()}"

    def run_events(self, timeout: float = 60.0) -> None:
        """Collect events until every worker said done (AssertionError on an error event or an early end)."""
        deadline = time.monotonic() + timeout
        for w in self.workers:
            while True:
                ev = w.next_event(deadline)
                if ev is None:
                    raise AssertionError(f"worker {w.stage}/{w.rank} ended without 'done':\n{w.log()}")
                if isinstance(ev, ErrorEvent):
                    raise AssertionError(f"worker {w.stage}/{w.rank} failed: {ev.message}\n{w.log()}")
                if isinstance(ev, DoneEvent):
                    break

    def wait_past(self, step: int, deadline: float, workers: Sequence[WorkerProc] | None = None) -> None:
        """Collect events until every worker (or each of ``workers``) reported step ``step`` or a later one."""
        for w in self.workers if workers is None else workers:
            while not any(e.step >= step for e in w.of(StepEvent)):
                assert w.next_event(deadline) is not None, w.log()

    def until_done(self, w: WorkerProc, deadline: float, exits: bool = True) -> None:
        """Collect ``w``'s events until it said done (AssertionError on an error or an early end); ``exits``: then
        it must exit 0."""
        while not w.of(DoneEvent):
            ev = w.next_event(deadline)
            assert ev is not None and not isinstance(ev, ErrorEvent), f"{ev}\n{w.log()}"
        if exits:
            assert w.proc is not None and w.proc.wait(timeout=30) == 0, w.log()

    def stop(self, w: WorkerProc) -> None:
        w.send(StopCommand().to_line())

    def kill(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        for w in self.workers:
            if w.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(timeout=10)

    # -- results --------------------------------------------------------------------------------------------

    def gathered_params(self, step: int) -> dict[str, torch.Tensor]:
        """The full model (names ``"<block>.<param>"``) from the step's shards, TP slices gathered."""
        directory = step_dir(self.checkpoint_dir, step)
        full: dict[str, torch.Tensor] = {}
        for s, (_, _, split) in enumerate(self.layout):
            ranks = [
                load_bytes((directory / f"stage{s}-rank{r}.safetensors").read_bytes())
                for r in range(1 if split is None else split.world_size)
            ]
            for key in ranks[0]:
                if not key.startswith("param.blocks."):
                    continue
                block, _, name = key[len("param.blocks.") :].partition(".")
                if split is None:
                    value = ranks[0][key]
                else:
                    assert isinstance(self.spec.model, GPTConfig)
                    value = gather_tensor(name, [r[key] for r in ranks], self.spec.model, split)
                full[f"{block}.{name}"] = value
        return full


def reference_run(spec: JobSpec, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A plain single-process PyTorch loop on the job's batches: per-step losses and final parameters."""
    torch.manual_seed(0)
    model = build_reference_model(spec.model, spec.seed)
    t = spec.training
    optimizer: torch.optim.Optimizer
    if t.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    source = open_batch_source(spec)
    losses = []
    for step in range(steps):
        x, y = source.batch(step)
        for g in optimizer.param_groups:
            g["lr"] = t.lr_at(step)
        optimizer.zero_grad()
        loss = loss_mean(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


def transformers_sgd_run(model: Any, spec: JobSpec, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A plain transformers loop of ``model`` (loaded with the job's initial tensors) on the job's batches: SGD
    with the spec's momentum and clipping; per-step losses and the final state dict (the reference of the stock-LM
    worker tests)."""
    import torch.nn.functional as F

    t = spec.training
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=t.lr, momentum=t.momentum)
    source = open_batch_source(spec)
    losses = []
    for step in range(steps):
        x, y = source.batch(step)
        optimizer.zero_grad()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses)
    return losses, {k: v.detach() for k, v in model.state_dict().items()}
