"""A stage's own slice of the model: blocks ``[start, end)``, tensor-parallel sharded where asked.

A worker builds only its blocks (each from ``(seed, index)``; see ``arceusd/models/init.py``). In a
tensor-parallel stage every ``TransformerBlock`` (a stock LM's decoder layer: ``hf_tensor_parallel.py``) is
built, sharded and dropped one at a time, so at most one full block is ever materialised; non-splittable
blocks (embedding, head, MLP layers) are replicated on every rank. With a stock LM's initial weights a split
layer is built at its rank's size and reads them (``build_hf_shard``; a LoRA job's layer is cut from the full
block, its adapters drawn whole, then its base read: ``load_shard_weights``): a member's slice holds only its
rank's shards of the split tensors (``arceusd/models/hf/weights_slice.py``), the owner's file every tensor whole.
Parameter names are ``"blocks.<global block index>.<name inside the block>"``, stable across re-plans
(checkpoints). A slice holding one end of a tied weight (a stock LM's embedding without its head, or the head
without the embedding) says so in ``StageModule.tied`` (``tied.py``: the engine sums its gradient with the
other end's); the copy on the head's side is left out of the stage's share of the global gradient norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from arceusd.models.build import build_block, num_blocks, tie_blocks
from arceusd.models.config import GPTConfig, ModelConfig
from arceusd.models.gpt import TransformerBlock
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.collective import Collective
from arceusd.worker.hf_tp_split import hf_split
from arceusd.worker.tensor_parallel import TPSplit, TPTransformerBlock, is_sharded, shard_transformer_block
from arceusd.worker.tied import TiedEnd, tied_end


@dataclass(frozen=True)
class StageSpec:
    """Which blocks this worker holds, and its tensor-parallel split and rank (``split=None``: no TP)."""

    start: int
    end: int
    split: TPSplit | None = None
    rank: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"stage block range [{self.start}, {self.end}) must be non-empty")
        world = 1 if self.split is None else self.split.world_size
        if not 0 <= self.rank < world:
            raise ValueError(f"tensor-parallel rank {self.rank} out of range for {world} rank(s)")


class StageModule(nn.Module):
    """The blocks of one stage, run in order. ``forward`` maps the stage input to the stage output."""

    def __init__(self, blocks: dict[int, nn.Module], rank: int, tied: TiedEnd | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): b for i, b in blocks.items()})
        self.rank = rank
        self.tied = tied
        """This stage's end of a tied weight whose other end another stage holds (None: none)."""
        if tied is not None:
            self.tied_parameter()  # the name must exist

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x

    @property
    def tensor_parallel(self) -> bool:
        """True when a block of this stage is split across a tensor-parallel group (its backward all-reduces)."""
        return any(_sharded_names(b) is not None for b in self.blocks.values())

    def tied_parameter(self) -> nn.Parameter:
        """The parameter ``tied`` names; ``ValueError`` without one."""
        if self.tied is None:
            raise ValueError("this stage holds no end of a tied weight")
        params = dict(self.named_parameters())
        if self.tied.name not in params:
            raise ValueError(f"the tied weight {self.tied.name!r} is not a parameter of this stage")
        return params[self.tied.name]

    def norm_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients this rank contributes to the global norm (each counted once
        job-wide: a tied weight's copy on the last stage is the first stage's weight)."""
        if self.rank == 0:
            if self.tied is not None and self.tied.copy:
                return [p for n, p in self.named_parameters() if n != self.tied.name]
            return list(self.parameters())
        out: list[nn.Parameter] = []
        for block in self.blocks.values():
            sharded = _sharded_names(block)
            if sharded is not None:
                out += [p for n, p in block.named_parameters() if n in sharded]
        return out


def _sharded_names(block: nn.Module) -> frozenset[str] | None:
    """The names of ``block``'s parameters split across its tensor-parallel group; None for an unsplit block.
    (A stock LM's shard says so in ``tp_sharded``: read without importing transformers.)"""
    if isinstance(block, TPTransformerBlock):
        return frozenset(n for n, _ in block.named_parameters() if is_sharded(n))
    names = getattr(block, "tp_sharded", None)
    return names if isinstance(names, frozenset) else None


def build_stage(
    config: ModelConfig,
    seed: int,
    spec: StageSpec,
    group: Collective | None = None,
    weights: Path | None = None,
) -> StageModule:
    """Build this worker's slice. ``group`` is required when ``spec.split`` is set; ``weights``: a stock
    LM's initial weights (only this slice's tensors are read)."""
    n = num_blocks(config)
    if spec.end > n:
        raise ValueError(f"stage block range [{spec.start}, {spec.end}) exceeds the model's {n} blocks")
    tp: tuple[GPTConfig, TPSplit, Collective] | None = None
    hf_tp: tuple[HFModelConfig, TPSplit, Collective] | None = None
    if spec.split is not None:
        if group is None:
            raise ValueError("a tensor-parallel stage needs its group's Collective")
        if isinstance(config, GPTConfig):
            spec.split.check(config)
            tp = (config, spec.split, group)
        elif isinstance(config, HFModelConfig):
            if config.lora is not None and config.lora.dropout > 0:  # each rank would draw its own mask
                raise ValueError("tensor parallelism of LoRA layers with dropout is not built: set lora.dropout = 0")
            hf_split(spec.split, config)  # ValueError when it does not fit the model
            hf_tp = (config, spec.split, group)
        else:
            raise ValueError("tensor parallelism needs a GPT or a stock LM (an MLP has no splittable blocks)")
    blocks: dict[int, nn.Module] = {}
    for i in range(spec.start, spec.end):
        split_layer = hf_tp is not None and 0 < i < num_blocks(config) - 1  # a decoder layer, split
        if hf_tp is not None and split_layer and weights is not None and hf_tp[0].lora is None:
            from arceusd.worker.hf_tensor_parallel import build_hf_shard  # transformers: only for these models

            blocks[i] = build_hf_shard(hf_tp[0], i, hf_tp[1], spec.rank, hf_tp[2], weights)  # at its own size
            continue
        block = build_block(config, i, seed, None if split_layer else weights)
        if tp is not None and isinstance(block, TransformerBlock):
            block = shard_transformer_block(block, tp[0], tp[1], spec.rank, tp[2])
        if hf_tp is not None and split_layer:
            from arceusd.models.hf.blocks import HFDecoderBlock  # imports transformers: only for these models
            from arceusd.worker.hf_tensor_parallel import load_shard_weights, shard_hf_block  # (transformers)

            assert isinstance(block, HFDecoderBlock)
            block = shard_hf_block(block, hf_tp[0], hf_tp[1], spec.rank, hf_tp[2])
            if weights is not None:  # a LoRA job: the base from the weights (whole or this rank's shards)
                load_shard_weights(block, weights, hf_tp[0], i, hf_tp[1], spec.rank)
        blocks[i] = block
    tie_blocks(config, blocks, seed, weights)
    tied = tied_end(config, spec.start, spec.end)
    if tied is not None and spec.split is not None:  # the tie stream joins rank 0s: ranks > 0 would miss the sum
        raise ValueError("a tensor-parallel stage cannot hold one end of a tied weight split across stages")
    return StageModule(blocks, spec.rank, tied)
