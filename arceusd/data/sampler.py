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

from collections.abc import Iterator
from typing import Protocol

import torch

from arceusd.data.errors import DataError
from arceusd.data.steps import Cursor as Cursor
from arceusd.data.steps import derive_seed as derive_seed
from arceusd.data.steps import epoch_steps as epoch_steps
from arceusd.data.steps import window_epoch_steps as window_epoch_steps


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


def iterate(sampler: Sampler, start: Cursor | None = None, *, limit: int) -> Iterator[tuple[Cursor, torch.Tensor]]:
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
            raise DataError(f"WindowSampler needs block_size >= 1 and batch_size >= 1, got {block_size}, {batch_size}")
        if n_tokens < block_size + 1:
            raise DataError(f"{n_tokens} tokens are too few for one window of block_size {block_size} (+1 target)")
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
