"""Where a job's initial weights are on each device, and which part of them each device needs (torch-free).

A stock LM's spec may name initial weights (``[model] weights``, relative to the spec's folder on the job's
owner). The owner's worker reads that file directly; so does the worker of a LoRA job's standby that took over,
from the whole copy it keeps (``<job>/weights/model.safetensors``, copied with the data at the first checkpoint
it stands by for and checked against the signed ``weights_sha256``; :func:`standby_copies`: a standby takes over
from a committed checkpoint, so only a frozen base is still needed then). Every other member holds only its
place's tensors (a tensor-parallel rank: only its shards of the split ones): at each plan's start it fetches them
from the leader
(:meth:`arceusd.jobs.common.transfers.Transfers.fetch_weights`), checks each against the digests the signed spec records
(``weights_tensors``, :mod:`arceusd.models.hf.weights_slice`) and keeps them as
``<job>/weights/blocks-<start>-<end>.safetensors``; its worker reads that file. A start that resumes from a
checkpoint needs no initial weights (the checkpoint holds every trained tensor), except in a LoRA job, whose
frozen base is rebuilt from them every time.

File names here are this device's own (from block indices it verified), never a peer's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arceusd.jobs.plans.job_paths import JobPaths
from arceusd.jobs.plans.planning import worker_stages
from arceusd.jobs.spec.parsed import resolve_path
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.weights_check import MAX_HEADER_BYTES
from arceusd.models.hf.weights_slice import SliceEntry, WeightsSliceError, place_keys, slice_layout, slice_size

if TYPE_CHECKING:
    from partitioner import ReplicaPlan

"""The standby's whole copy of the owner's weights file (what it serves and reads if it takes over)."""


def weights_model(model: object) -> HFModelConfig | None:
    """The job's model when it has initial weights (with their signed tensor digests), else None."""
    if isinstance(model, HFModelConfig) and model.weights is not None and model.weights_tensors is not None:
        return model
    return None


def needs_weights(model: object, resuming: bool) -> bool:
    """Whether a worker must read initial weights: a fresh start, or any start of a LoRA job (its frozen base)."""
    m = weights_model(model)
    return m is not None and (not resuming or m.lora is not None)


def standby_copies(model: object) -> bool:
    """Whether the standby keeps a whole copy of the weights: only where a leader that took over (always from a
    committed checkpoint) still needs them, a LoRA job's frozen base (its members' starts, the merged export)."""
    return needs_weights(model, resuming=True)


def leader_weights(job_dir: Path, owner: bool, model: object, base_dir: Path | None) -> Path | None:
    """The whole weights file a leader serves slices of and its own worker reads: the owner's at the spec's
    path, a standby's checked copy once it has one; None when this device holds none."""
    m = weights_model(model)
    if m is None or m.weights is None:
        return None
    if owner:
        return resolve_path(m.weights, base_dir).resolve()
    path = JobPaths(job_dir).weights_copy
    return path if path.is_file() else None


@dataclass(frozen=True)
class Place:
    """A device's place in a plan: its stage's blocks ``[start, end)`` and, on a tensor-parallel stage, the split
    (key/value heads and MLP columns per rank, as the worker's ``TPSplit``) and its rank in it."""

    start: int
    end: int
    split: tuple[tuple[int, ...], tuple[int, ...], int] | None = None


def place_of(replica_plan: ReplicaPlan, peer: str) -> Place | None:
    """``peer``'s place in the plan (any replica; the split as :func:`worker_stages` gives its worker), or None."""
    for the_plan in replica_plan.replicas:
        for stage in worker_stages(the_plan):
            ids = [m.peer_id for m in stage.members]
            if peer in ids:
                split = stage.split()
                if split is None:
                    return Place(int(stage.start), int(stage.end))
                return Place(int(stage.start), int(stage.end), (split.heads, split.columns, ids.index(peer)))
    return None


def place_layout(model: object, place: Place) -> tuple[SliceEntry, ...]:
    """The tensors (signed dtypes, digests; shapes from the config) the blocks of ``place`` are built from; a
    tensor-parallel rank's split tensors as its shards (:mod:`arceusd.models.hf.weights_slice`)."""
    m = weights_model(model)
    if m is None or m.weights_tensors is None:
        raise WeightsSliceError("the job has no signed initial weights")
    table = {k: (d, h) for k, d, h in m.weights_tensors}
    return slice_layout(m, place_keys(m, place.start, place.end, table), table, place.split)


def whole_limit(model: object) -> int:
    """At most how many bytes the whole weights file is: its tensors as signed, and a bounded header."""
    m = weights_model(model)
    if m is None or m.weights_tensors is None:
        return 0
    table = {k: (d, h) for k, d, h in m.weights_tensors}
    return 8 + MAX_HEADER_BYTES + slice_size(slice_layout(m, sorted(table), table))


def write_parts(path: Path, parts: tuple[bytes | memoryview, ...]) -> None:
    """Write ``parts`` one after the other to ``path`` atomically (a slice's header, then its bytes as they came:
    no second copy of them in memory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def worker_spec_weights(spec_dict: dict[str, Any], path: Path | None) -> None:
    """Point the worker's spec at the weights file it reads, or drop the weights when it reads none."""
    model = spec_dict.get("model")
    if not isinstance(model, dict) or "weights" not in model:
        return
    if path is None:
        for key in ("weights", "weights_sha256", "weights_tensors"):
            model.pop(key, None)
    else:
        model["weights"] = str(path)


__all__ = [
    "Place",
    "leader_weights",
    "needs_weights",
    "place_layout",
    "place_of",
    "standby_copies",
    "weights_model",
    "whole_limit",
    "worker_spec_weights",
    "write_parts",
]
