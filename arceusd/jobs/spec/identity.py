"""A job spec's identity: its canonical form (:func:`to_dict`, :func:`canonical_json`), its hash
(:func:`spec_hash`) and a job's id (:func:`job_id`). See :mod:`arceusd.jobs.spec.schema`'s docstring for the rules.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from arceusd.jobs.spec.hf import hf_model_dict, tokens_dict
from arceusd.jobs.spec.lora import lora_dict
from arceusd.jobs.spec.parsed import (
    SPEC_VERSION,
    DiLoCoSpec,
    JobSpec,
    MnistDataSpec,
    NeedsSpec,
    TokensDataSpec,
)
from arceusd.models.config import MLPConfig
from arceusd.models.hf.config import HFModelConfig

_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_PEER_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def to_dict(spec: JobSpec) -> dict[str, Any]:
    """The spec as plain JSON/msgpack-able data in the input schema; :func:`spec_from_dict` reads it back."""
    model: dict[str, Any]
    if isinstance(spec.model, MLPConfig):
        model = {"type": "mlp", "layer_sizes": list(spec.model.layer_sizes)}
    elif isinstance(spec.model, HFModelConfig):
        model = hf_model_dict(spec.model)
    else:
        m = spec.model
        model = {
            "type": "gpt",
            "n_layer": m.n_layer,
            "n_head": m.n_head,
            "n_embd": m.n_embd,
            "block_size": m.block_size,
            "vocab_size": m.vocab_size,
            "dropout": m.dropout,
            "bias": m.bias,
        }
    d = spec.data
    data: dict[str, Any]
    if isinstance(d, MnistDataSpec):
        data = {
            "kind": "mnist",
            "dir": d.dir,
            "train_count": d.train_count,
            "holdout_count": d.holdout_count,
            "mean": d.mean,
            "std": d.std,
            "split_seed": d.split_seed,
            "images": d.images,
            "labels": d.labels,
            "sha256": d.sha256,
        }
    elif isinstance(d, TokensDataSpec):
        data = tokens_dict(d)
    else:
        data = {"kind": "text", "path": d.path, "val_fraction": d.val_fraction, "sha256": d.sha256}
    t = spec.training
    training: dict[str, Any] = {
        "steps": t.steps,
        "epochs": t.epochs,
        "batch_size": t.batch_size,
        "micro_batches": t.micro_batches,
        "optimizer": t.optimizer,
        "lr": t.lr,
        "weight_decay": t.weight_decay,
        "warmup_steps": t.warmup_steps,
        "lr_decay": t.lr_decay,
        "min_lr": t.min_lr,
        "grad_clip": t.grad_clip,
        "precision": t.precision,
        "compression": t.compression,
        "schedule": t.schedule,
        "eval_interval_steps": t.eval_interval_steps,
        "eval_iters": t.eval_iters,
    }
    if t.optimizer == "sgd":
        training["momentum"] = t.momentum
    else:
        training["betas"] = list(t.betas)
    if t.compression == "topk":
        training["topk_fraction"] = t.topk_fraction
    # the replica keys only when set: a spec without them keeps the hash it had before they existed
    if t.replicas != 1:
        training["replicas"] = t.replicas
    if t.sync != "auto":
        training["sync"] = t.sync
    if t.use_all_devices:
        training["use_all_devices"] = True
    if t.diloco != DiLoCoSpec():
        dl = t.diloco
        training["diloco"] = {
            "inner_steps": dl.inner_steps,
            "outer_lr": dl.outer_lr,
            "outer_momentum": dl.outer_momentum,
            "compression": dl.compression,
        }
    admission: dict[str, Any] = {"mode": spec.admission.mode}
    if spec.admission.mode == "allowlist":
        admission["peers"] = list(spec.admission.peers)
    out: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "name": spec.name,
        "seed": spec.seed,
        "model": model,
        "data": {k: v for k, v in data.items() if v is not None},
        "training": {k: v for k, v in training.items() if v is not None},
        "checkpoint": {"interval_steps": spec.checkpoint.interval_steps, "keep": spec.checkpoint.keep},
        "admission": admission,
    }
    if isinstance(spec.model, HFModelConfig) and spec.model.lora is not None:
        out["lora"] = lora_dict(spec.model.lora)
    if spec.needs != NeedsSpec():  # a spec without needs keeps the hash it had before [needs] existed
        n = spec.needs
        out["needs"] = {
            "memory_total_mib": n.memory_total_mib,
            "memory_per_device_mib": n.memory_per_device_mib,
            "device_kinds": list(n.device_kinds),
            "min_members": n.min_members,
            "max_members": n.max_members,
            "deadline_hours": n.deadline_hours,
            "max_price_per_hour": n.max_price_per_hour,
            "budget_usd": n.budget_usd,
        }
    return out


def canonical_json(spec: JobSpec) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no NaN: the same spec gives the same bytes on every machine."""
    text = json.dumps(to_dict(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def spec_hash(spec: JobSpec) -> str:
    """sha256 of :func:`canonical_json`, 64 hex characters."""
    return hashlib.sha256(canonical_json(spec)).hexdigest()


def job_id(spec_hash_hex: str, owner_peer_id: str, nonce: bytes) -> str:
    """The job id (32 hex characters): see the module docstring. ``nonce``: 16-64 fresh random bytes from the
    submitter (e.g. ``secrets.token_bytes(16)``), so resubmitting the same spec makes a new job."""
    if not _HEX64_RE.match(spec_hash_hex):
        raise ValueError(f"spec hash must be 64 lowercase hex characters, got {spec_hash_hex!r}")
    if not _PEER_ID_RE.match(owner_peer_id):
        raise ValueError(f"owner peer id must be 32 lowercase hex characters, got {owner_peer_id!r}")
    if not 16 <= len(nonce) <= 64:
        raise ValueError(f"nonce must be 16 to 64 bytes, got {len(nonce)}")
    h = hashlib.sha256(b"arceus-job-id-v1\x00" + bytes.fromhex(spec_hash_hex) + bytes.fromhex(owner_peer_id) + nonce)
    return h.digest()[:16].hex()


__all__ = ["canonical_json", "job_id", "spec_hash", "to_dict"]
