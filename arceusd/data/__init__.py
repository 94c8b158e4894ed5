"""Data loading for training jobs: IDX (MNIST) and character text, deterministic resumable samplers.

Modules: ``idx`` (IDX reader), ``mnist`` (MNIST data set and split), ``text`` (character vocabulary, split,
windows), ``sampler`` (seeded random-access samplers and their cursor), ``batches`` (``BatchSource`` per data
set kind), ``errors`` (``DataError``). Only the job owner loads data; members receive batches.

Names are loaded on first use (PEP 562): importing ``arceusd.data.errors`` or the torch-free modules
(``idx_header``, ``mnist_files``, ``text_files``, ``steps``) must not pull torch into the daemon.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BatchSource": "batches",
    "MnistBatches": "batches",
    "TextBatches": "batches",
    "DataError": "errors",
    "IdxFormatError": "errors",
    "IdxHeader": "idx_header",
    "read_idx": "idx",
    "read_idx_header": "idx_header",
    "MnistData": "mnist",
    "MnistInfo": "mnist_files",
    "find_mnist_files": "mnist_files",
    "load_mnist": "mnist",
    "read_mnist_info": "mnist_files",
    "Cursor": "steps",
    "EpochSampler": "sampler",
    "WindowSampler": "sampler",
    "cursor_at": "sampler",
    "derive_seed": "steps",
    "global_step": "sampler",
    "CharVocab": "text",
    "TextData": "text",
    "context_windows": "text",
    "load_text": "text",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'arceusd.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"arceusd.data.{module}"), name)
