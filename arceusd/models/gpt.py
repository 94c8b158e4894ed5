"""A nanoGPT-style decoder as placeable blocks.

Blocks, in order (``n_layer + 2`` of them):
  0            ``Embedding``: token + position embedding (+ dropout)    (B, T) int64 -> (B, T, C)
  1..n_layer   ``TransformerBlock``: pre-norm attention + 4x MLP, residuals  (B, T, C) -> (B, T, C)
  n_layer + 1  ``Head``: final LayerNorm + LM head                       (B, T, C) -> (B, T, V)

Unlike nanoGPT the LM head is *not* tied to the token embedding: the two usually live on different stages, and
tying would force a gradient exchange between the first and last stage every step.
Shapes: B batch, T sequence length (<= block_size), C n_embd, V vocab_size, nh n_head, hd = C // nh.
Init follows nanoGPT: N(0, 0.02) for Linear and Embedding weights, zero biases, residual projections scaled by
1/sqrt(2 * n_layer), LayerNorm weight 1 / bias 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from arceusd.models.config import GPTConfig
from arceusd.models.init import block_generator, fill_normal, init_layer_norm, materialize

INIT_STD = 0.02


def causal_attention(qkv: torch.Tensor, n_head: int, dropout: float, training: bool) -> torch.Tensor:
    """Causal self-attention over ``n_head`` heads: packed ``qkv`` (B, T, 3 * nh * hd) -> (B, T, nh * hd).

    Shared by the plain block and its tensor-parallel shard (which passes only its own heads).
    """
    B, T, three_width = qkv.shape
    width = three_width // 3
    hd = width // n_head
    q, k, v = qkv.chunk(3, dim=2)  # each (B, T, nh * hd)
    q = q.view(B, T, n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
    k = k.view(B, T, n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
    v = v.view(B, T, n_head, hd).transpose(1, 2)  # (B, nh, T, hd)
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if training else 0.0, is_causal=True)
    return y.transpose(1, 2).contiguous().view(B, T, width)  # (B, T, nh * hd)


class Embedding(nn.Module):
    """Token + learned position embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.block_size = config.block_size
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, T = idx.shape
        if self.block_size < T:
            raise ValueError(f"sequence length {T} exceeds the model's block_size {self.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x: torch.Tensor = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C) + (T, C) -> (B, T, C)
        return x


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v stacked
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.c_attn(x)  # (B, T, C) -> (B, T, 3C)
        y = causal_attention(qkv, self.n_head, self.dropout, self.training)  # (B, T, C)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y))  # (B, T, C)
        return out


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gelu(self.c_fc(x))  # (B, T, C) -> (B, T, 4C)
        out: torch.Tensor = self.dropout(self.c_proj(h))  # (B, T, 4C) -> (B, T, C)
        return out


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        out: torch.Tensor = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return out


class Head(nn.Module):
    """Final LayerNorm + LM head (untied)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(self.ln_f(x))  # (B, T, C) -> (B, T, V)
        return logits


def gpt_num_blocks(config: GPTConfig) -> int:
    """Number of placeable blocks: embedding, ``n_layer`` transformer blocks, head."""
    return config.n_layer + 2


@torch.no_grad()
def _init_gpt_module(module: nn.Module, config: GPTConfig, gen: torch.Generator) -> None:
    residual_std = INIT_STD / math.sqrt(2 * config.n_layer)
    for name, sub in module.named_modules():  # named_modules order is deterministic (definition order)
        if isinstance(sub, nn.Linear):
            fill_normal(sub.weight, residual_std if name.endswith("c_proj") else INIT_STD, gen)
            if sub.bias is not None:
                sub.bias.zero_()
        elif isinstance(sub, nn.Embedding):
            fill_normal(sub.weight, INIT_STD, gen)
        elif isinstance(sub, nn.LayerNorm):
            init_layer_norm(sub)


def build_gpt_block(config: GPTConfig, index: int, seed: int) -> nn.Module:
    """Block ``index`` of the GPT, initialised deterministically from ``(seed, index)``."""
    n = gpt_num_blocks(config)
    if not 0 <= index < n:
        raise ValueError(f"GPT block index {index} out of range: the model has {n} blocks")
    module: nn.Module
    if index == 0:
        module = materialize(lambda: Embedding(config))
    elif index == n - 1:
        module = materialize(lambda: Head(config))
    else:
        module = materialize(lambda: TransformerBlock(config))
    _init_gpt_module(module, config, block_generator(seed, index))
    return module
