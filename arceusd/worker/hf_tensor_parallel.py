"""Megatron-style tensor parallelism of a stock ``transformers`` decoder layer (gpt2, llama, qwen2, mistral).

Owns: :func:`shard_hf_block` (rank ``r``'s shard of an :class:`~arceusd.models.hf.blocks.HFDecoderBlock`) and
:func:`gather_hf_block`; the by-name :func:`shard_hf_tensor` / :func:`gather_hf_tensor` / :func:`hf_is_sharded`
(checkpoints, optimizer state of a parameter's shape) live in :mod:`arceusd.worker.hf_tp_tensors` (no
transformers import) and are re-exported here.

A shard is the installed library's own layer class and forward, built for the rank's share:

* llama / qwen2 / mistral: the layer is built from a copy of the model's config with the rank's query heads,
  key/value heads (whole grouped-query groups: a ``TPSplit``'s ``heads`` count KV heads for these models,
  :mod:`arceusd.worker.hf_tp_split`), ``head_dim`` and
  ``intermediate_size``, so ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` are the rank's
  row blocks (column-parallel) and the library's attention runs over the rank's heads alone;
* gpt2: the fused ``c_attn`` Conv1D holds the rank's heads' columns of each of its q, k and v sections, and
  ``num_heads`` / ``split_size`` say so; ``n_inner`` is the rank's columns of ``c_fc``.

The output projections (``o_proj`` / ``down_proj``, gpt2 ``attn.c_proj`` / ``mlp.c_proj``) become row-parallel
(the rank's input columns; output all-reduced by ``g``, then the replicated bias added once), and ``f``
(identity forward, all-reduce backward) is applied to the output of the norm in front of each sub-layer (a
forward hook on ``input_layernorm`` / ``post_attention_layernorm``, gpt2 ``ln_1`` / ``ln_2``). One all-reduce
per sub-layer forward and one backward, through the ``Collective`` of :mod:`arceusd.worker.tensor_parallel`,
whose ``f``/``g`` these are. Replicated parameters (norms, output biases) get identical gradients on every rank,
as in the GPT's split. Parameter names equal the unsplit block's.

Not covered: dropout inside a split layer (each rank would draw its own mask; the tests train without dropout),
and LoRA adapters on a split layer.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Block
from transformers.pytorch_utils import Conv1D

from arceusd.models.hf.blocks import _LAYERS, HFDecoderBlock, transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.collective import Collective
from arceusd.worker.hf_tp_split import HFTPSplit, hf_split
from arceusd.worker.hf_tp_tensors import gather_hf_tensor, hf_is_sharded, shard_hf_tensor
from arceusd.worker.tensor_parallel import RowParallelLinear, copy_to_group, reduce_from_group
from arceusd.worker.tp_split import TPSplit


class RowParallelConv1D(nn.Module):
    """gpt2's ``Conv1D`` (``y = x @ W + b``, ``W`` of shape (in, out)) with ``W`` sharded by input rows:
    ``y = all_reduce(x_local @ W_local) + b``, the bias replicated."""

    def __init__(self, in_local: int, out_features: int, group: Collective) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_local, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(torch.matmul(x, self.weight), self.group)  # (B, T, in_local) -> (B, T, out)
        return y + self.bias


class _EnterGroup:
    """A forward hook applying ``f`` to a module's output (the entry of the column-parallel layers after it)."""

    def __init__(self, group: Collective) -> None:
        self.group = group

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return copy_to_group(output, self.group)


def _rank_config(tc: PretrainedConfig, config: HFModelConfig, split: HFTPSplit, rank: int) -> PretrainedConfig:
    out = copy.deepcopy(tc)
    if config.is_gpt2:
        out.n_inner = split.columns[rank]
    else:
        out.num_attention_heads = split.heads[rank]
        out.num_key_value_heads = split.kv_heads[rank]
        out.head_dim = config.head_dim
        out.intermediate_size = split.columns[rank]
    return out


def _rank_layer(config: HFModelConfig, layer_idx: int, split: HFTPSplit, rank: int, group: Collective) -> nn.Module:
    """The library's layer for rank ``rank``'s heads and columns (uninitialised), made tensor-parallel."""
    rc = _rank_config(transformers_config(config), config, split, rank)
    with torch.device("meta"):
        layer: nn.Module = _LAYERS[config.model_type](rc, layer_idx=layer_idx)
    layer = layer.to_empty(device="cpu")
    C, heads_in = config.hidden, split.heads[rank] * config.head_dim
    enter = _EnterGroup(group)
    if isinstance(layer, GPT2Block):
        attn = layer.attn
        assert isinstance(attn, GPT2Attention)
        attn.c_attn = Conv1D(3 * heads_in, C)  # type: ignore[no-untyped-call]  # the rank's q, k and v columns
        attn.num_heads = split.heads[rank]
        attn.split_size = heads_in
        attn.add_module("c_proj", RowParallelConv1D(heads_in, C, group))  # replaces the library's Conv1D
        layer.mlp.add_module("c_proj", RowParallelConv1D(split.columns[rank], C, group))
        layer.ln_1.register_forward_hook(enter)
        layer.ln_2.register_forward_hook(enter)
        return layer
    attn = getattr(layer, "self_attn")  # noqa: B009  # the library's attention class of this model type
    mlp = getattr(layer, "mlp")  # noqa: B009
    attn.o_proj = RowParallelLinear(heads_in, C, attn.o_proj.bias is not None, group)
    mlp.down_proj = RowParallelLinear(split.columns[rank], C, mlp.down_proj.bias is not None, group)
    getattr(layer, "input_layernorm").register_forward_hook(enter)  # noqa: B009
    getattr(layer, "post_attention_layernorm").register_forward_hook(enter)  # noqa: B009
    return layer


class TPHFDecoderBlock(HFDecoderBlock):
    """One rank's shard of an :class:`HFDecoderBlock` (same parameter names, split ones smaller).
    ``tp_sharded``: the names of its parameters split across the group (the others are replicated)."""

    def __init__(self, config: HFModelConfig, layer: nn.Module, rotary: nn.Module | None) -> None:
        super().__init__(config, layer, rotary)
        self.tp_sharded = frozenset(n for n, _ in self.named_parameters() if hf_is_sharded(n, config))


def _layer_idx(block: HFDecoderBlock) -> int:
    attn = getattr(block.layer, "attn", None) or getattr(block.layer, "self_attn")  # noqa: B009
    return int(attn.layer_idx)


def shard_hf_block(
    block: HFDecoderBlock, config: HFModelConfig, split: TPSplit, rank: int, group: Collective
) -> TPHFDecoderBlock:
    """Rank ``rank``'s shard of ``block`` (its slice of every sharded parameter, a copy of the replicated ones;
    the same parameter names). ``ValueError`` when ``split`` does not fit ``config`` or ``group``."""
    hsplit = hf_split(split, config)
    if group.world_size != split.world_size or group.rank != rank:
        raise ValueError(
            f"collective is rank {group.rank} of {group.world_size}, split wants rank {rank} of {split.world_size}"
        )
    layer = _rank_layer(config, _layer_idx(block), hsplit, rank, group)
    shard = TPHFDecoderBlock(config, layer, block.rotary)
    full = dict(block.named_parameters())
    if set(full) != {n for n, _ in shard.named_parameters()}:
        raise RuntimeError(
            f"the shard's parameters {sorted(dict(shard.named_parameters()))} differ from {sorted(full)}"
        )
    with torch.no_grad():
        for name, p in shard.named_parameters():
            part = shard_hf_tensor(name, full[name].detach(), config, split, rank)
            if part.shape != p.shape:
                raise RuntimeError(
                    f"{name}: rank {rank}'s slice is {tuple(part.shape)}, its layer holds {tuple(p.shape)}"
                )
            p.copy_(part)
    return shard


def gather_hf_block(
    shards: Sequence[HFDecoderBlock], config: HFModelConfig, split: TPSplit, full: HFDecoderBlock
) -> HFDecoderBlock:
    """``full`` (an unsplit block of the same layer, e.g. freshly built) holding the parameters assembled from
    every rank's shard; returned for convenience."""
    per_rank = [dict(s.named_parameters()) for s in shards]
    with torch.no_grad():
        for name, p in full.named_parameters():
            p.copy_(gather_hf_tensor(name, [d[name].detach() for d in per_rank], config, split))
    return full


__all__ = [
    "RowParallelConv1D",
    "TPHFDecoderBlock",
    "gather_hf_block",
    "gather_hf_tensor",
    "hf_is_sharded",
    "shard_hf_block",
    "shard_hf_tensor",
]
