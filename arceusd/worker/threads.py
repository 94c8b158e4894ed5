"""Thread-count pinning for stage worker processes.

Several workers on one machine otherwise oversubscribe the cores (2 processes x 2 threads ran 6x slower than 2
x 1 here). Call once, early in the worker process, before any torch work.
"""

from __future__ import annotations

import torch


def pin_threads(num_threads: int, interop_threads: int | None = None) -> None:
    """Set torch's intra-op thread count (and inter-op, if given and still settable)."""
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    torch.set_num_threads(num_threads)
    if interop_threads is not None:
        if interop_threads < 1:
            raise ValueError(f"interop_threads must be >= 1, got {interop_threads}")
        try:
            torch.set_num_interop_threads(interop_threads)
        except RuntimeError as exc:  # torch allows this only before the first parallel work
            raise RuntimeError("set the inter-op thread count before any torch work in the worker process") from exc
