"""Training-step arithmetic without torch: seeds, the sampler cursor, and steps per epoch.

Owns: :func:`derive_seed` (a stable 63-bit seed from a job seed and a label), :class:`Cursor` (where a run
stands: the next step of an epoch) and the length of an epoch in steps. :mod:`arceusd.data.sampler` draws the
batches with torch; the daemon (which never imports torch) checks a job spec with this module.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

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


__all__ = ["Cursor", "derive_seed", "epoch_steps", "window_epoch_steps"]
