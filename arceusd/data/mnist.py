"""MNIST as tensors: find the IDX files in a folder, normalise, flatten, and split train / held-out.

Owns: the MNIST data set (images float32 normalised and flattened to ``rows*cols``; labels int64) and its
deterministic split.

File discovery: in ``dir``, the first pair present of ``train-*`` then ``t10k-*`` (each gzipped or plain),
unless the caller names the files. The split takes ``train_count`` examples then the next ``holdout_count``
examples of an order that is either the file order (``split_seed=None``: the first ``train_count`` train, the
following ones held out) or a permutation from a ``torch.Generator`` seeded with ``split_seed``. Train and
held-out never overlap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from arceusd.data.errors import DataError
from arceusd.data.idx import DEFAULT_MAX_BYTES, read_idx
from arceusd.data.mnist_files import (
    DEFAULT_MEAN,
    DEFAULT_STD,
    IMAGES_MAGIC,
    LABELS_MAGIC,
    MNIST_FILE_PAIRS,
    NUM_CLASSES,
    MnistInfo,
    find_mnist_files,
    read_mnist_info,
)

__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "IMAGES_MAGIC",
    "LABELS_MAGIC",
    "MNIST_FILE_PAIRS",
    "NUM_CLASSES",
    "MnistData",
    "MnistInfo",
    "find_mnist_files",
    "load_mnist",
    "normalise_images",
    "read_mnist_info",
    "split_order",
]


@dataclass(frozen=True)
class MnistData:
    """A loaded, split MNIST: ``*_images`` float32 ``(n, rows*cols)``, ``*_labels`` int64 ``(n,)`` in 0..9."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    holdout_images: torch.Tensor
    holdout_labels: torch.Tensor

    @property
    def features(self) -> int:
        return int(self.train_images.shape[1])


def normalise_images(raw: torch.Tensor, mean: float = DEFAULT_MEAN, std: float = DEFAULT_STD) -> torch.Tensor:
    """uint8 ``(n, rows, cols)`` -> float32 ``(n, rows*cols)``: ``(pixel/255 - mean) / std``."""
    if std <= 0:
        raise DataError(f"normalisation std must be positive, got {std}")
    x = raw.reshape(raw.shape[0], -1).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std)


def split_order(count: int, split_seed: int | None) -> torch.Tensor:
    """The example order the split cuts: file order, or a permutation seeded with ``split_seed``."""
    if split_seed is None:
        return torch.arange(count)
    g = torch.Generator().manual_seed(split_seed)
    return torch.randperm(count, generator=g)


def load_mnist(
    directory: str | Path,
    *,
    train_count: int,
    holdout_count: int,
    mean: float = DEFAULT_MEAN,
    std: float = DEFAULT_STD,
    split_seed: int | None = None,
    images: str | Path | None = None,
    labels: str | Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> MnistData:
    """Load MNIST from ``directory`` (or explicit ``images``/``labels`` paths relative to it) and split it.

    Error handling: ``DataError`` for a missing folder/file, a malformed IDX file, mismatched counts, labels
    outside 0..9, or ``train_count + holdout_count`` above the number of examples.
    """
    if images is None or labels is None:
        ip, lp = find_mnist_files(directory)
    else:
        ip, lp = Path(directory) / images, Path(directory) / labels
    info = read_mnist_info(ip, lp)
    if train_count < 1 or holdout_count < 0:
        raise DataError(f"train_count must be >= 1 and holdout_count >= 0, got {train_count}, {holdout_count}")
    if train_count + holdout_count > info.count:
        raise DataError(
            f"{ip}: holds {info.count} examples, fewer than train_count + holdout_count = "
            f"{train_count} + {holdout_count}"
        )
    raw_images = read_idx(ip, expect_magic=IMAGES_MAGIC, max_bytes=max_bytes)
    raw_labels = read_idx(lp, expect_magic=LABELS_MAGIC, max_bytes=max_bytes)
    if int(raw_labels.max()) >= NUM_CLASSES:
        raise DataError(f"{lp}: label {int(raw_labels.max())} outside 0..{NUM_CLASSES - 1}")
    order = split_order(info.count, split_seed)
    train_idx = order[:train_count]
    hold_idx = order[train_count : train_count + holdout_count]
    x = normalise_images(raw_images, mean, std)
    y = raw_labels.to(torch.int64)
    return MnistData(
        train_images=x[train_idx].contiguous(),
        train_labels=y[train_idx].contiguous(),
        holdout_images=x[hold_idx].contiguous(),
        holdout_labels=y[hold_idx].contiguous(),
    )
