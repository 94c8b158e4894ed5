"""Building a model (or a slice of it) from its declarative config, the reference model, and the loss.

``build_blocks(config, seed, start, end)`` gives blocks ``[start, end)`` exactly as the full model built
with the same seed has them; ``build_reference_model`` is the full ``nn.Sequential`` for plain
single-process training.

Tied weights (a stock LM's ``tie_word_embeddings``): :func:`tied_pair` names the two blocks' parameters that
are one weight. One process holding both blocks shares the parameter (:func:`tie_blocks`); a process holding the
copy's block without the owner's trains a copy, kept equal by the workers' gradient sum (``worker/tied.py``).

Loss: cross-entropy on the last block's output (for a GPT over all positions). ``loss_sum`` returns the *sum*
of per-element losses so micro-batches can be weighted exactly: the full-batch mean loss equals
``sum(loss_sum(mb) for mb in micro_batches) / targets.numel()`` (see ``arceusd/worker/microbatch.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig
from arceusd.models.gpt import build_gpt_block, gpt_num_blocks
from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import tied_names
from arceusd.models.hf.lora import add_lora
from arceusd.models.mlp import build_mlp_block, mlp_num_blocks


def num_blocks(config: ModelConfig) -> int:
    """How many placeable blocks the model has."""
    if isinstance(config, MLPConfig):
        return mlp_num_blocks(config)
    if isinstance(config, GPTConfig):
        return gpt_num_blocks(config)
    if isinstance(config, HFModelConfig):
        return num_hf_blocks(config)
    raise TypeError(f"unknown model config type {type(config).__name__}; expected MLPConfig or GPTConfig")


def build_block(config: ModelConfig, index: int, seed: int, weights: Path | None = None) -> nn.Module:
    """One block, initialised from ``(seed, index)`` only, or (a stock causal LM) read from ``weights``."""
    if isinstance(config, MLPConfig):
        return build_mlp_block(config, index, seed)
    if isinstance(config, GPTConfig):
        return build_gpt_block(config, index, seed)
    if isinstance(config, HFModelConfig):
        from arceusd.models.hf.blocks import build_hf_block  # imports transformers: only for these models

        block = build_hf_block(config, index, seed, weights)
        if config.lora is not None:  # adapters on a frozen base: only they are parameters (hf/lora.py)
            add_lora(block, config, index, seed)
        return block
    raise TypeError(f"unknown model config type {type(config).__name__}; expected MLPConfig or GPTConfig")


def build_blocks(
    config: ModelConfig, seed: int, start: int = 0, end: int | None = None, weights: Path | None = None
) -> list[nn.Module]:
    """Blocks ``[start, end)`` (default: all), each identical to the same block of the full model (tied
    weights shared between them: :func:`tie_blocks`)."""
    n = num_blocks(config)
    stop = n if end is None else end
    if not 0 <= start < stop <= n:
        raise ValueError(f"block range [{start}, {stop}) is not a non-empty range inside [0, {n})")
    blocks = {i: build_block(config, i, seed, weights) for i in range(start, stop)}
    tie_blocks(config, blocks, seed, weights)
    return list(blocks.values())


def tie_blocks(config: ModelConfig, blocks: dict[int, nn.Module], seed: int, weights: Path | None = None) -> None:
    """Share tied parameters between the blocks one process holds (a stock LM's tied embedding and head); a
    head without its embedding gets a copy of the embedding's initial tensor (``seed`` / ``weights``)."""
    if isinstance(config, HFModelConfig) and config.tied:
        from arceusd.models.hf.blocks import tie_hf_blocks  # transformers: only for these models

        tie_hf_blocks(config, blocks, seed, weights)


@dataclass(frozen=True)
class TiedPair:
    """One weight two blocks share: the owner's parameter (stored in checkpoints and exports) and the copy's
    (``"<block>.<name inside the block>"`` each, as ``build_reference_model`` names them)."""

    owner_block: int
    owner_name: str
    copy_block: int
    copy_name: str

    @property
    def owner(self) -> str:
        return f"{self.owner_block}.{self.owner_name}"

    @property
    def copy(self) -> str:
        return f"{self.copy_block}.{self.copy_name}"

    def split_by(self, start: int, end: int) -> str | None:
        """Which end blocks ``[start, end)`` hold alone (``"owner"`` or ``"copy"``), or None (both or neither)."""
        has_owner, has_copy = start <= self.owner_block < end, start <= self.copy_block < end
        if has_owner == has_copy:
            return None
        return "owner" if has_owner else "copy"


def tied_pair(config: ModelConfig) -> TiedPair | None:
    """The model's trained tied weight (a stock LM with ``tie_word_embeddings``: embedding and LM head), or None
    (nothing tied, or a LoRA job's frozen base)."""
    if not isinstance(config, HFModelConfig) or config.lora is not None:
        return None

    names = tied_names(config)
    if names is None:
        return None
    return TiedPair(0, names[0], num_hf_blocks(config) - 1, names[1])


def build_reference_model(config: ModelConfig, seed: int, weights: Path | None = None) -> nn.Sequential:
    """The full model as one ``nn.Sequential`` of the same blocks, for plain single-process training."""
    return nn.Sequential(*build_blocks(config, seed, weights=weights))


def loss_sum(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum of per-element cross-entropy losses.

    ``output`` (B, K) with ``targets`` (B,) for an MLP, or (B, T, V) with (B, T) for a GPT (all positions).
    """
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), targets.reshape(-1), reduction="sum")


def loss_mean(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all targets: the plain full-batch training loss."""
    return loss_sum(output, targets) / targets.numel()
