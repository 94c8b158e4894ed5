"""The finished model: gather every stage's (and every tensor-parallel rank's) shard into the state dict of the
plain PyTorch model of the same config, and write it as ``model.safetensors`` + ``model.json``.

Keys are those of ``arceusd.models.build_reference_model(config)`` (``"<block>.<param>"``), so a user loads the
file with ``model.load_state_dict(safetensors.torch.load_file(path))`` and nothing of Arceus.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from arceusd.checkpoint import atomic_write
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.safetensors_io import load_bytes, save_bytes

PARAM_PREFIX = "param.blocks."


class ExportError(Exception):
    """The shards do not make a whole model; the message says what is missing."""


def shard_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (header only; the tensors are not touched)."""
    if len(data) < 8:
        raise ExportError("shard is shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, 1 << 24):
        raise ExportError("shard header length is out of range")
    header = json.loads(data[8 : 8 + n])
    meta = header.get("__metadata__", {})
    return {str(k): str(v) for k, v in meta.items()}


def assemble(config: MLPConfig | GPTConfig, shards: list[bytes]) -> dict[str, torch.Tensor]:
    """Full-model state dict from every worker's final shard."""
    from arceusd.worker.tensor_parallel import TPSplit, gather_tensor

    by_stage: dict[int, list[tuple[int, dict[str, str], dict[str, torch.Tensor]]]] = defaultdict(list)
    for data in shards:
        meta = shard_metadata(data)
        by_stage[int(meta["stage"])].append((int(meta["rank"]), meta, load_bytes(data)))
    state: dict[str, torch.Tensor] = {}
    for stage in sorted(by_stage):
        ranks = sorted(by_stage[stage], key=lambda r: r[0])
        if [r for r, _, _ in ranks] != list(range(len(ranks))):
            raise ExportError(f"stage {stage}: missing tensor-parallel ranks (have {[r for r, _, _ in ranks]})")
        meta = ranks[0][1]
        if len(ranks) == 1:
            for key, tensor in ranks[0][2].items():
                if key.startswith(PARAM_PREFIX):
                    state[key[len(PARAM_PREFIX) :]] = tensor
            continue
        if not isinstance(config, GPTConfig):
            raise ExportError("tensor-parallel shards need a GPT config")
        split = TPSplit(
            tuple(int(h) for h in meta["tp_heads"].split(",")),
            tuple(int(c) for c in meta["tp_columns"].split(",")),
        )
        for key in ranks[0][2]:
            if not key.startswith(PARAM_PREFIX):
                continue
            name = key[len(PARAM_PREFIX) :]
            within = name.split(".", 1)[1]
            state[name] = gather_tensor(within, [r[2][key] for r in ranks], config, split)
    return state


def model_description(config: MLPConfig | GPTConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    kind = "gpt" if isinstance(config, GPTConfig) else "mlp"
    fields = asdict(config)
    if kind == "mlp":
        fields["layer_sizes"] = list(config.layer_sizes)  # type: ignore[union-attr]
    return {"model": {"type": kind, **fields}, **(extra or {})}


def write_model(directory: Path, config: MLPConfig | GPTConfig, state: dict[str, torch.Tensor],
                extra: dict[str, Any] | None = None) -> Path:  # fmt: skip
    """Write ``model.safetensors`` and ``model.json`` (config + e.g. the vocabulary) atomically; return the path."""
    from arceusd.models.build import build_reference_model

    reference = build_reference_model(config, seed=0)
    expected = set(reference.state_dict())
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ExportError(f"the gathered model does not match its config: missing {missing[:5]}, "
                          f"unexpected {unexpected[:5]}")  # fmt: skip
    description = model_description(config, extra)
    path = directory / "model.safetensors"
    atomic_write(path, save_bytes(state, {"arceus": json.dumps(description)}))
    atomic_write(directory / "model.json", json.dumps(description, indent=2).encode())
    return path
