"""A job spec for a stock ``transformers`` model object, a tokenizer and a data file (``[model] type = "hf"``,
``[data] kind = "tokens"``: :mod:`arceusd.jobs.spec.hf`), written beside the model's files in a job folder.

:func:`prepare_model_job` checks the architecture and the tokenizer first (one line each), writes config.json
and tokenizer.json, validates the spec as ``arceusd submit`` would (so a bad field is reported before the
weights are written or anything is sent), then writes the initial weights and ``job.json``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from arceus import hf_files
from arceus.specs import spec_file, validate
from arceusd.jobs.spec.schema import JobSpec

DEFAULT_TRAINING: Mapping[str, Any] = {"steps": 100, "batch_size": 8, "optimizer": "adamw", "lr": 3e-4}
"""``[training]`` unless the caller's ``training`` says otherwise (key by key)."""
DEFAULT_BLOCK_SIZE = 128


@dataclass(frozen=True)
class ModelJob:
    """How to train a model object: the spec's fields that are not the model's own."""

    data: Path
    """A UTF-8 text file, or JSONL (``data_format = "jsonl"``, chosen by a ``.jsonl`` suffix when not given)."""
    name: str | None = None
    """The job's name (default: the model type and the data file's stem)."""
    block_size: int | None = None
    """The training context (default: 128, at most the architecture's positions)."""
    training: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: Mapping[str, Any] | None = None
    needs: Mapping[str, Any] | None = None
    lora: Mapping[str, Any] | None = None
    """``[lora]``: low-rank adapters on the frozen model, e.g. ``{"r": 8, "target_modules": ["q_proj", "v_proj"]}``."""
    seed: int = 0
    data_format: str | None = None
    text_field: str = "text"
    val_fraction: float = 0.1


class ModelChoices(TypedDict, total=False):
    """:class:`ModelJob`'s fields but the data, as keyword arguments (``Client.submit_model(..., **choices)``)."""

    name: str
    block_size: int
    training: Mapping[str, Any]
    checkpoint: Mapping[str, Any]
    needs: Mapping[str, Any]
    lora: Mapping[str, Any]
    seed: int
    data_format: str
    text_field: str
    val_fraction: float


@dataclass(frozen=True)
class PreparedJob:
    """The spec file the daemon reads, in the job folder with the model's files, and the spec it holds."""

    folder: Path
    spec_path: Path
    spec: JobSpec


def default_name(model_type: str, data: Path) -> str:
    """``<model type>-<data stem>`` in the characters a job name allows."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model_type}-{data.stem}")[:64].strip("-") or model_type


def spec_doc(job: ModelJob, model_type: str, positions: int, weights: bool) -> dict[str, Any]:
    """The spec as a dict whose files are the job folder's (``config.json``, ``tokenizer.json``, and
    ``model.safetensors`` when ``weights``), the data at its absolute path."""
    data = job.data.expanduser().absolute()
    fmt = job.data_format or ("jsonl" if data.suffix.lower() == ".jsonl" else "text")
    model: dict[str, Any] = {
        "type": "hf",
        "config": hf_files.CONFIG_FILE,
        "block_size": job.block_size or min(DEFAULT_BLOCK_SIZE, positions),
    }
    if weights:
        model["weights"] = hf_files.WEIGHTS_FILE
    tokens: dict[str, Any] = {
        "kind": "tokens",
        "path": str(data),
        "tokenizer": hf_files.TOKENIZER_FILE,
        "format": fmt,
        "val_fraction": job.val_fraction,
    }
    if fmt == "jsonl":
        tokens["text_field"] = job.text_field
    doc: dict[str, Any] = {
        "name": job.name or default_name(model_type, data),
        "seed": job.seed,
        "model": model,
        "data": tokens,
        "training": {**DEFAULT_TRAINING, **job.training},
    }
    if job.checkpoint is not None:
        doc["checkpoint"] = dict(job.checkpoint)
    if job.needs is not None:
        doc["needs"] = dict(job.needs)
    if job.lora is not None:
        doc["lora"] = dict(job.lora)
    return doc


def prepare_model_job(model: Any, tokenizer: Any, job: ModelJob, folder: Path, weights: bool = True) -> PreparedJob:
    """Write the model's files and its spec into ``folder`` and validate them (``weights=False``: no initial
    weights, e.g. for a quote).

    Error handling: :class:`arceus.errors.UnsupportedModelError` for an architecture or tokenizer Arceus cannot
    train (before any file is written); :class:`arceus.errors.SpecError` for a field the spec checks refuse
    (before the weights are written).
    """
    model_type = hf_files.model_type_of(model)
    hf_files.tokenizer_json(tokenizer)  # refused here, before the folder is touched
    positions = hf_files.positions_of(model)
    hf_files.write_text_files(model, tokenizer, folder)
    doc = spec_doc(job, model_type, positions, weights=False)
    spec = validate(doc, base_dir=folder)
    if weights:  # written once the rest holds; checked against the config as the daemon will
        hf_files.write_weights(model, folder)
        doc = spec_doc(job, model_type, positions, weights=True)
    path = spec_file(doc, folder, base_dir=folder)
    return PreparedJob(folder, path, validate(path) if weights else spec)


__all__ = [
    "DEFAULT_TRAINING",
    "ModelChoices",
    "ModelJob",
    "PreparedJob",
    "default_name",
    "prepare_model_job",
    "spec_doc",
]
