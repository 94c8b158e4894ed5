"""Building a model (or a slice of it) from its declarative config, the reference model, and the loss.

``build_blocks(config, seed, start, end)`` gives blocks ``[start, end)`` exactly as the full model built
with the same seed has them; ``build_reference_model`` is the full ``nn.Sequential`` for plain
single-process training.

Loss: cross-entropy on the last block's output (for a GPT over all positions). ``loss_sum`` returns the *sum*
of per-element losses so micro-batches can be weighted exactly: the full-batch mean loss equals
``sum(loss_sum(mb) for mb in micro_batches) / targets.numel()`` (see ``arceusd/worker/microbatch.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig
from arceusd.models.gpt import build_gpt_block, gpt_num_blocks
from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
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

        return build_hf_block(config, index, seed, weights)
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
    tie_blocks(config, blocks)
    return list(blocks.values())


def tie_blocks(config: ModelConfig, blocks: dict[int, nn.Module]) -> None:
    """Share tied parameters between the blocks one process holds (a stock LM's tied embedding and head);
    ``ValueError`` when the blocks hold one end of a tied pair only."""
    if isinstance(config, HFModelConfig) and config.tied:
        from arceusd.models.hf.blocks import tie_hf_blocks

        tie_hf_blocks(config, blocks)


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
