"""The finished model: gather every stage's (and every tensor-parallel rank's) shard into the state dict of the
plain PyTorch model of the same config, and write it as ``model.safetensors`` + ``model.json``.

Keys are those of ``arceusd.models.build_reference_model(config)`` (``"<block>.<param>"``), so a user loads the
file with ``model.load_state_dict(safetensors.torch.load_file(path))`` and nothing of Arceus.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from arceusd.base.atomic_files import atomic_write
from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.procs.reslice import ResliceError, full_state, parse_shard
from arceusd.models.build import build_reference_model
from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig

PARAM_PREFIX = "param.blocks."


class ExportError(Exception):
    """The shards do not make a whole model; the message says what is missing."""


def assemble(config: ModelConfig, shards: list[bytes]) -> dict[str, torch.Tensor]:
    """Full-model state dict (reference-model names) from every worker's final shard."""
    try:
        state = full_state(config, [parse_shard(d) for d in shards], params_only=True)
    except ResliceError as exc:
        raise ExportError(str(exc)) from None
    return {key[len(PARAM_PREFIX) :]: tensor for key, tensor in state.items()}


def model_description(config: MLPConfig | GPTConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    kind = "gpt" if isinstance(config, GPTConfig) else "mlp"
    fields = asdict(config)
    if kind == "mlp":
        fields["layer_sizes"] = list(config.layer_sizes)  # type: ignore[union-attr]
    return {"model": {"type": kind, **fields}, **(extra or {})}


def write_model(
    directory: Path, config: MLPConfig | GPTConfig, state: dict[str, torch.Tensor], extra: dict[str, Any] | None = None
) -> Path:
    """Write ``model.safetensors`` and ``model.json`` (config + e.g. the vocabulary) atomically; return the path."""
    reference = build_reference_model(config, seed=0)
    expected = set(reference.state_dict())
    if set(state) != expected:
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ExportError(
            f"the gathered model does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    description = model_description(config, extra)
    path = directory / "model.safetensors"
    atomic_write(path, save_bytes(state, {"arceus": json.dumps(description)}))
    atomic_write(directory / "model.json", json.dumps(description, indent=2).encode())
    return path
