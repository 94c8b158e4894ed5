"""Cost description of a model's blocks for the partitioner (``partitioner.blocks.BlockCost``).

Computed analytically from the config (no module is built). Conventions, per sample (one image or
one sequence):
- ``param_bytes``: parameters x ``dtype_bytes``.
- ``optimizer_bytes``: everything training adds per parameter: the gradient buffer (1x) plus optimizer state
  (AdamW: exp_avg + exp_avg_sq = 2x; SGD with momentum: 1x). So a stage's static memory is
  ``param_bytes + optimizer_bytes``.
- ``activation_bytes_per_sample``: the block's output (what crosses a stage boundary after it).
- ``stash_bytes_per_sample``: an estimate of what autograd keeps for backward per in-flight sample.
- FLOPs: 2 per multiply-add; backward = 2x forward (grads w.r.t. inputs and weights).
"""

from __future__ import annotations

from typing import Literal

from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.costs import hf_block_costs
from arceusd.models.hf.lora_costs import lora_block_costs
from partitioner.blocks import BlockCost

OptimizerKind = Literal["adamw", "sgd"]

_STATE_PER_PARAM: dict[str, int] = {"adamw": 2, "sgd": 1}
_INDEX_BYTES = 8  # int64 token ids


def _optimizer_bytes(param_bytes: int, optimizer: OptimizerKind) -> int:
    if optimizer not in _STATE_PER_PARAM:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(_STATE_PER_PARAM)}")
    return param_bytes * (1 + _STATE_PER_PARAM[optimizer])


def mlp_block_costs(config: MLPConfig, dtype_bytes: int = 4, optimizer: OptimizerKind = "adamw") -> list[BlockCost]:
    costs = []
    sizes = config.layer_sizes
    for i in range(len(sizes) - 1):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        params = fan_in * fan_out + fan_out
        fwd = 2.0 * fan_in * fan_out
        costs.append(
            BlockCost(
                name=f"fc{i}",
                param_bytes=params * dtype_bytes,
                optimizer_bytes=_optimizer_bytes(params * dtype_bytes, optimizer),
                activation_bytes_per_sample=fan_out * dtype_bytes,
                stash_bytes_per_sample=(fan_in + fan_out) * dtype_bytes,
                forward_flops_per_sample=fwd,
                backward_flops_per_sample=2.0 * fwd,
            )
        )
    return costs


def gpt_block_params(config: GPTConfig) -> tuple[int, int, int]:
    """Parameter counts of (embedding block, one transformer block, head block)."""
    C, V, T = config.n_embd, config.vocab_size, config.block_size
    b = 1 if config.bias else 0
    embedding = V * C + T * C
    ln = C + b * C
    attn = (C * 3 * C + b * 3 * C) + (C * C + b * C)
    mlp = (C * 4 * C + b * 4 * C) + (4 * C * C + b * C)
    block = 2 * ln + attn + mlp
    head = ln + C * V
    return embedding, block, head


def gpt_block_costs(config: GPTConfig, dtype_bytes: int = 4, optimizer: OptimizerKind = "adamw") -> list[BlockCost]:
    C, V, T, nh = config.n_embd, config.vocab_size, config.block_size, config.n_head
    p_emb, p_block, p_head = gpt_block_params(config)
    matmul_block = 12 * C * C  # weights of c_attn (3C^2), attn c_proj (C^2), c_fc (4C^2), mlp c_proj (4C^2)
    fwd_block = 2.0 * matmul_block * T + 4.0 * T * T * C  # + QK^T and AV
    fwd_head = 2.0 * C * V * T
    costs = [
        BlockCost(
            name="embedding",
            param_bytes=p_emb * dtype_bytes,
            optimizer_bytes=_optimizer_bytes(p_emb * dtype_bytes, optimizer),
            activation_bytes_per_sample=T * C * dtype_bytes,
            stash_bytes_per_sample=T * _INDEX_BYTES,
            forward_flops_per_sample=float(T * C),
            backward_flops_per_sample=float(2 * T * C),
        )
    ]
    for layer in range(config.n_layer):
        costs.append(
            BlockCost(
                name=f"block{layer}",
                param_bytes=p_block * dtype_bytes,
                optimizer_bytes=_optimizer_bytes(p_block * dtype_bytes, optimizer),
                activation_bytes_per_sample=T * C * dtype_bytes,
                # x, ln_1, qkv(3), attn out, x', ln_2, fc(4), gelu(4) = 16 TC, plus attention weights nh*T*T
                stash_bytes_per_sample=(16 * T * C + nh * T * T) * dtype_bytes,
                forward_flops_per_sample=fwd_block,
                backward_flops_per_sample=2.0 * fwd_block,
                heads=nh,
                mlp_columns=4 * C,
            )
        )
    costs.append(
        BlockCost(
            name="head",
            param_bytes=p_head * dtype_bytes,
            optimizer_bytes=_optimizer_bytes(p_head * dtype_bytes, optimizer),
            activation_bytes_per_sample=T * V * dtype_bytes,
            stash_bytes_per_sample=(2 * T * C + T * V) * dtype_bytes,
            forward_flops_per_sample=fwd_head,
            backward_flops_per_sample=2.0 * fwd_head,
        )
    )
    return costs


def block_costs(config: ModelConfig, dtype_bytes: int = 4, optimizer: OptimizerKind = "adamw") -> list[BlockCost]:
    """One ``BlockCost`` per placeable block, in model order."""
    if dtype_bytes <= 0:
        raise ValueError(f"dtype_bytes must be positive (4 for fp32, 2 for bf16), got {dtype_bytes}")
    if isinstance(config, MLPConfig):
        return mlp_block_costs(config, dtype_bytes, optimizer)
    if isinstance(config, GPTConfig):
        return gpt_block_costs(config, dtype_bytes, optimizer)
    if isinstance(config, HFModelConfig):
        costs = lora_block_costs if config.lora is not None else hf_block_costs  # LoRA: a frozen base
        return costs(config, dtype_bytes, lambda b: _optimizer_bytes(b, optimizer), _INDEX_BYTES)
    raise TypeError(f"unknown model config type {type(config).__name__}; expected MLPConfig or GPTConfig")
