"""A tensor-parallel split of a stock ``transformers`` decoder layer, without torch: heads, KV heads, columns.

Owns: :class:`HFTPSplit` (query heads, key/value heads and MLP hidden columns per rank), :func:`hf_split`, which
reads a plain :class:`~arceusd.worker.tp_split.TPSplit` (what the planner and the worker protocol carry) for an
:class:`~arceusd.models.hf.config.HFModelConfig` and checks it, :func:`hf_even_split` and
:func:`max_hf_tensor_parallel`, and the planner's cap :func:`planner_tensor_parallel`.

The split unit is the key/value head: with grouped-query attention ``n_head / n_kv_head`` query heads share one
key/value head, and a rank must hold whole groups, so for these models a ``TPSplit``'s ``heads`` count *key/value
heads* per rank (the same as query heads without GQA, e.g. gpt2), and the partitioner splits ``n_kv_head``
units (:mod:`arceusd.models.hf.costs`). A layer splits over at most ``n_kv_head`` ranks. Columns are the MLP's
hidden width (``intermediate_size``, gpt2 ``n_inner``). :mod:`arceusd.worker.hf_tensor_parallel` runs the split
layers; the planner (in the daemon, which never imports torch) needs only this.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.models.config import ModelConfig
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.tp_split import TPSplit


@dataclass(frozen=True)
class HFTPSplit:
    """Query heads, key/value heads and MLP hidden columns per rank (each >= 1; uneven allowed)."""

    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    columns: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.heads or not len(self.heads) == len(self.kv_heads) == len(self.columns):
            raise ValueError(f"heads {self.heads}, kv_heads {self.kv_heads}, columns {self.columns}: one per rank")
        if min(self.heads + self.kv_heads + self.columns) < 1:
            raise ValueError(f"every rank needs >= 1 head, KV head and column, got {self}")

    @property
    def world_size(self) -> int:
        return len(self.heads)

    def head_range(self, rank: int) -> tuple[int, int]:
        start = sum(self.heads[:rank])
        return start, start + self.heads[rank]

    def kv_range(self, rank: int) -> tuple[int, int]:
        start = sum(self.kv_heads[:rank])
        return start, start + self.kv_heads[rank]

    def column_range(self, rank: int) -> tuple[int, int]:
        start = sum(self.columns[:rank])
        return start, start + self.columns[rank]

    def as_split(self) -> TPSplit:
        """The planner's and the protocol's view: key/value heads and columns per rank."""
        return TPSplit(self.kv_heads, self.columns)


def kv_group(config: HFModelConfig) -> int:
    """Query heads per key/value head (1 without grouped-query attention)."""
    return config.n_head // config.n_kv_head


def max_hf_tensor_parallel(config: HFModelConfig) -> int:
    """The most ranks a decoder layer of ``config`` splits over: one whole KV group (and >= 1 column) each."""
    return min(config.n_kv_head, config.intermediate)


PLANNER_MAX_TP = 4
"""The largest tensor-parallel group the planner forms (as for the built-in GPT)."""


def planner_tensor_parallel(config: ModelConfig) -> int:
    """The largest tensor-parallel group the planner may give a stage of stock LM ``config`` (1: no split; 1 for
    any other model: the planner's rule for the built-in GPT is its own). A LoRA job's layers split with their
    adapters (:mod:`arceusd.worker.hf_tensor_parallel`). Not split: LoRA with dropout (each rank would draw its
    own mask) and tied embeddings (a split first or last stage would hold one end of the tied weight on every
    rank, but the tie stream joins rank 0s only)."""
    if not isinstance(config, HFModelConfig) or config.tied:
        return 1
    if config.lora is not None and config.lora.dropout > 0:
        return 1
    return min(PLANNER_MAX_TP, max_hf_tensor_parallel(config))


def hf_split(split: TPSplit, config: HFModelConfig) -> HFTPSplit:
    """``split`` (key/value heads and columns per rank) checked against ``config`` (``ValueError`` naming the
    problem), with each rank's query heads (its KV heads' groups)."""
    if sum(split.heads) != config.n_kv_head:
        raise ValueError(
            f"key/value heads per rank {split.heads} must add up to the model's {config.n_kv_head} KV heads "
            f"(the split unit: {kv_group(config)} query head(s) each)"
        )
    if sum(split.columns) != config.intermediate:
        raise ValueError(
            f"columns per rank {split.columns} must add up to the MLP's {config.intermediate} hidden columns"
        )
    group = kv_group(config)
    return HFTPSplit(tuple(kv * group for kv in split.heads), split.heads, split.columns)


def hf_even_split(config: HFModelConfig, world_size: int) -> TPSplit:
    """KV groups and columns spread as evenly as possible (earlier ranks get the remainder)."""
    if not 1 <= world_size <= max_hf_tensor_parallel(config):
        raise ValueError(
            f"a {config.model_type} layer with {config.n_kv_head} KV heads splits over 1.."
            f"{max_hf_tensor_parallel(config)} ranks, not {world_size}"
        )

    def spread(total: int) -> tuple[int, ...]:
        base, extra = divmod(total, world_size)
        return tuple(base + (1 if r < extra else 0) for r in range(world_size))

    return TPSplit(spread(config.n_kv_head), spread(config.intermediate))


__all__ = [
    "PLANNER_MAX_TP",
    "HFTPSplit",
    "hf_even_split",
    "hf_split",
    "kv_group",
    "max_hf_tensor_parallel",
    "planner_tensor_parallel",
]
