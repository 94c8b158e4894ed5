"""All-reduce interfaces and their in-memory (threaded) implementation for tests.

``Collective``: the tensor-parallel group of one stage, ``all_reduce_sum(tensor) -> tensor`` (every rank calls
it in the same order with same-shaped tensors and gets the same sum). The real one lives with the transport.

``TimedCollective`` wraps one and counts the seconds its rank spent inside ``all_reduce_sum`` (waiting for the
group's slowest rank, and the transfer; the engine reports them per step as ``group_wait_s``) and the calls.

``InMemoryAllReduce`` serves N threads: each call blocks until all N ranks contributed, then every rank gets
the sum taken in rank order (so all ranks see bit-identical results, like a deterministic ring). A bounded
wait turns a mismatched call pattern into an error instead of a hung test.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import torch

DEFAULT_TIMEOUT_S = 30.0


class Collective(Protocol):
    """Tensor-parallel group collective (blocking; call from the stage's compute thread)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over all ranks of the group (a new tensor; the input is not modified)."""
        ...


class TimedCollective:
    """A :class:`Collective` that adds the seconds spent in each ``all_reduce_sum`` to ``waited_s`` and counts
    the calls in ``calls``."""

    def __init__(self, inner: Collective) -> None:
        self.inner = inner
        self.waited_s = 0.0
        self.calls = 0

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        began = time.perf_counter()
        self.calls += 1
        try:
            return self.inner.all_reduce_sum(tensor)
        finally:
            self.waited_s += time.perf_counter() - began

    def take(self) -> float:
        """The seconds counted since the last ``take``, and start again from zero."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited


class CollectiveTimeout(RuntimeError):
    """A rank waited too long for the others: the ranks' calls do not line up (a bug) or a peer died."""


class InMemoryAllReduce:
    """Shared state of one in-process group; hand each thread ``rank_view(r)``."""

    def __init__(self, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._slots: list[object | None] = [None] * world_size
        self._arrived = 0
        self._generation = 0
        self._result: object | None = None
        self._taken = 0

    def reduce(self, rank: int, value: object, combine: _Combine) -> object:
        with self._cond:
            # wait until the previous round's results were collected by everyone
            if not self._cond.wait_for(lambda: self._taken == 0 or self._arrived > 0, self.timeout_s):
                raise CollectiveTimeout(f"rank {rank}: previous all-reduce round never drained")
            if self._slots[rank] is not None:
                raise CollectiveTimeout(f"rank {rank} entered the same all-reduce round twice")
            gen = self._generation
            self._slots[rank] = value
            self._arrived += 1
            if self._arrived == self.world_size:
                self._result = combine(self._slots)
                self._slots = [None] * self.world_size
                self._arrived = 0
                self._taken = self.world_size
                self._generation += 1
                self._cond.notify_all()
            elif not self._cond.wait_for(lambda: self._generation != gen, self.timeout_s):
                raise CollectiveTimeout(
                    f"rank {rank} waited {self.timeout_s}s for {self.world_size - self._arrived} other rank(s)"
                )
            result = self._result
            self._taken -= 1
            if self._taken == 0:
                self._cond.notify_all()
            return result

    def rank_view(self, rank: int) -> InMemoryCollective:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        return InMemoryCollective(self, rank)


class _Combine(Protocol):
    def __call__(self, values: list[object | None]) -> object: ...


def _sum_tensors(values: list[object | None]) -> object:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    out = tensors[0].clone()
    for t in tensors[1:]:
        out.add_(t)
    return out


def _sum_floats(values: list[object | None]) -> object:
    return float(sum(float(v) for v in values if isinstance(v, float | int)))


class InMemoryCollective:
    """One rank's handle on an ``InMemoryAllReduce`` (implements ``Collective``)."""

    def __init__(self, group: InMemoryAllReduce, rank: int) -> None:
        self._group = group
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = self._group.reduce(self._rank, tensor.detach().clone(), _sum_tensors)
        if not isinstance(out, torch.Tensor):
            raise TypeError("all-reduce round mixed tensors and scalars")
        return out.clone()

    def all_reduce_scalar(self, value: float) -> float:
        out = self._group.reduce(self._rank, float(value), _sum_floats)
        if not isinstance(out, float):
            raise TypeError("all-reduce round mixed tensors and scalars")
        return out
