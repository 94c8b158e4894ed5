"""Which tensors of a stock ``transformers`` decoder block a tensor-parallel split cuts, and how (torch only).

Owns: :func:`hf_is_sharded`, :func:`shard_hf_tensor` and :func:`gather_hf_tensor`, by parameter name inside an
``HFDecoderBlock`` (``layer.self_attn.q_proj.weight``; the embedding's and the head's names are never split):
the shards :mod:`arceusd.worker.hf_tensor_parallel` builds hold exactly these slices, and checkpoints and
re-slicing (:mod:`arceusd.jobs.procs.reslice`) cut and join parameters and their optimizer buffers (same shapes) with
them without importing transformers. A ``TPSplit`` counts key/value heads per rank for these models
(:mod:`arceusd.worker.hf_tp_split`). The tables of which tensors are cut, along which dimension, and a rank's
index ranges are torch-free, in :mod:`arceusd.models.hf.weights_chunks` (initial weights are cut by them too):

* q rows / k, v rows (llama, qwen2, mistral), by the rank's query heads / key/value heads; ``o_proj``'s columns
  by query heads; ``gate_proj``/``up_proj`` rows and ``down_proj`` columns by MLP columns;
* gpt2 (``Conv1D``: weight (in, out)): ``c_attn``'s last dimension, the rank's heads of each of its q, k and v
  sections; ``attn.c_proj`` rows by heads; ``c_fc``'s last dimension and ``mlp.c_proj`` rows by columns.
Biases of the output projections are replicated.

LoRA (:mod:`arceusd.models.hf.lora`): a frozen base tensor under peft's ``<module>.base_layer.<weight|bias>``
splits as ``<module>.<weight|bias>``. An adapter splits with its layer: on a column-parallel projection (q/k/v,
gate/up; gpt2 ``c_attn``, ``c_fc``: the output split) ``lora_B`` (out, r) by its output rows as the base's, and
``lora_A`` (r, in) is replicated; on a row-parallel one (``o_proj``, ``down_proj``; gpt2 ``c_proj``s: the input
split) ``lora_A`` by its input columns as the base's, and ``lora_B`` is replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora_keys import ADAPTER
from arceusd.models.hf.weights_chunks import TP_SPLIT_GPT2, TP_SPLIT_LLAMA, SplitBy, rank_ranges
from arceusd.worker.hf_tp_split import HFTPSplit, hf_split
from arceusd.worker.tp_split import TPSplit

_LLAMA, _GPT2 = TP_SPLIT_LLAMA, TP_SPLIT_GPT2
"""name inside an HFDecoderBlock -> (dimension it is split along, what it is split by), by architecture."""


_LORA_A, _LORA_B = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"


def _layout(name: str, config: HFModelConfig) -> tuple[int, str] | None:
    table = _GPT2 if config.is_gpt2 else _LLAMA
    if ".base_layer." in name:  # a LoRA job's frozen base of an adapted module
        return table.get(name.replace(".base_layer.", ".", 1))
    for suffix in (_LORA_A, _LORA_B):
        if name.endswith(suffix):
            module = name.removesuffix(suffix)
            kind = hf_parallel_kind(module, config)
            if kind is None:
                return None
            by = table[f"{module}.weight"][1]
            if kind == "column":  # lora_B (out, r) by the base's output rows; lora_A replicated
                return (0, by) if suffix == _LORA_B else None
            return (1, by) if suffix == _LORA_A else None  # row: lora_A (r, in) by the base's input columns
    return table.get(name)


def hf_parallel_kind(module: str, config: HFModelConfig) -> str | None:
    """``"column"`` (output features split) or ``"row"`` (input features split) for the linear layer at path
    ``module`` inside a decoder block (``layer.self_attn.q_proj``), None when it is not split."""
    base = (_GPT2 if config.is_gpt2 else _LLAMA).get(f"{module}.weight")
    if base is None:
        return None
    return "column" if base[0] == (-1 if config.is_gpt2 else 0) else "row"


def hf_is_sharded(name: str, config: HFModelConfig) -> bool:
    """Whether parameter ``name`` of a decoder block is split across ranks (else replicated)."""
    return _layout(name, config) is not None


def _ranges(kind: str, config: HFModelConfig, split: HFTPSplit, rank: int) -> tuple[tuple[int, int], ...]:
    """The index ranges (along the split dimension) of rank ``rank``'s part of a tensor split by ``kind``."""
    return rank_ranges(SplitBy(kind), config, split.kv_heads, split.columns, rank)


def shard_hf_tensor(name: str, full: torch.Tensor, config: HFModelConfig, split: TPSplit, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the full decoder-block tensor ``name`` (a copy; replicated tensors are cloned)."""
    layout = _layout(name, config)
    if layout is None:
        return full.clone()
    dim, kind = layout
    parts = [full.narrow(dim, a, b - a) for a, b in _ranges(kind, config, hf_split(split, config), rank)]
    return torch.cat(parts, dim=dim).clone()


def gather_hf_tensor(name: str, shards: Sequence[torch.Tensor], config: HFModelConfig, split: TPSplit) -> torch.Tensor:
    """Inverse of :func:`shard_hf_tensor`: the full tensor from all ranks' slices (replicated: rank 0's)."""
    if len(shards) != split.world_size:
        raise ValueError(f"need {split.world_size} shards of {name}, got {len(shards)}")
    layout = _layout(name, config)
    if layout is None:
        return shards[0].clone()
    dim, kind = layout
    if kind != "qkv":
        return torch.cat(list(shards), dim=dim)
    heads = hf_split(split, config).heads
    sections = []
    for sec in range(3):  # gpt2 c_attn: every rank's q, then every rank's k, then every rank's v
        for r, t in enumerate(shards):
            n = heads[r] * config.head_dim
            sections.append(t.narrow(dim, sec * n, n))
    return torch.cat(sections, dim=dim)


__all__ = ["gather_hf_tensor", "hf_is_sharded", "hf_parallel_kind", "shard_hf_tensor"]
