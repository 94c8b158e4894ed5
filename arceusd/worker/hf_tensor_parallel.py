"""Megatron-style tensor parallelism of a stock ``transformers`` decoder layer (gpt2, llama, qwen2, mistral).

Owns: :func:`shard_hf_block` (rank ``r``'s shard of an :class:`~arceusd.models.hf.blocks.HFDecoderBlock`),
:func:`build_hf_shard` / :func:`load_shard_weights` (a shard built at its size from initial weights, a member's
slice holding only its shards) and :func:`gather_hf_block`; the by-name :func:`shard_hf_tensor` /
:func:`gather_hf_tensor` / :func:`hf_is_sharded` (checkpoints, optimizer state of a parameter's shape) live in
:mod:`arceusd.worker.hf_tp_tensors` (no transformers import) and are re-exported here.

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
  output rows and ``lora_B``'s (out, r) rows are the rank's, ``lora_A`` is whole on every rank. ``u = A x`` is
  taken from the norm's output *before* ``f`` and goes through ``f`` with it (the norm's hook; one all-reduce of
  the norm output's and every ``u``'s gradients together, backward): every rank's ``A`` gets the gradient
  summed over the ranks' ``B_k^T dy_k`` (the same on all: a replicated parameter stays replicated), and the
  gradient through ``A`` reaches the norm already whole, not summed again. No extra all-reduce, (B, T, r)
  values more per adapted projection in the sub-layer's backward one.
* a row-parallel projection (:class:`RowParallelLoRA`; o/down, gpt2's ``c_proj``s): ``lora_A``'s (r, in) input
  columns are the rank's, ``lora_B`` is whole; the partial ``A_k x_k`` rides in the layer's existing all-reduce
  (concatenated to the base's partial output), then ``B`` and the bias are applied once, identically on every
  rank: no extra all-reduce, and ``B``'s gradient is the whole one on every rank.

Not covered: dropout inside a split layer (each rank would draw its own mask; the tests train without dropout),
LoRA's dropout included (``build_stage`` refuses it and the planner keeps such layers whole).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn
from transformers import PretrainedConfig
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Block
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.pytorch_utils import Conv1D

from arceusd.models.hf.blocks import _LAYERS, HFDecoderBlock, transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import block_tensors, hf_key
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


class _CopyManyToGroup(torch.autograd.Function):
    """f over several tensors of the same leading dimensions: identity forward; backward one all-reduce of all
    their gradients, concatenated along the last dimension (in the first one's dtype)."""

    @staticmethod
    def forward(ctx: Any, group: Collective, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        ctx.widths = [x.shape[-1] for x in xs]
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dtype = grads[0].dtype
        summed = ctx.group.all_reduce_sum(torch.cat([g.to(dtype) for g in grads], dim=-1))
        parts = torch.split(summed, ctx.widths, dim=-1)
        return (None, *(p.to(g.dtype) for p, g in zip(parts, grads, strict=True)))


_copy_many_to_group = cast(Callable[..., tuple[torch.Tensor, ...]], _CopyManyToGroup.apply)
"""f(group, *xs) over several tensors at once (:class:`_CopyManyToGroup`)."""


class ColumnParallelLoRA(_LoraParts):
    """A column-parallel projection with its adapter: ``y_k = base_k(x) + s B_k u``, ``u = f(A x)`` given by its
    sub-layer's norm hook (:class:`_EnterGroup`) in ``pending``, ``A`` replicated (module docstring).
    ``base_layer``: the rank's slice of the projection (``nn.Linear`` or gpt2's ``Conv1D``)."""

    def __init__(self, base_layer: nn.Module, fan_in: int, out_local: int, lora: LoraSpec) -> None:
        super().__init__(fan_in, out_local, lora)
        self.base_layer = base_layer
        self.pending: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.base_layer(x)
        u, self.pending = self.pending, None
        if u is None:
            raise RuntimeError("a split LoRA projection ran without its norm's hook (it gives A x)")
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


def _add_tp_lora(
    layer: nn.Module, config: HFModelConfig, index: int, group: Collective
) -> dict[str, list[ColumnParallelLoRA]]:
    """Wrap block ``index``'s adapted projections of the rank's ``layer`` (module docstring); freeze the base.
    Returns the column-parallel ones by sub-layer (``attn`` / ``mlp``), for their norm's hook."""
    assert config.lora is not None
    if config.lora.dropout > 0:
        raise ValueError(
            "LoRA dropout on a tensor-parallel layer is not built (each rank would draw its own mask): set "
            "lora.dropout = 0 or keep the layer whole"
        )
    columns: dict[str, list[ColumnParallelLoRA]] = {"attn": [], "mlp": []}
    for path, (fan_in, fan_out) in adapted_modules(config, index).items():
        local = path.removeprefix("layer.")
        base = layer.get_submodule(local)
        kind = hf_parallel_kind(path, config)
        if kind == "column":
            weight = base.get_parameter("weight")  # not frozen yet
            out_local = int(weight.shape[1] if config.is_gpt2 else weight.shape[0])
            adapted = ColumnParallelLoRA(base, fan_in, out_local, config.lora)
            columns["mlp" if local.startswith("mlp.") else "attn"].append(adapted)
            _set_module(layer, local, adapted)
        elif kind == "row":
            assert isinstance(base, RowParallelLinear | RowParallelConv1D)
            in_local = int(base.weight.shape[0] if config.is_gpt2 else base.weight.shape[1])
            bias = base.bias is not None
            wrapped = RowParallelLoRA(in_local, fan_out, bias, config.is_gpt2, config.lora, group)
            _set_module(layer, local, wrapped)
        else:
            raise ValueError(f"{path}: an adapted module that a tensor-parallel split does not cover")
    freeze_base(layer)
    return columns


class _EnterGroup:
    """A forward hook applying ``f`` to a module's output (the entry of the column-parallel layers after it).
    With LoRA, ``adapters`` (the sub-layer's adapted column-parallel projections) each get ``f(A x)`` of the
    output ``x`` in ``pending``, their gradients all-reduced together with the output's."""

    def __init__(self, group: Collective, adapters: Sequence[ColumnParallelLoRA] = ()) -> None:
        self.group = group
        self.adapters = tuple(adapters)

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        if not self.adapters:
            return copy_to_group(output, self.group)
        x, *fed = _copy_many_to_group(self.group, output, *(a.down(output) for a in self.adapters))
        for adapter, u in zip(self.adapters, fed, strict=True):
            adapter.pending = u  # (B, T, r)
        entered: torch.Tensor = x
        return entered


_NORMS = {True: ("ln_1", "ln_2"), False: ("input_layernorm", "post_attention_layernorm")}
"""The norm in front of the attention and of the MLP, by ``is_gpt2``."""


def _enter_hooks(
    layer: nn.Module, config: HFModelConfig, group: Collective, adapters: dict[str, list[ColumnParallelLoRA]]
) -> None:
    """``f`` after the norm in front of each sub-layer (with the sub-layer's adapted column projections' ``A``)."""
    for norm, sub in zip(_NORMS[config.is_gpt2], ("attn", "mlp"), strict=True):
        layer.get_submodule(norm).register_forward_hook(_EnterGroup(group, adapters.get(sub, ())))


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
    """The library's layer for rank ``rank``'s heads and columns (uninitialised), its output projections
    row-parallel (the norms' ``f`` hooks: :func:`_enter_hooks`)."""
    rc = _rank_config(transformers_config(config), config, split, rank)
    with torch.device("meta"):
        layer: nn.Module = _LAYERS[config.model_type](rc, layer_idx=layer_idx)
    layer = layer.to_empty(device="cpu")
    C, heads_in = config.hidden, split.heads[rank] * config.head_dim
    if isinstance(layer, GPT2Block):
        attn = layer.attn
        assert isinstance(attn, GPT2Attention)
        attn.c_attn = Conv1D(3 * heads_in, C)  # type: ignore[no-untyped-call]  # the rank's q, k and v columns
        attn.num_heads = split.heads[rank]
        attn.split_size = heads_in
        attn.add_module("c_proj", RowParallelConv1D(heads_in, C, group))  # replaces the library's Conv1D
        layer.mlp.add_module("c_proj", RowParallelConv1D(split.columns[rank], C, group))
        return layer
    attn = getattr(layer, "self_attn")  # noqa: B009  # the library's attention class of this model type
    mlp = getattr(layer, "mlp")  # noqa: B009
    attn.o_proj = RowParallelLinear(heads_in, C, attn.o_proj.bias is not None, group)
    mlp.down_proj = RowParallelLinear(split.columns[rank], C, mlp.down_proj.bias is not None, group)
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
    adapters = _add_tp_lora(layer, config, index + 1, group) if config.lora is not None else {}  # block index
    _enter_hooks(layer, config, group, adapters)
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


def build_hf_shard(
    config: HFModelConfig, index: int, split: TPSplit, rank: int, group: Collective, weights: Path
) -> TPHFDecoderBlock:
    """Rank ``rank``'s shard of decoder block ``index`` built at its own size, its tensors read from ``weights``
    (:func:`load_shard_weights`): no full layer is ever built. The same module as :func:`shard_hf_block` cuts
    from the full block read from ``weights``. Not for a LoRA job (its adapters are drawn whole from the seed,
    then cut: :func:`shard_hf_block`)."""
    if config.lora is not None:
        raise ValueError("a LoRA layer's shard is cut from the full block (its adapters are drawn whole)")
    hsplit = hf_split(split, config)
    if group.world_size != split.world_size or group.rank != rank:
        raise ValueError(
            f"collective is rank {group.rank} of {group.world_size}, split wants rank {rank} of {split.world_size}"
        )
    layer = _rank_layer(config, index - 1, hsplit, rank, group)
    _enter_hooks(layer, config, group, {})
    tc = transformers_config(config)
    rotary = None if config.is_gpt2 else LlamaRotaryEmbedding(tc)  # type: ignore[arg-type]  # as blocks.py builds it
    shard = TPHFDecoderBlock(config, layer, rotary)
    load_shard_weights(shard, weights, config, index, split, rank)
    return shard


def load_shard_weights(
    shard: TPHFDecoderBlock, path: Path, config: HFModelConfig, index: int, split: TPSplit, rank: int
) -> None:
    """Copy block ``index``'s initial weights from the safetensors file ``path`` into rank ``rank``'s ``shard``
    (a LoRA job's frozen base included; its adapters stay as drawn from the seed). The file holds each split
    tensor either as this rank's shard (a member's slice, :mod:`arceusd.models.hf.weights_slice`) or whole (the
    owner's file: cut here); the replicated ones whole. ``ValueError`` (one line) for a missing tensor or a
    shape that is neither."""
    own = block_tensors(config, index)
    targets = {**dict(shard.named_parameters()), **_frozen(shard)}
    found: set[str] = set()
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        for name, t in targets.items():
            local = name.replace(".base_layer.", ".", 1)
            if local not in own:  # an adapter (drawn from the seed), not an initial weight
                continue
            key = hf_key(config, index, local)
            if key not in keys:
                raise ValueError(f"initial weights {path}: missing {key} (block {index}); the file does not match")
            src = f.get_tensor(key)
            if tuple(src.shape) == own[local] and tuple(src.shape) != tuple(t.shape):
                src = shard_hf_tensor(local, src, config, split, rank)
            if src.shape != t.shape:
                raise ValueError(
                    f"initial weights {path}: {key} has shape {list(src.shape)}; rank {rank} holds "
                    f"{list(t.shape)} of {list(own[local])}"
                )
            with torch.no_grad():
                t.copy_(src)
            found.add(local)
    if found != set(own):
        raise RuntimeError(f"block {index}: the shard holds no {sorted(set(own) - found)[:3]} (a bug)")


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
    "build_hf_shard",
    "gather_hf_block",
    "gather_hf_tensor",
    "hf_is_sharded",
    "load_shard_weights",
    "shard_hf_block",
    "shard_hf_tensor",
]
