"""Megatron-style tensor parallelism of a GPT transformer block inside one stage, with uneven splits.

Rank ``r`` of a group holds ``heads[r]`` attention heads and ``columns[r]`` MLP hidden columns (``TPSplit``,
e.g. from the partitioner). Per sub-layer (attention, MLP):

    x (replicated) -> LayerNorm (replicated) -> f -> column-parallel Linear (QKV / c_fc, own heads / columns)
      -> attention over own heads / GELU -> row-parallel Linear (own input columns, no bias) -> g -> + bias

``f`` is identity forward / all-reduce backward, ``g`` all-reduce forward / identity backward: one all-reduce
per sub-layer in forward and one in backward, through a ``Collective``.

Replicated parameters (LayerNorms, row-parallel biases) stay in sync because their gradients are *computed
identically* on every rank: after ``g`` every rank holds the same output gradient, and after ``f`` the same
input gradient, so each rank runs the same ops on the same data (bit-identical on the same device kind). No
extra all-reduce is spent on them. They count once (on rank 0) in the global gradient norm.

Parameter names of a ``TPTransformerBlock`` equal those of ``TransformerBlock``, so ``shard_tensor`` /
``gather_tensor`` work by name for parameters and for optimizer state of the same shape (checkpoints).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from arceusd.models.config import GPTConfig
from arceusd.models.gpt import TransformerBlock, causal_attention
from arceusd.models.init import materialize
from arceusd.worker.collective import Collective
from arceusd.worker.tp_split import TPSplit as TPSplit


def even_split(config: GPTConfig, world_size: int) -> TPSplit:
    """Heads and columns spread as evenly as possible (earlier ranks get the remainder)."""

    def spread(total: int) -> tuple[int, ...]:
        base, extra = divmod(total, world_size)
        return tuple(base + (1 if r < extra else 0) for r in range(world_size))

    return TPSplit(spread(config.n_head), spread(4 * config.n_embd))


class _CopyToGroup(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Collective) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.all_reduce_sum(grad), None


class _ReduceFromGroup(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Collective) -> torch.Tensor:
        return group.all_reduce_sum(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


_GroupOp = Callable[[torch.Tensor, Collective], torch.Tensor]
copy_to_group = cast(_GroupOp, _CopyToGroup.apply)
"""f(x, group): identity forward, all-reduce backward (entry of a column-parallel layer)."""
reduce_from_group = cast(_GroupOp, _ReduceFromGroup.apply)
"""g(x, group): all-reduce forward, identity backward (exit of a row-parallel layer)."""


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_local @ W_local^T) + b``: weight sharded by input columns, bias replicated."""

    matmul_weight = True  # a LoRA job's frozen base holds ``weight`` in bf16 under autocast (models/hf/lora.py)

    def __init__(self, in_local: int, out_features: int, bias: bool, group: Collective) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(F.linear(x, self.weight), self.group)  # (B, T, in_local) -> (B, T, out)
        return y + self.bias if self.bias is not None else y


class TPAttention(nn.Module):
    def __init__(self, config: GPTConfig, heads: int, group: Collective) -> None:
        super().__init__()
        hd = config.n_embd // config.n_head
        self.n_head = heads
        self.dropout = config.dropout
        self.group = group
        self.c_attn = nn.Linear(config.n_embd, 3 * heads * hd, bias=config.bias)  # own heads' q, k, v
        self.c_proj = RowParallelLinear(heads * hd, config.n_embd, config.bias, group)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.c_attn(copy_to_group(x, self.group))  # (B, T, C) -> (B, T, 3 * h * hd)
        y = causal_attention(qkv, self.n_head, self.dropout, self.training)  # (B, T, h * hd)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y))  # (B, T, C), summed over ranks
        return out


class TPMLP(nn.Module):
    def __init__(self, config: GPTConfig, columns: int, group: Collective) -> None:
        super().__init__()
        self.group = group
        self.c_fc = nn.Linear(config.n_embd, columns, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = RowParallelLinear(columns, config.n_embd, config.bias, group)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gelu(self.c_fc(copy_to_group(x, self.group)))  # (B, T, C) -> (B, T, cols)
        out: torch.Tensor = self.dropout(self.c_proj(h))  # (B, T, C), summed over ranks
        return out


class TPTransformerBlock(nn.Module):
    """One rank's shard of a ``TransformerBlock`` (same parameter names, smaller sharded tensors)."""

    def __init__(self, config: GPTConfig, heads: int, columns: int, group: Collective) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = TPAttention(config, heads, group)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = TPMLP(config, columns, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        out: torch.Tensor = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return out


_QKV = ("attn.c_attn.weight", "attn.c_attn.bias")
_HEAD_COLS = ("attn.c_proj.weight",)
_MLP_ROWS = ("mlp.c_fc.weight", "mlp.c_fc.bias")
_MLP_COLS = ("mlp.c_proj.weight",)


def is_sharded(name: str) -> bool:
    """Whether a transformer-block parameter named ``name`` is split across ranks (else replicated)."""
    return name in _QKV + _HEAD_COLS + _MLP_ROWS + _MLP_COLS


def shard_tensor(name: str, full: torch.Tensor, config: GPTConfig, split: TPSplit, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the full block tensor ``name`` (a copy; replicated tensors are cloned)."""
    C, hd = config.n_embd, config.n_embd // config.n_head
    h0, h1 = split.head_range(rank)
    c0, c1 = split.column_range(rank)
    if name in _QKV:
        return torch.cat([full[sec * C + h0 * hd : sec * C + h1 * hd] for sec in range(3)], dim=0).clone()
    if name in _HEAD_COLS:
        return full[:, h0 * hd : h1 * hd].clone()
    if name in _MLP_ROWS:
        return full[c0:c1].clone()
    if name in _MLP_COLS:
        return full[:, c0:c1].clone()
    return full.clone()


def gather_tensor(name: str, shards: Sequence[torch.Tensor], config: GPTConfig, split: TPSplit) -> torch.Tensor:
    """Inverse of ``shard_tensor``: the full tensor from all ranks' slices (replicated: rank 0's)."""
    if len(shards) != split.world_size:
        raise ValueError(f"need {split.world_size} shards of {name}, got {len(shards)}")
    hd = config.n_embd // config.n_head
    if name in _QKV:
        sections = []
        for sec in range(3):
            for r, t in enumerate(shards):
                n = split.heads[r] * hd
                sections.append(t[sec * n : (sec + 1) * n])
        return torch.cat(sections, dim=0)
    if name in _HEAD_COLS or name in _MLP_COLS:
        return torch.cat(list(shards), dim=1)
    if name in _MLP_ROWS:
        return torch.cat(list(shards), dim=0)
    return shards[0].clone()


def shard_transformer_block(
    block: TransformerBlock, config: GPTConfig, split: TPSplit, rank: int, group: Collective
) -> TPTransformerBlock:
    """Rank ``rank``'s ``TPTransformerBlock`` holding its slice of ``block``'s parameters."""
    split.check(config)
    if group.world_size != split.world_size or group.rank != rank:
        raise ValueError(
            f"collective is rank {group.rank} of {group.world_size}, split wants rank {rank} of {split.world_size}"
        )
    shard = materialize(lambda: TPTransformerBlock(config, split.heads[rank], split.columns[rank], group))
    full = dict(block.named_parameters())
    with torch.no_grad():
        for name, p in shard.named_parameters():
            p.copy_(shard_tensor(name, full[name].detach(), config, split, rank))
    return shard


def gather_transformer_block(
    shards: Sequence[TPTransformerBlock], config: GPTConfig, split: TPSplit
) -> TransformerBlock:
    """A plain ``TransformerBlock`` with the full parameters assembled from every rank's shard."""
    block = materialize(lambda: TransformerBlock(config))
    per_rank = [dict(s.named_parameters()) for s in shards]
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(gather_tensor(name, [d[name].detach() for d in per_rank], config, split))
    return block
