"""Data loading for training jobs: IDX (MNIST) and character text, deterministic resumable samplers.

Modules: ``idx`` (IDX reader), ``mnist`` (MNIST data set and split), ``text`` (character vocabulary, split,
windows), ``sampler`` (seeded random-access samplers and their cursor), ``batches`` (``BatchSource`` per data
set kind), ``errors`` (``DataError``). Only the job owner loads data; members receive batches.
"""

from arceusd.data.batches import BatchSource, MnistBatches, TextBatches
from arceusd.data.errors import DataError, IdxFormatError
from arceusd.data.idx import IdxHeader, read_idx, read_idx_header
from arceusd.data.mnist import MnistData, MnistInfo, find_mnist_files, load_mnist, read_mnist_info
from arceusd.data.sampler import Cursor, EpochSampler, WindowSampler, cursor_at, derive_seed, global_step
from arceusd.data.text import CharVocab, TextData, context_windows, load_text

__all__ = [
    "BatchSource",
    "CharVocab",
    "Cursor",
    "DataError",
    "EpochSampler",
    "IdxFormatError",
    "IdxHeader",
    "MnistBatches",
    "MnistData",
    "MnistInfo",
    "TextBatches",
    "TextData",
    "WindowSampler",
    "context_windows",
    "cursor_at",
    "derive_seed",
    "find_mnist_files",
    "global_step",
    "load_mnist",
    "load_text",
    "read_idx",
    "read_idx_header",
    "read_mnist_info",
]
