"""Seeded, resumable samplers: which examples (or window offsets) global step ``k`` uses.

Owns: the batch order of a training run, as a pure function of (configuration, step), and its cursor.

A sampler is random access: ``indices(step)`` depends only on its configuration and ``step``, never on what
was asked before, so a job resumed from a checkpoint sees exactly the batches the failure-free run would have.
The cursor a checkpoint stores is the *next* step to run as ``{"epoch": e, "step": s}`` (``s`` within epoch
``e``); :func:`global_step` turns it back into ``k``. Randomness comes only from ``torch.Generator``
objects seeded with :func:`derive_seed` (sha256 of the job seed and a label), never from global RNG state.

- :class:`EpochSampler` (MNIST): each epoch is a permutation of ``0..size-1`` seeded by (seed, epoch), cut
  into batches of ``batch_size``; the last partial batch is dropped unless ``drop_last=False``.
- :class:`WindowSampler` (text): each step draws ``batch_size`` window offsets uniformly from
  ``0..n_offsets-1`` with a generator seeded by (seed, step). An "epoch" is ``max(1, n_tokens // (batch_size *
  block_size))`` steps, about one pass over the tokens; it only names progress, sampling does not depend on
  it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from arceusd.data.errors import DataError


def derive_seed(seed: int, label: str, *parts: int) -> int:
    """A 63-bit seed from (job seed, label, integers), stable across machines and Python versions."""
    h = hashlib.sha256()
    h.update(b"arceus-seed-v1\x00")
    h.update(struct.pack(">q", seed))
    h.update(label.encode() + b"\x00")
    for p in parts:
        h.update(struct.pack(">q", p))
    return int.from_bytes(h.digest()[:8], "big") >> 1


@dataclass(frozen=True)
class Cursor:
    """Where a run stands: the next step to run is step ``step`` of epoch ``epoch``."""

    epoch: int
    step: int

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    @classmethod
    def from_dict(cls, d: object) -> Cursor:
        """Parse a stored cursor; ``DataError`` for anything but ``{"epoch": int >= 0, "step": int >= 0}``."""
        if not isinstance(d, dict) or set(d) != {"epoch", "step"}:
            raise DataError(f"sampler cursor must be a dict with exactly 'epoch' and 'step', got {d!r}")
        e, s = d["epoch"], d["step"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (e, s)):
            raise DataError(f"sampler cursor epoch and step must be integers >= 0, got {d!r}")
        return cls(epoch=e, step=s)


def epoch_steps(size: int, batch_size: int, *, drop_last: bool = True) -> int:
    """Steps in one :class:`EpochSampler` epoch: ``size // batch_size`` (``ceil`` without ``drop_last``)."""
    return size // batch_size if drop_last else -(-size // batch_size)


def window_epoch_steps(n_tokens: int, block_size: int, batch_size: int) -> int:
    """Steps in one nominal ``WindowSampler`` epoch: ``max(1, n_tokens // (batch_size * block_size))``."""
    return max(1, n_tokens // (batch_size * block_size))


class Sampler(Protocol):
    """Random-access batch indices with a resumable cursor."""

    @property
    def steps_per_epoch(self) -> int: ...

    def indices(self, step: int) -> torch.Tensor: ...


def cursor_at(sampler: Sampler, step: int) -> Cursor:
    """The cursor naming global ``step``."""
    if step < 0:
        raise DataError(f"step must be >= 0, got {step}")
    return Cursor(epoch=step // sampler.steps_per_epoch, step=step % sampler.steps_per_epoch)


def global_step(sampler: Sampler, cursor: Cursor) -> int:
    """The global step a cursor names; ``DataError`` if the cursor does not fit this sampler's epochs."""
    if cursor.step >= sampler.steps_per_epoch:
        raise DataError(
            f"cursor step {cursor.step} is outside an epoch of {sampler.steps_per_epoch} steps; "
            "was it saved by a run with a different data set or batch size?"
        )
    return cursor.epoch * sampler.steps_per_epoch + cursor.step


def iterate(
    sampler: Sampler, start: Cursor | None = None, *, limit: int
) -> Iterator[tuple[Cursor, torch.Tensor]]:
    """Yield ``(cursor, indices)`` for ``limit`` steps from ``start`` (default: the beginning)."""
    k = 0 if start is None else global_step(sampler, start)
    for step in range(k, k + limit):
        yield cursor_at(sampler, step), sampler.indices(step)


class EpochSampler:
    """Shuffled epochs over ``size`` examples (see the module docstring)."""

    def __init__(self, size: int, batch_size: int, seed: int, *, drop_last: bool = True) -> None:
        if size < 1 or batch_size < 1:
            raise DataError(f"EpochSampler needs size >= 1 and batch_size >= 1, got {size}, {batch_size}")
        if drop_last and batch_size > size:
            raise DataError(f"batch_size {batch_size} is larger than the {size} examples (with drop_last)")
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self._steps = epoch_steps(size, batch_size, drop_last=drop_last)
        self._cached: tuple[int, torch.Tensor] | None = None

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def permutation(self, epoch: int) -> torch.Tensor:
        """The example order of ``epoch`` (cached for the latest epoch asked)."""
        if self._cached is None or self._cached[0] != epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
            self._cached = (epoch, torch.randperm(self.size, generator=g))
        return self._cached[1]

    def indices(self, step: int) -> torch.Tensor:
        c = cursor_at(self, step)
        start = c.step * self.batch_size
        return self.permutation(c.epoch)[start : start + self.batch_size]


class WindowSampler:
    """Independent uniform window offsets per step (see the module docstring)."""

    def __init__(self, n_tokens: int, block_size: int, batch_size: int, seed: int) -> None:
        if block_size < 1 or batch_size < 1:
            raise DataError(
                f"WindowSampler needs block_size >= 1 and batch_size >= 1, got {block_size}, {batch_size}"
            )
        if n_tokens < block_size + 1:
            raise DataError(
                f"{n_tokens} tokens are too few for one window of block_size {block_size} (+1 target)"
            )
        self.n_tokens = n_tokens
        self.n_offsets = n_tokens - block_size
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self._steps = window_epoch_steps(n_tokens, block_size, batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def indices(self, step: int) -> torch.Tensor:
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        g = torch.Generator().manual_seed(derive_seed(self.seed, "window", step))
        return torch.randint(0, self.n_offsets, (self.batch_size,), generator=g)
