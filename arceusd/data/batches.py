"""Batch sources: what the job owner serves each step (inputs to stage 0, targets to the last stage).

Owns: turning a loaded data set plus a sampler into ``batch(step) -> (inputs, targets)`` and fixed held-out
batches for evaluation. Both are deterministic functions of (data, configuration, seed, step).

- :class:`MnistBatches`: inputs float32 ``(B, 784)``, targets int64 ``(B,)``; held-out data in file order,
  chunks of ``eval_batch_size``.
- :class:`TextBatches`: inputs and targets int64 ``(B, block_size)`` (targets shifted by one); evaluation is
  ``eval_iters`` batches of validation windows drawn with a generator seeded from the job seed, the same every
  time it is asked (so evaluations at different steps compare like with like).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from arceusd.data.errors import DataError
from arceusd.data.mnist import MnistData
from arceusd.data.sampler import Cursor, EpochSampler, WindowSampler, cursor_at, derive_seed, global_step
from arceusd.data.text import TextData, context_windows


class BatchSource(Protocol):
    """One data set kind's batches, random access by global step."""

    @property
    def steps_per_epoch(self) -> int: ...

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def cursor(self, step: int) -> Cursor: ...

    def step_of(self, cursor: Cursor) -> int: ...


class MnistBatches:
    """Shuffled-epoch MNIST batches (see the module docstring)."""

    def __init__(self, data: MnistData, batch_size: int, seed: int, *, eval_batch_size: int = 1000) -> None:
        if eval_batch_size < 1:
            raise DataError(f"eval_batch_size must be >= 1, got {eval_batch_size}")
        self.data = data
        self.sampler = EpochSampler(int(data.train_labels.numel()), batch_size, seed)
        self.eval_batch_size = eval_batch_size

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.sampler.indices(step)
        return self.data.train_images[idx], self.data.train_labels[idx]

    def eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = int(self.data.holdout_labels.numel())
        for start in range(0, n, self.eval_batch_size):
            end = start + self.eval_batch_size
            yield self.data.holdout_images[start:end], self.data.holdout_labels[start:end]

    def cursor(self, step: int) -> Cursor:
        return cursor_at(self.sampler, step)

    def step_of(self, cursor: Cursor) -> int:
        return global_step(self.sampler, cursor)


class Splits(Protocol):
    """A token stream's train and validation splits (characters, or a tokenizer's ids)."""

    @property
    def train(self) -> torch.Tensor: ...

    @property
    def val(self) -> torch.Tensor: ...


class TextBatches:
    """Random-window batches over a token stream (see the module docstring): characters, or a tokenizer's ids
    (:class:`arceusd.data.tokenized.TokenBatches`)."""

    def __init__(
        self, data: TextData | Splits, block_size: int, batch_size: int, seed: int, *, eval_iters: int = 20
    ) -> None:
        if eval_iters < 0:
            raise DataError(f"eval_iters must be >= 0, got {eval_iters}")
        self.data = data
        self.block_size = block_size
        self.sampler = WindowSampler(int(data.train.numel()), block_size, batch_size, seed)
        self.eval_iters = eval_iters
        self.seed = seed
        if eval_iters and data.val.numel() < block_size + 1:
            raise DataError(
                f"the validation split has {data.val.numel()} tokens, too few for one window of "
                f"block_size {block_size}; lower val_fraction's effect or block_size, or set eval_iters = 0"
            )

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return context_windows(self.data.train, self.sampler.indices(step), self.block_size)

    def eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n_offsets = int(self.data.val.numel()) - self.block_size
        g = torch.Generator().manual_seed(derive_seed(self.seed, "eval"))
        for _ in range(self.eval_iters):
            offsets = torch.randint(0, n_offsets, (self.sampler.batch_size,), generator=g)
            yield context_windows(self.data.val, offsets, self.block_size)

    def cursor(self, step: int) -> Cursor:
        return cursor_at(self.sampler, step)

    def step_of(self, cursor: Cursor) -> int:
        return global_step(self.sampler, cursor)
