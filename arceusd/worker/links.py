"""``Links``: what a stage engine needs from the transport, and an in-memory implementation for tests.

Blocking calls, made from the engine's compute thread (a trio worker wraps them with ``trio.from_thread.run``
so the event loop never runs torch). Contract:
- ``send_activation(i, t)`` goes from stage s to *every* tensor-parallel rank of stage s + 1; ``send_grad(i,
  t)`` from stage s to every rank of stage s - 1. Only tensor-parallel rank 0 of a stage sends (the other
  ranks hold identical tensors); every rank receives.
- Per direction, messages arrive in send order; a send may block only while an earlier message in the same
  direction is undelivered (buffer >= 1 per direction, see ``schedule.py``). ``recv_*(i)`` returns the tensor
  for micro-batch ``i`` of the current step; a mismatch is a protocol error.
- ``allreduce_scalars(xs)`` sums each of ``xs`` over every worker of the job (all stages, all ranks) in one
  exchange; every worker calls it the same number of times per step with the same number of values (the
  engine: once, with the squared gradient norm and the loss report). ``allreduce_scalar(x)`` is the one-value
  form.
- Sends may be asynchronous: the caller must not modify a tensor after sending it. A failed send is raised
  at a later link call of the same step at the latest.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Protocol

import torch

from arceusd.worker.collective import DEFAULT_TIMEOUT_S, InMemoryAllReduce, InMemoryCollective


class Links(Protocol):
    def send_activation(self, micro_batch: int, tensor: torch.Tensor) -> None: ...

    def recv_activation(self, micro_batch: int) -> torch.Tensor: ...

    def send_grad(self, micro_batch: int, tensor: torch.Tensor) -> None: ...

    def recv_grad(self, micro_batch: int) -> torch.Tensor: ...

    def allreduce_scalar(self, value: float) -> float: ...

    def allreduce_scalars(self, values: Sequence[float]) -> list[float]: ...


class LinkError(RuntimeError):
    """A link was misused (wrong sender, wrong direction) or a message did not arrive in time / in order."""


_Msg = tuple[int, torch.Tensor]


class InMemoryFabric:
    """All links of one in-process pipeline (a thread per worker); ``tp_sizes[s]`` ranks per stage."""

    def __init__(self, tp_sizes: Sequence[int], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not tp_sizes or any(n < 1 for n in tp_sizes):
            raise ValueError(f"tp_sizes must list >= 1 rank for each of >= 1 stage, got {list(tp_sizes)}")
        self.tp_sizes = tuple(tp_sizes)
        self.timeout_s = timeout_s
        self._act: dict[tuple[int, int], queue.Queue[_Msg]] = {}
        self._grad: dict[tuple[int, int], queue.Queue[_Msg]] = {}
        for s, n in enumerate(self.tp_sizes):
            for r in range(n):
                self._act[(s, r)] = queue.Queue()
                self._grad[(s, r)] = queue.Queue()
        self._scalar = InMemoryAllReduce(sum(self.tp_sizes), timeout_s)
        self._offsets = [sum(self.tp_sizes[:s]) for s in range(len(self.tp_sizes))]

    def links(self, stage: int, rank: int = 0) -> InMemoryLinks:
        if not 0 <= stage < len(self.tp_sizes) or not 0 <= rank < self.tp_sizes[stage]:
            raise ValueError(f"no worker (stage {stage}, rank {rank}) in a fabric with tp sizes {self.tp_sizes}")
        return InMemoryLinks(self, stage, rank, self._scalar.rank_view(self._offsets[stage] + rank))

    def _fan_out(self, src_stage: int, src_rank: int, dst_stage: int, kind: str, msg: _Msg) -> None:
        if src_rank != 0:
            raise LinkError(f"stage {src_stage} rank {src_rank} sent a {kind}: only rank 0 of a stage sends")
        if not 0 <= dst_stage < len(self.tp_sizes):
            raise LinkError(f"stage {src_stage} sent a {kind} to stage {dst_stage}, which does not exist")
        table = self._act if kind == "activation" else self._grad
        for r in range(self.tp_sizes[dst_stage]):
            table[(dst_stage, r)].put((msg[0], msg[1].detach().clone()))

    def _recv(self, stage: int, rank: int, kind: str, micro_batch: int) -> torch.Tensor:
        table = self._act if kind == "activation" else self._grad
        try:
            got, tensor = table[(stage, rank)].get(timeout=self.timeout_s)
        except queue.Empty:
            raise LinkError(f"stage {stage} rank {rank} waited {self.timeout_s}s for {kind} {micro_batch}") from None
        if got != micro_batch:
            raise LinkError(f"stage {stage} rank {rank} expected {kind} {micro_batch} but got {got}")
        return tensor


class InMemoryLinks:
    """One worker's ``Links`` on an ``InMemoryFabric``."""

    def __init__(self, fabric: InMemoryFabric, stage: int, rank: int, scalar: InMemoryCollective) -> None:
        self._fabric = fabric
        self.stage = stage
        self.rank = rank
        self._scalar = scalar

    def send_activation(self, micro_batch: int, tensor: torch.Tensor) -> None:
        self._fabric._fan_out(self.stage, self.rank, self.stage + 1, "activation", (micro_batch, tensor))

    def recv_activation(self, micro_batch: int) -> torch.Tensor:
        return self._fabric._recv(self.stage, self.rank, "activation", micro_batch)

    def send_grad(self, micro_batch: int, tensor: torch.Tensor) -> None:
        self._fabric._fan_out(self.stage, self.rank, self.stage - 1, "grad", (micro_batch, tensor))

    def recv_grad(self, micro_batch: int) -> torch.Tensor:
        return self._fabric._recv(self.stage, self.rank, "grad", micro_batch)

    def allreduce_scalar(self, value: float) -> float:
        return self._scalar.all_reduce_scalar(value)

    def allreduce_scalars(self, values: Sequence[float]) -> list[float]:
        return [self._scalar.all_reduce_scalar(v) for v in values]
