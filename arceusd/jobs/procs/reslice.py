"""Re-slicing a committed checkpoint for a new plan.

A checkpoint holds one shard per worker of the plan that wrote it (``stage{s}-rank{r}.safetensors``, metadata
``stage``/``rank``/``tp_heads``/``tp_columns``; keys ``param.blocks.<i>.<name>`` and
``optim.blocks.<i>.<name>.<buffer>``). After a repartition the stages and tensor-parallel splits differ, so the
leader gathers the shards into the *full* training state (:func:`full_state`: every parameter and optimizer
buffer of the whole model, tensor-parallel slices concatenated back: a GPT's by ``tensor_parallel``, a stock LM's
decoder layers' by ``hf_tp_tensors``) and cuts each new worker's slice out of it
(:func:`slice_state`). Optimizer buffers have their parameter's shape, so they are split exactly like it. A LoRA
job's shards hold its adapters only (:func:`trained_blocks`); the frozen base is rebuilt from its weights.

A tied weight (a stock LM's embedding and LM head, ``models.build.tied_pair``) is one tensor of the full state,
the owner's (block 0): the copy a stage holding the head without block 0 trains, bit-identical to it, is
dropped by :func:`full_state` and given again, with its optimizer buffers, to such a stage by :func:`slice_state`.

Pure functions over bytes and tensors: no files, no network. Nothing is unpickled (safetensors only).

Error handling: :class:`ResliceError` when the shards do not make a whole model (a missing rank or block).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import torch

from arceusd.files.safetensors_io import SafetensorsHeaderError, load_bytes, read_metadata
from arceusd.models.build import num_blocks, tied_pair
from arceusd.models.config import GPTConfig, ModelConfig
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora_keys import lora_blocks
from arceusd.worker.hf_tp_tensors import gather_hf_tensor, shard_hf_tensor
from arceusd.worker.protocol import StageConfig
from arceusd.worker.tensor_parallel import TPSplit, gather_tensor, shard_tensor


class ResliceError(Exception):
    """The shards cannot be combined into a whole model; the message says what is missing."""


def block_of(key: str) -> tuple[int, str]:
    """``("param"|"optim").blocks.<i>.<rest>`` -> ``(i, rest)``; ``rest`` keeps an optimizer buffer suffix."""
    kind, _, tail = key.partition(".")
    prefix, _, tail = tail.partition(".")
    index, _, rest = tail.partition(".")
    if kind not in ("param", "optim") or prefix != "blocks" or not index.isdigit() or not rest:
        raise ResliceError(f"unexpected tensor name {key!r} in a checkpoint shard")
    return int(index), rest


def _within(key: str) -> str:
    """The parameter's name inside its block (an optimizer key loses its ``.<buffer>`` suffix)."""
    _, rest = block_of(key)
    return rest.rpartition(".")[0] if key.startswith("optim.") else rest


Shard = tuple[Mapping[str, str], Mapping[str, torch.Tensor]]
"""A parsed shard: its safetensors metadata and its tensors."""


def parse_shard(data: bytes) -> Shard:
    """Metadata and tensors of one shard's bytes (the reference safetensors parser; nothing unpickled)."""
    try:
        return read_metadata(data), load_bytes(data)
    except (SafetensorsHeaderError, ValueError) as exc:
        raise ResliceError(f"a shard is not valid safetensors: {exc}") from None


def full_state(config: ModelConfig, shards: Sequence[Shard], params_only: bool = False) -> dict[str, torch.Tensor]:
    """The whole model's training state (parameters and, unless ``params_only``, optimizer buffers) from every
    worker's shard of one step, tensor-parallel slices gathered."""
    by_stage: dict[int, list[tuple[int, Mapping[str, str], Mapping[str, torch.Tensor]]]] = defaultdict(list)
    for meta, tensors in shards:
        try:
            stage, rank = int(meta["stage"]), int(meta["rank"])
        except (KeyError, ValueError):
            raise ResliceError("a shard lacks its stage/rank metadata") from None
        by_stage[stage].append((rank, meta, tensors))
    state: dict[str, torch.Tensor] = {}
    for stage in sorted(by_stage):
        ranks = sorted(by_stage[stage], key=lambda r: r[0])
        if [r for r, _, _ in ranks] != list(range(len(ranks))):
            raise ResliceError(f"stage {stage}: missing tensor-parallel ranks (have {[r for r, _, _ in ranks]})")
        keys = [k for k in ranks[0][2] if not (params_only and k.startswith("optim."))]
        if len(ranks) == 1:
            state.update({k: ranks[0][2][k] for k in keys})
            continue
        meta = ranks[0][1]
        split = TPSplit(
            tuple(int(h) for h in meta["tp_heads"].split(",")),
            tuple(int(c) for c in meta["tp_columns"].split(",")),
        )
        for key in keys:
            try:
                parts = [r[2][key] for r in ranks]
            except KeyError:
                raise ResliceError(f"stage {stage}: {key} is missing on some rank") from None
            state[key] = _gather(config, _within(key), parts, split)
    _drop_tied_copy(config, state)
    present = {block_of(k)[0] for k in state if k.startswith("param.")}
    missing = sorted(trained_blocks(config) - present)
    if missing:
        raise ResliceError(f"the shards hold no parameters of block(s) {missing}: a stage's shard is missing")
    return state


def _gather(config: ModelConfig, name: str, parts: Sequence[torch.Tensor], split: TPSplit) -> torch.Tensor:
    """The full tensor ``name`` (inside its block) from a tensor-parallel group's slices."""
    if isinstance(config, GPTConfig):
        return gather_tensor(name, parts, config, split)
    if isinstance(config, HFModelConfig):
        return gather_hf_tensor(name, parts, config, split)
    raise ResliceError("tensor-parallel shards need a GPT or a stock LM config")


def _shard(config: ModelConfig, name: str, full: torch.Tensor, split: TPSplit, rank: int) -> torch.Tensor:
    """Rank ``rank``'s slice of the full tensor ``name`` (inside its block) under ``split``."""
    if isinstance(config, GPTConfig):
        return shard_tensor(name, full, config, split, rank)
    if isinstance(config, HFModelConfig):
        return shard_hf_tensor(name, full, config, split, rank)
    raise ResliceError("a tensor-parallel stage needs a GPT or a stock LM config")


def trained_blocks(config: ModelConfig) -> set[int]:
    """The blocks whose parameters a checkpoint holds: every block, or with LoRA those with adapters."""
    if isinstance(config, HFModelConfig) and config.lora is not None:
        return lora_blocks(config)
    return set(range(num_blocks(config)))


def _drop_tied_copy(config: ModelConfig, state: dict[str, torch.Tensor]) -> None:
    """Remove the tied weight's copy (and its optimizer buffers): the owner's tensor is the weight."""
    pair = tied_pair(config)
    if pair is None:
        return
    for key in [k for k in state if block_of(k)[0] == pair.copy_block and _within(k) == pair.copy_name]:
        del state[key]


def _tied_copy(config: ModelConfig, full: Mapping[str, torch.Tensor], stage: StageConfig) -> dict[str, torch.Tensor]:
    """For a stage holding the tied weight's copy without its owner: the owner's tensors under the copy's names."""
    pair = tied_pair(config)
    if pair is None or pair.split_by(stage.start, stage.end) != "copy":
        return {}
    out: dict[str, torch.Tensor] = {}
    for key, tensor in full.items():
        if block_of(key)[0] == pair.owner_block and _within(key) == pair.owner_name:
            kind = key.partition(".")[0]
            suffix = key[len(f"{kind}.blocks.{pair.owner}") :]  # "" or an optimizer buffer's ".exp_avg"
            out[f"{kind}.blocks.{pair.copy}{suffix}"] = tensor.clone()
    return out


def slice_state(
    config: ModelConfig, full: dict[str, torch.Tensor], stage: StageConfig, rank: int
) -> dict[str, torch.Tensor]:
    """Rank ``rank`` of ``stage``'s part of ``full``: the tensors a worker loads with ``load_state_tensors``."""
    split = stage.split()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in full.items():
        index, _ = block_of(key)
        if not stage.start <= index < stage.end:
            continue
        if split is None:
            out[key] = tensor.clone()
        else:
            out[key] = _shard(config, _within(key), tensor, split, rank)
    out.update(_tied_copy(config, full, stage))
    return out


__all__ = ["ResliceError", "Shard", "block_of", "full_state", "parse_shard", "slice_state", "trained_blocks"]
