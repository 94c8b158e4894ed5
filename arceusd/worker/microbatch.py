"""Splitting a batch into micro-batches, and the loss weighting that keeps the gradient exact.

Sizes follow ``torch.tensor_split``: the first ``B % m`` micro-batches get one more sample, so a batch that
does not divide evenly ends with smaller micro-batches and none is empty (``m <= B`` required).

Weighting: each micro-batch's loss is ``loss_sum(micro-batch) / N`` with ``N`` the number of targets in the
*whole* batch (``B`` for an MLP, ``B * T`` for a GPT). The accumulated gradient is then exactly the gradient
of the full-batch mean loss, and the per-micro-batch losses add up to it.
"""

from __future__ import annotations

import torch


def micro_batch_sizes(batch_size: int, num_micro_batches: int) -> list[int]:
    """Sizes of the ``num_micro_batches`` micro-batches of a batch of ``batch_size`` samples."""
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be >= 1, got {num_micro_batches}")
    if batch_size < num_micro_batches:
        raise ValueError(
            f"batch of {batch_size} samples cannot be split into {num_micro_batches} non-empty micro-batches;"
            " use a larger batch or fewer micro-batches"
        )
    base, extra = divmod(batch_size, num_micro_batches)
    return [base + 1 if i < extra else base for i in range(num_micro_batches)]


def split_micro_batches(batch: torch.Tensor, num_micro_batches: int) -> list[torch.Tensor]:
    """Split along dim 0 into ``num_micro_batches`` contiguous pieces (sizes from ``micro_batch_sizes``)."""
    sizes = micro_batch_sizes(batch.shape[0], num_micro_batches)
    return list(torch.split(batch, sizes, dim=0))
