"""A tensor-parallel split without torch: how many attention heads and MLP hidden columns each rank holds.

Owns: :class:`TPSplit` (uneven splits allowed, each rank >= 1 head and >= 1 column) and its check against a
GPT configuration. :mod:`arceusd.worker.tensor_parallel` runs the split blocks; the planner and the worker
protocol, which the daemon (never importing torch) uses, need only this.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.models.config import GPTConfig


@dataclass(frozen=True)
class TPSplit:
    """Heads and MLP hidden columns per rank (uneven allowed, each >= 1)."""

    heads: tuple[int, ...]
    columns: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.heads or len(self.heads) != len(self.columns):
            raise ValueError(f"heads {self.heads} and columns {self.columns} must name the same ranks (>= 1)")
        if min(self.heads) < 1 or min(self.columns) < 1:
            raise ValueError(f"every rank needs >= 1 head and >= 1 column, got {self.heads} / {self.columns}")

    @property
    def world_size(self) -> int:
        return len(self.heads)

    def check(self, config: GPTConfig) -> None:
        if sum(self.heads) != config.n_head:
            raise ValueError(f"heads per rank {self.heads} must add up to n_head = {config.n_head}")
        if sum(self.columns) != 4 * config.n_embd:
            raise ValueError(f"columns per rank {self.columns} must add up to 4 * n_embd = {4 * config.n_embd}")

    def head_range(self, rank: int) -> tuple[int, int]:
        start = sum(self.heads[:rank])
        return start, start + self.heads[rank]

    def column_range(self, rank: int) -> tuple[int, int]:
        start = sum(self.columns[:rank])
        return start, start + self.columns[rank]


__all__ = ["TPSplit"]
