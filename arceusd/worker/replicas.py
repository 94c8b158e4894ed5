"""Data-parallel replicas of a pipeline: how one stage keeps in step with the same stage of the other replicas.

Each replica is a whole pipeline fed its own share of the global batch; the same stage of every replica forms a
ring (``ring.py``). Two modes (``SyncMode``):
- ``ALLREDUCE`` (fast links): before every optimizer step the stage's gradients, plus the step's loss report,
  are averaged over the ring, in buckets of about ``bucket_bytes``. Overlapped with the backward once the
  engine calls ``attach``: buckets hold the parameters in reverse order (the order the backward finishes them),
  a parameter is final when its post-accumulate-grad hook has run once per micro-batch, and a communication
  thread all-reduces each bucket as soon as it and every bucket before it are final (the same bucket order on
  every replica, so the ring rounds match); the last bucket (the first parameters) carries the loss report and
  leaves at the optimizer step, which waits for every bucket and writes the averages into ``.grad`` on the
  compute thread. With equal shares of the batch this is the
  computation of one process on the whole global batch (the tests check it within 1e-5). Clipping and the
  step's scalar exchange run afterwards inside each replica, on gradients that are now the same everywhere.
- ``DILOCO`` (slow links; Douillard et al. 2023, "DiLoCo"): each replica takes ``h`` local steps of its own
  optimizer (AdamW in the paper), then the replicas average their pseudo-gradients (anchor - current
  parameters), compressed with a ``protocol.compression`` codec, and apply an outer Nesterov step to the
  anchor (the paper's defaults: outer lr 0.7, momentum 0.9); every replica resumes from the new anchor. The
  inner optimizer's state stays local. Bytes between replicas: one model per ``h`` steps (times the codec's
  ratio) instead of one per step.

A dropped replica (a device of another replica died; the leader drops that whole replica and the others go on):
the ring's next call fails, the sync waits for the smaller ring (``ring.RingChange``), checks that every rank
left in it completed as many syncs as this one (a sync that finished on some ranks only cannot be redone
alike: it raises, and the job replans from its last checkpoint), and redoes the failed sync over it from what
this replica holds (its local gradients are untouched until the averages are written; DiLoCo's anchor and
parameters until the outer step is applied). The lost replica's share of that step is skipped and the average
is over the replicas left.

Checkpoints: DiLoCo's anchor and outer momentum travel in the stage's shard as optimizer buffers
(``optim.<param>.outer_anchor`` / ``.outer_momentum``), so shards stay in the format re-slicing reads.

The arithmetic (``pseudo_gradient``, ``outer_nesterov_step_``, ``bucket_ranges``) is plain functions with unit
tests; ``ReplicaSync`` only moves tensors through a ``RingLink``.
"""

from __future__ import annotations

import enum
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from arceusd.files.outer_witness import OUTER_ANCHOR, OUTER_MOMENTUM
from arceusd.worker.links import LinkError
from arceusd.worker.ring import RingChange, RingError, RingLink, ring_allreduce_
from protocol.compression import Bf16Codec, Fp16Codec, Int8BlockCodec
from protocol.tensors import RAW, TensorCodec

DEFAULT_BUCKET_BYTES = 4 << 20
FINISH_TIMEOUT_S = 3600.0
"""The optimizer step's bound on waiting for the overlapped all-reduce (each ring receive has its own)."""
RING_FAILURES = (RingError, LinkError)
"""What a broken ring raises: a peer gone or stopped (``LinkError``), a timeout or a bad frame (``RingError``)."""
MAX_RING_CHANGES = 4
"""Smaller rings one sync may be redone over before it gives up."""


class SyncMode(enum.Enum):
    ALLREDUCE = "allreduce"
    DILOCO = "diloco"


class ReplicaCodec(enum.Enum):
    """Codec of the pseudo-gradients DiLoCo exchanges (``protocol.compression``)."""

    RAW = "raw"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"

    def codec(self) -> TensorCodec:
        if self is ReplicaCodec.FP16:
            return Fp16Codec()
        if self is ReplicaCodec.BF16:
            return Bf16Codec()
        if self is ReplicaCodec.INT8:
            return Int8BlockCodec()
        return RAW


@dataclass(frozen=True)
class DiLoCoConfig:
    """DiLoCo's outer loop. Defaults are the paper's (H = 500 there; small jobs want fewer)."""

    h: int = 50
    """Inner (local) steps between two synchronisations."""
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    codec: ReplicaCodec = ReplicaCodec.INT8

    def __post_init__(self) -> None:
        if not 1 <= self.h <= 1_000_000:
            raise ValueError(f"DiLoCo h must be in 1..1000000 inner steps, got {self.h}")
        if not 0 < self.outer_lr <= 10:
            raise ValueError(f"DiLoCo outer_lr must be in (0, 10], got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"DiLoCo outer_momentum must be in [0, 1), got {self.outer_momentum}")


@dataclass(frozen=True)
class ReplicaConfig:
    """How this stage syncs with its peers in the other replicas (``replicas`` = ring size R)."""

    replicas: int
    mode: SyncMode = SyncMode.ALLREDUCE
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    diloco: DiLoCoConfig = field(default_factory=DiLoCoConfig)
    overlap: bool = True
    """ALLREDUCE mode: all-reduce buckets during the backward (``attach``). Off for a worker pinned to one CPU
    core: there the communication thread only takes the core from the backward (bench/swarm_netns.py, 256 KiB
    buckets so that they overlap: 0.92x / 0.81x of one device against 1.22x / 1.20x with the whole model in
    one bucket after the backward)."""
    grad_codec: ReplicaCodec = ReplicaCodec.RAW
    """ALLREDUCE mode: the codec of the gradient buckets on the ring (RAW: exact, the same computation as one
    process; a lossy one still leaves every replica with the same bits, ``ring.py``)."""

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= 1024:
            raise ValueError(f"replicas must be in 1..1024, got {self.replicas}")
        if self.bucket_bytes < 4:
            raise ValueError(f"bucket_bytes must be >= 4, got {self.bucket_bytes}")


# -- pure arithmetic -----------------------------------------------------------------------------------------


def bucket_ranges(numel: int, itemsize: int, bucket_bytes: int) -> tuple[tuple[int, int], ...]:
    """[start, end) element ranges of at most ``bucket_bytes`` each (at least one element) covering ``numel``."""
    per = max(1, bucket_bytes // max(1, itemsize))
    return tuple((a, min(a + per, numel)) for a in range(0, numel, per))


def pseudo_gradient(anchor: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """DiLoCo's outer gradient of one replica: where its inner steps moved away from the anchor (anchor -
    current), so an outer SGD step with lr 1 and no momentum lands on the replicas' average."""
    return anchor - current


def outer_nesterov_step_(
    anchor: torch.Tensor, momentum: torch.Tensor, grad: torch.Tensor, lr: float, mu: float
) -> None:
    """``torch.optim.SGD(nesterov=True, momentum=mu, dampening=0)``'s update of ``anchor`` with ``grad``, in
    place (momentum buffer starts at zero: the first step's buffer is ``grad``, as torch's is)."""
    momentum.mul_(mu).add_(grad)
    anchor.sub_(grad.add(momentum, alpha=mu), alpha=lr)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One float32 CPU vector of ``tensors`` in order (the ring's unit)."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors])


# -- the stage's sync ----------------------------------------------------------------------------------------


class ReplicaSync:
    """One stage's sync with the same stage of the other replicas, over ``link`` (a ring of R ranks)."""

    def __init__(
        self, config: ReplicaConfig, link: RingLink, change: RingChange | None = None, change_timeout_s: float = 120.0
    ) -> None:
        if link.world_size != config.replicas:
            raise ValueError(f"ring of {link.world_size} for {config.replicas} replicas")
        self.config = config
        self.link = link
        self.change = change
        """Where a smaller ring comes from when a replica is dropped (None: a broken ring fails the sync)."""
        self.change_timeout_s = change_timeout_s
        self.rounds = 0
        """Syncs completed (all-reduces of a step's gradients, or DiLoCo outer steps) since this worker began or its
        ring last grew."""
        self.redone = 0
        """Syncs redone over a smaller ring after a replica was dropped."""
        self._anchor: list[torch.Tensor] = []
        self._momentum: list[torch.Tensor] = []
        self.outer_steps = 0
        self._overlap: _Overlap | None = None

    @property
    def world(self) -> int:
        """Replicas in the ring now (fewer than ``config.replicas`` after a drop)."""
        return self.link.world_size

    def grown(self, link: RingLink) -> None:
        """Between two steps, the ring grew back with a rebuilt replica (which starts counting its syncs at 0):
        go on over ``link``, counting syncs from 0 too, so that a later drop's agreement check compares alike."""
        self.link = link
        self.rounds = 0

    def attach(self, params: Sequence[nn.Parameter], micro_batches: int) -> None:
        """ALLREDUCE mode: all-reduce buckets during the backward (module docstring); ``micro_batches``: how many
        backwards accumulate into each gradient per step. A no-op in other modes or for one replica."""
        allreduce = self.config.mode is SyncMode.ALLREDUCE and self.config.overlap
        if allreduce and self.config.replicas > 1 and self._overlap is None:
            self._overlap = _Overlap(self, list(params), micro_batches)

    @property
    def mode(self) -> SyncMode:
        return self.config.mode

    @property
    def overlapped_buckets(self) -> int:
        """Buckets all-reduced during a backward so far (0 without ``attach``)."""
        return self._overlap.early if self._overlap is not None else 0

    def average_grads(self, params: Sequence[nn.Parameter], report: float) -> float:
        """ALLREDUCE mode, before the optimizer step: average every parameter's gradient (a missing one counts
        as zero) and ``report`` (the stage's loss report) over the replicas; returns the averaged report."""
        if self.config.replicas == 1:
            return report
        if self._overlap is not None:
            try:
                return self._overlap.finish(report)
            except RING_FAILURES as exc:  # a replica was dropped (or the ring is broken): redo below, in one go
                self._overlap.restart()
                self._switch(exc)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._allreduce_mean(
            lambda: torch.cat([flatten(grads), torch.tensor([report], dtype=torch.float32)]),
            self.config.grad_codec.codec(),
        )
        with torch.no_grad():
            for p, g in zip(params, _split(flat, grads), strict=True):
                p.grad = g.view_as(p).to(p.device, p.dtype)
        return float(flat[-1])

    def after_step(self, params: Sequence[nn.Parameter], steps_done: int) -> bool:
        """DILOCO mode, after each inner step (``steps_done`` counted from 1): every ``h`` steps the outer
        step. Returns whether one ran. The first call records the anchor (the common start)."""
        if self.config.mode is not SyncMode.DILOCO:
            return False
        if not self._anchor:
            raise RuntimeError("DiLoCo: call start(params) before the first step")
        if steps_done % self.config.diloco.h:
            return False
        self._outer_step(params)
        return True

    def start(self, params: Sequence[nn.Parameter]) -> None:
        """Record the parameters every replica starts from (identical: same seed or same checkpoint)."""
        self._anchor = [p.detach().to("cpu", torch.float32).clone() for p in params]
        self._momentum = [torch.zeros_like(a) for a in self._anchor]

    def outer_state(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """DiLoCo's anchor and outer momentum as optimizer-like buffers of the named parameters
        (``<name>.outer_anchor``, ``<name>.outer_momentum``), for a checkpoint shard; empty in other modes."""
        if self.config.mode is not SyncMode.DILOCO or not self._anchor:
            return {}
        out: dict[str, torch.Tensor] = {}
        for name, anchor, mom in zip(names, self._anchor, self._momentum, strict=True):
            out[f"{name}.{OUTER_ANCHOR}"] = anchor
            out[f"{name}.{OUTER_MOMENTUM}"] = mom
        return out

    def load_outer_state(
        self, params: Sequence[nn.Parameter], names: Sequence[str], state: dict[str, torch.Tensor]
    ) -> None:
        """Restore what ``outer_state`` wrote; without it (an older shard) the parameters become the anchor and
        the momentum restarts at zero."""
        self.start(params)
        if not state:
            return
        for i, (name, p) in enumerate(zip(names, params, strict=True)):
            for kind, target in ((OUTER_ANCHOR, self._anchor), (OUTER_MOMENTUM, self._momentum)):
                t = state.get(f"{name}.{kind}")
                if t is None:
                    raise ValueError(f"checkpoint lacks DiLoCo's {kind} of {name!r}")
                if t.shape != p.shape:
                    raise ValueError(f"DiLoCo {kind} of {name!r} has shape {tuple(t.shape)}, expected {tuple(p.shape)}")
                target[i] = t.detach().to("cpu", torch.float32).clone()

    def _outer_step(self, params: Sequence[nn.Parameter]) -> None:
        cfg = self.config.diloco
        current = [p.detach().to("cpu", torch.float32) for p in params]
        flat = self._allreduce_mean(
            lambda: flatten([pseudo_gradient(a, c) for a, c in zip(self._anchor, current, strict=True)]),
            cfg.codec.codec(),
        )
        with torch.no_grad():
            for anchor, mom, g, p in zip(self._anchor, self._momentum, _split(flat, self._anchor), params, strict=True):
                outer_nesterov_step_(anchor, mom, g.view_as(anchor), cfg.outer_lr, cfg.outer_momentum)
                p.copy_(anchor.to(p.device, p.dtype))
        self.outer_steps += 1

    # -- the ring, and a smaller one after a drop ---------------------------------------------------------

    def _allreduce_mean(self, build: Callable[[], torch.Tensor], codec: TensorCodec) -> torch.Tensor:
        """The mean over the ring of the flat vector ``build()`` makes (in ``bucket_bytes`` pieces); when the
        ring breaks, redone from a fresh ``build()`` over the smaller ring the leader's drop brings."""
        for _ in range(MAX_RING_CHANGES + 1):
            flat = build()
            try:
                for a, b in bucket_ranges(flat.numel(), flat.element_size(), self.config.bucket_bytes):
                    bucket = flat[a:b].clone()
                    ring_allreduce_(bucket, self.link, codec)
                    flat[a:b] = bucket
            except RING_FAILURES as exc:
                self._switch(exc)
                continue
            self.rounds += 1
            return flat.div_(self.world)
        raise RingError(f"the replica ring changed more than {MAX_RING_CHANGES} times during one sync")

    def _switch(self, broke: BaseException) -> None:
        """The ring broke: take the smaller ring (or re-raise without a ``change``) and check that every rank
        in it completed as many syncs as this one, so the sync is redone alike everywhere."""
        if self.change is None:
            raise broke
        self.link = self.change.wait(self.change_timeout_s, str(broke))
        self.redone += 1
        if self.link.world_size == 1:
            return
        count = torch.tensor([float(self.rounds)])
        ring_allreduce_(count, self.link)
        if float(count[0]) != float(self.rounds) * self.link.world_size:
            raise RingError(
                f"the replicas left in the ring completed different numbers of syncs (this one {self.rounds}, "
                f"{float(count[0]) / self.link.world_size:.2f} on average): a sync finished on some of them only, "
                "so it cannot be redone alike; the job must resume from its last checkpoint"
            )


class _Overlap:
    """The all-reduce of one stage's gradient buckets during the backward (``ReplicaSync.attach``)."""

    def __init__(self, sync: ReplicaSync, params: list[nn.Parameter], micro_batches: int) -> None:
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        self.sync = sync
        self.params = params
        self.micro_batches = micro_batches
        self.buckets: list[list[int]] = [[]]
        size = 0
        for i in reversed(range(len(params))):
            nbytes = params[i].numel() * 4
            if self.buckets[-1] and size + nbytes > sync.config.bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += nbytes
        self.bucket_of = {i: b for b, members in enumerate(self.buckets) for i in members}
        self.count = [0] * len(params)
        self.pending = [len(m) for m in self.buckets]
        self.next = 0
        self.early = 0
        """Buckets that left during a backward (before the optimizer step), over all steps so far."""
        self.error: str | None = None
        self._todo: queue.Queue[tuple[int, torch.Tensor] | None] = queue.Queue()
        self._done: queue.Queue[tuple[int, torch.Tensor] | BaseException] = queue.Queue()
        self.handles = [
            p.register_post_accumulate_grad_hook(self._hook(i))  # type: ignore[no-untyped-call]
            for i, p in enumerate(params)
        ]
        self._thread = threading.Thread(target=self._communicate, name="replica-allreduce", daemon=True)
        self._thread.start()

    def _hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            self.count[i] += 1
            if self.count[i] > self.micro_batches:
                self.error = f"parameter {i} got a gradient after it was sent to the other replicas"
            elif self.count[i] == self.micro_batches:
                self.pending[self.bucket_of[i]] -= 1
                while self.next < len(self.buckets) - 1 and self.pending[self.next] == 0:
                    self._send(self.next, None)
                    self.early += 1

        return hook

    def _send(self, b: int, report: float | None) -> None:
        members = self.buckets[b]
        grads = [self.params[i].grad for i in members]
        flat = flatten(
            [g if g is not None else torch.zeros_like(self.params[i]) for g, i in zip(grads, members, strict=True)]
        )
        if report is not None:
            flat = torch.cat([flat, torch.tensor([report], dtype=torch.float32)])
        self._todo.put((b, flat))
        self.next = b + 1

    def _communicate(self) -> None:
        """The communication thread: all-reduce the buckets in order (bucket_bytes pieces each)."""
        while True:
            item = self._todo.get()
            if item is None:
                return
            b, flat = item
            try:
                codec = self.sync.config.grad_codec.codec()
                for a, e in bucket_ranges(flat.numel(), flat.element_size(), self.sync.config.bucket_bytes):
                    piece = flat[a:e].clone()
                    ring_allreduce_(piece, self.sync.link, codec)
                    flat[a:e] = piece
                flat.div_(self.sync.world)
                self._done.put((b, flat))
            except BaseException as exc:  # raised on the compute thread by finish()
                self._done.put(exc)
                return

    def finish(self, report: float) -> float:
        """At the optimizer step: send what is left (the last bucket with ``report``), wait for every bucket,
        write the averages into ``.grad``; returns the averaged report. Resets for the next step."""
        if self.error is not None:
            raise RuntimeError(self.error)
        last = len(self.buckets) - 1
        for b in range(self.next, last):
            self._send(b, None)
        self._send(last, report)
        results: dict[int, torch.Tensor] = {}
        while len(results) < len(self.buckets):  # a ring wait times out on its own (RingError / LinkError)
            try:
                got = self._done.get(timeout=FINISH_TIMEOUT_S)
            except queue.Empty:
                raise RingError("the replicas' gradient all-reduce did not finish in time") from None
            if isinstance(got, BaseException):
                raise got
            results[got[0]] = got[1]
        averaged = 0.0
        with torch.no_grad():
            for b, members in enumerate(self.buckets):
                flat = results[b]
                if b == last:
                    averaged = float(flat[-1])
                    flat = flat[:-1]
                offset = 0
                for i in members:
                    p = self.params[i]
                    p.grad = flat[offset : offset + p.numel()].view_as(p).to(p.device, p.dtype)
                    offset += p.numel()
        self._reset()
        self.sync.rounds += 1
        return averaged

    def _reset(self) -> None:
        self.count = [0] * len(self.params)
        self.pending = [len(m) for m in self.buckets]
        self.next = 0

    def restart(self) -> None:
        """After a failed step (the ring broke): drop what is queued or half done and start a fresh
        communication thread for the next step (the failed one returned when it raised)."""
        self._todo.put(None)
        self._thread.join(timeout=FINISH_TIMEOUT_S)
        for q in (self._todo, self._done):
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        self._reset()
        self.error = None
        self._thread = threading.Thread(target=self._communicate, name="replica-allreduce", daemon=True)
        self._thread.start()


def _split(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset : offset + t.numel()])
        offset += t.numel()
    return out
