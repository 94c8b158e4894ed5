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

LoRA (a job with ``[lora]``, :mod:`arceusd.models.hf.lora`): the rank's layer gets adapters that go with the
split, under peft's names (``q_proj.base_layer.weight``, ``q_proj.lora_A.default.weight``, ...), its base frozen
(buffers), so the rank's shard computes its part of the unsplit peft layer exactly:

* a column-parallel projection (:class:`ColumnParallelLoRA`; q/k/v, gate/up, gpt2 ``c_attn``/``c_fc``): the base's
  output rows and ``lora_B``'s (out, r) rows are the rank's, ``lora_A`` is whole on every rank. ``u = A x`` goes
  through ``f`` (identity forward, all-reduce backward), so every rank's ``A`` gets the gradient summed over the
  ranks' ``B_k^T dy_k`` (the same on all: a replicated parameter stays replicated); the input's gradient through
  ``A`` is taken on rank 0 alone (the other ranks run ``A`` on a detached input), since ``f`` in front of the
  layer sums the ranks' input gradients again. One extra all-reduce of (B, T, r) per adapted projection, backward.
* a row-parallel projection (:class:`RowParallelLoRA`; o/down, gpt2's ``c_proj``s): ``lora_A``'s (r, in) input
  columns are the rank's, ``lora_B`` is whole; the partial ``A_k x_k`` rides in the layer's existing all-reduce
  (concatenated to the base's partial output), then ``B`` and the bias are applied once, identically on every
  rank: no extra all-reduce, and ``B``'s gradient is the whole one on every rank.

Not covered: dropout inside a split layer (each rank would draw its own mask; the tests train without dropout),
LoRA's dropout included (``build_stage`` refuses it and the planner keeps such layers whole).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Block
from transformers.pytorch_utils import Conv1D

from arceusd.models.hf.blocks import _LAYERS, HFDecoderBlock, transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora import freeze_base
from arceusd.models.hf.lora_keys import ADAPTER, adapted_modules
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.worker.collective import Collective
from arceusd.worker.hf_tp_split import HFTPSplit, hf_split
from arceusd.worker.hf_tp_tensors import gather_hf_tensor, hf_is_sharded, hf_parallel_kind, shard_hf_tensor
from arceusd.worker.tensor_parallel import RowParallelLinear, copy_to_group, reduce_from_group
from arceusd.worker.tp_split import TPSplit


class RowParallelConv1D(nn.Module):
    """gpt2's ``Conv1D`` (``y = x @ W + b``, ``W`` of shape (in, out)) with ``W`` sharded by input rows:
    ``y = all_reduce(x_local @ W_local) + b``, the bias replicated."""

    matmul_weight = True  # a LoRA job's frozen base holds ``weight`` in bf16 under autocast (models/hf/lora.py)

    def __init__(self, in_local: int, out_features: int, group: Collective) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_local, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(torch.matmul(x, self.weight), self.group)  # (B, T, in_local) -> (B, T, out)
        return y + self.bias


def _linear(fan_in: int, fan_out: int) -> nn.Linear:
    """An uninitialised bias-free ``nn.Linear`` (its values are copied in by :func:`shard_hf_block`)."""
    return nn.Linear(fan_in, fan_out, bias=False, device="meta").to_empty(device="cpu")


class _LoraParts(nn.Module):
    """peft's adapter submodules of one adapted projection, under peft's names: ``lora_A.default`` (r, in),
    ``lora_B.default`` (out, r), ``lora_dropout.default`` and ``scaling`` = alpha / r."""

    def __init__(self, fan_in: int, fan_out: int, lora: LoraSpec) -> None:
        super().__init__()
        self.lora_A = nn.ModuleDict({ADAPTER: _linear(fan_in, lora.r)})
        self.lora_B = nn.ModuleDict({ADAPTER: _linear(lora.r, fan_out)})
        dropout: nn.Module = nn.Dropout(lora.dropout) if lora.dropout > 0 else nn.Identity()
        self.lora_dropout = nn.ModuleDict({ADAPTER: dropout})
        self.scaling = lora.scaling

    def down(self, x: torch.Tensor) -> torch.Tensor:
        """``A dropout(x)``, ``x`` cast to the adapter's dtype as peft casts it."""
        a = self.lora_A[ADAPTER]
        assert isinstance(a, nn.Linear)
        x = x if x.dtype == a.weight.dtype else x.to(a.weight.dtype)
        out: torch.Tensor = a(self.lora_dropout[ADAPTER](x))
        return out

    def up(self, u: torch.Tensor) -> torch.Tensor:
        """``B u`` scaled."""
        out: torch.Tensor = self.lora_B[ADAPTER](u) * self.scaling
        return out


class ColumnParallelLoRA(_LoraParts):
    """A column-parallel projection with its adapter: ``y_k = base_k(x) + s B_k f(A x)``, ``A`` replicated
    (module docstring). ``base_layer``: the rank's slice of the projection (``nn.Linear`` or gpt2's ``Conv1D``)."""

    def __init__(self, base_layer: nn.Module, fan_in: int, out_local: int, lora: LoraSpec, group: Collective) -> None:
        super().__init__(fan_in, out_local, lora)
        self.base_layer = base_layer
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.base_layer(x)
        lead = self.group.rank == 0  # only rank 0's A passes a gradient to x: f in front of the layer sums them
        u = copy_to_group(self.down(x if lead else x.detach()), self.group)  # (B, T, r), its gradient summed
        return (result + self.up(u)).to(result.dtype)


class RowParallelLoRA(_LoraParts):
    """A row-parallel projection with its adapter: ``y = g([W_k x_k, A_k x_k])`` split into the base's sum and
    ``u``, then ``+ bias + s B u`` (module docstring). ``base_layer``: the rank's input columns of the
    projection (``nn.Linear`` (out, in_local), or gpt2's ``Conv1D`` (in_local, out)), its bias replicated."""

    def __init__(
        self, in_local: int, out_features: int, bias: bool, conv1d: bool, lora: LoraSpec, group: Collective
    ) -> None:
        super().__init__(in_local, out_features, lora)
        with torch.device("meta"):
            base: nn.Module = (
                Conv1D(out_features, in_local)  # type: ignore[no-untyped-call]
                if conv1d
                else nn.Linear(in_local, out_features, bias=bias)
            )
        self.base_layer = base.to_empty(device="cpu")
        self.conv1d = conv1d
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = cast(torch.Tensor, self.base_layer.weight)  # frozen: a buffer
        bias = cast(torch.Tensor | None, self.base_layer.bias)
        partial = torch.matmul(x, weight) if self.conv1d else F.linear(x, weight)  # (B, T, out), this rank's
        u = self.down(x)  # (B, T, r), this rank's part of A x
        n = partial.shape[-1]
        both = reduce_from_group(torch.cat([partial, u.to(partial.dtype)], dim=-1), self.group)
        y = both[..., :n]
        if bias is not None:
            y = y + bias
        return (y + self.up(both[..., n:].to(u.dtype))).to(partial.dtype)


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    root.get_submodule(parent).add_module(name, module)


def _add_tp_lora(layer: nn.Module, config: HFModelConfig, index: int, group: Collective) -> None:
    """Wrap block ``index``'s adapted projections of the rank's ``layer`` (module docstring); freeze the base."""
    assert config.lora is not None
    if config.lora.dropout > 0:
        raise ValueError(
            "LoRA dropout on a tensor-parallel layer is not built (each rank would draw its own mask): set "
            "lora.dropout = 0 or keep the layer whole"
        )
    for path, (fan_in, fan_out) in adapted_modules(config, index).items():
        local = path.removeprefix("layer.")
        base = layer.get_submodule(local)
        kind = hf_parallel_kind(path, config)
        if kind == "column":
            weight = base.get_parameter("weight")  # not frozen yet
            out_local = int(weight.shape[1] if config.is_gpt2 else weight.shape[0])
            _set_module(layer, local, ColumnParallelLoRA(base, fan_in, out_local, config.lora, group))
        elif kind == "row":
            assert isinstance(base, RowParallelLinear | RowParallelConv1D)
            in_local = int(base.weight.shape[0] if config.is_gpt2 else base.weight.shape[1])
            bias = base.bias is not None
            wrapped = RowParallelLoRA(in_local, fan_out, bias, config.is_gpt2, config.lora, group)
            _set_module(layer, local, wrapped)
        else:
            raise ValueError(f"{path}: an adapted module that a tensor-parallel split does not cover")
    freeze_base(layer)


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
    index = _layer_idx(block)
    layer = _rank_layer(config, index, hsplit, rank, group)
    if config.lora is not None:
        _add_tp_lora(layer, config, index + 1, group)  # block index: the embeddings are block 0
    shard = TPHFDecoderBlock(config, layer, block.rotary)
    for what, full, mine in (
        ("parameters", dict(block.named_parameters()), dict(shard.named_parameters())),
        ("frozen tensors", _frozen(block), _frozen(shard)),  # a LoRA job's base
    ):
        if set(full) != set(mine):
            raise RuntimeError(f"the shard's {what} {sorted(mine)} differ from {sorted(full)}")
        with torch.no_grad():
            for name, t in mine.items():
                part = shard_hf_tensor(name, full[name].detach(), config, split, rank)
                if part.shape != t.shape:
                    raise RuntimeError(
                        f"{name}: rank {rank}'s slice is {tuple(part.shape)}, its layer holds {tuple(t.shape)}"
                    )
                t.copy_(part)
    return shard


def _frozen(block: nn.Module) -> dict[str, torch.Tensor]:
    """The block's buffers but the rotary module's (shared with the unsplit block, nothing to slice)."""
    return {n: b for n, b in block.named_buffers() if not n.startswith("rotary.")}


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
    "ColumnParallelLoRA",
    "RowParallelConv1D",
    "RowParallelLoRA",
    "TPHFDecoderBlock",
    "gather_hf_block",
    "gather_hf_tensor",
    "hf_is_sharded",
    "shard_hf_block",
    "shard_hf_tensor",
]
