"""Resuming a job on a new plan: the leader's checkpoint-to-slices step and the resume description on the wire.

When the leader repartitions (a member died or left, a worker was lost, a device joined), every worker of the
new plan must start from the newest *verified* checkpoint. The leader holds a copy of every shard (they are
copied to it at commit), so it:

1. loads the newest committed step whose signed manifest and shard hashes verify (:func:`load_latest`; a shard
   that is corrupt in the leader's copy is taken from a replica root, see :func:`corrupt_shards`),
2. gathers the full training state (parameters and optimizer buffers) and cuts each new worker's slice
   (:mod:`arceusd.jobs.procs.reslice`),
3. writes one file per worker under ``<job>/resume/epoch-<E>/`` and describes them in :class:`ResumePoint`,
   which travels in ``JobStart.resume``; members fetch their own file and check its hash before use.

The sampler cursor of the checkpoint goes to the owner's worker, which serves the data. File work only; the
caller runs these functions in a thread.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arceusd.base.atomic_files import atomic_write
from arceusd.files.checkpoint import (
    SHARD_NAME,
    CheckpointError,
    ShardRecord,
    committed_steps,
    file_matches,
    load_latest,
    matches,
    read_manifest,
    step_dir,
)
from arceusd.jobs.plans.job_paths import JobPaths
from arceusd.models.config import ModelConfig
from arceusd.worker.protocol import StageConfig


class ResumeError(ValueError):
    """A resume description from the leader is malformed; the message names the field."""


@dataclass(frozen=True)
class ResumeFile:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ResumePoint:
    """Where a new plan epoch starts: the checkpoint step, the sampler cursor and each worker's state file."""

    step: int
    files: Mapping[str, ResumeFile]  # peer id -> its slice
    cursor: Mapping[str, Any] | None = None
    directory: Path = field(default=Path("."))

    def to_wire(self) -> bytes:
        body = {"step": self.step, "files": {p: [f.name, f.sha256, f.size] for p, f in sorted(self.files.items())}}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_wire(data: bytes) -> ResumePoint | None:
        """``None`` for an empty description (a fresh start); :class:`ResumeError` for a malformed one."""
        if not data:
            return None
        try:
            body = json.loads(data)
            step = body["step"]
            files = {str(p): ResumeFile(str(n), str(h), int(s)) for p, (n, h, s) in dict(body["files"]).items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ResumeError(f"malformed resume description: {exc}") from None
        if not isinstance(step, int) or step < 0:
            raise ResumeError(f"resume step must be a non-negative integer, got {step!r}")
        for f in files.values():
            if not SHARD_NAME.match(f.name) or f.size < 0 or len(f.sha256) != 64:
                raise ResumeError(f"malformed resume file entry {f}")
        return ResumePoint(step, files)


def file_name(stage: int, rank: int) -> str:
    return f"stage{stage}-rank{rank}.safetensors"


def corrupt_shards(root: Path, trusted: Iterable[str]) -> tuple[int, list[ShardRecord]]:
    """The newest committed step under ``root`` and those of its shards whose local copy is missing or does not
    match the manifest (they must come from a replica). ``(0, [])`` when nothing is committed."""
    trusted = list(trusted)
    for step in reversed(committed_steps(root)):
        try:
            manifest, _ = read_manifest(step_dir(root, step), trusted)
        except CheckpointError:
            continue
        return step, [r for r in manifest.shards if not file_matches(step_dir(root, step) / r.name, r)]
    return 0, []


def prepare_resume(
    job_dir: Path,
    model: ModelConfig,
    stages: Sequence[StageConfig],
    epoch: int,
    trusted: Iterable[str],
    replica_roots: Sequence[Path] = (),
    other_replicas: Sequence[Sequence[StageConfig]] = (),
) -> ResumePoint | None:
    """Slice the newest verified checkpoint for ``stages``; ``None`` when no checkpoint verifies (start fresh).
    ``other_replicas``: the stages of the plan's other data-parallel replicas, cut alike: each of their devices
    gets the slice of the same place in ``stages`` (the same file).

    Error handling: :class:`arceusd.jobs.procs.reslice.ResliceError` when the checkpoint's shards do not make a whole
    model (cannot happen for a manifest we committed ourselves, short of a bug).
    """
    import torch  # this and the two below load torch: run in a child (arceusd.jobs.procs.filework)

    from arceusd.files.safetensors_io import save_bytes  # torch
    from arceusd.jobs.procs.reslice import full_state, slice_state  # torch

    loaded = load_latest([job_dir / "checkpoints", *replica_roots], trusted)
    if loaded is None:
        return None
    full = full_state(model, [(loaded.metadata[n], loaded.shards[n]) for n in sorted(loaded.shards)])
    step = loaded.manifest.step
    for key, tensor in full.items():  # every slice is cut from these: checked once here, not each slice again
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ResumeError(f"checkpoint {step} holds non-finite values ({key}); not resuming from it")
    out = JobPaths(job_dir).resume(epoch)
    if out.exists():
        shutil.rmtree(out)
    files: dict[str, ResumeFile] = {}
    for s, stage in enumerate(stages):
        for r, member in enumerate(stage.members):
            tensors = slice_state(model, full, stage, r)
            data = save_bytes(tensors, {"step": str(step), "stage": str(s), "rank": str(r)})
            name = file_name(s, r)
            atomic_write(out / name, data)
            files[member.peer_id] = ResumeFile(name, hashlib.sha256(data).hexdigest(), len(data))
    for replica in other_replicas:
        for stage, first in zip(replica, stages, strict=True):
            for member, same_place in zip(stage.members, first.members, strict=True):
                files[member.peer_id] = files[same_place.peer_id]
    for old in (job_dir / "resume").iterdir():
        if old != out and old.name.startswith("epoch-"):
            shutil.rmtree(old, ignore_errors=True)
    cursor = loaded.manifest.extra.get("cursor")
    return ResumePoint(step, files, cursor if isinstance(cursor, dict) else None, out)


def check_file(data: bytes, expected: ResumeFile) -> None:
    """Member side: the fetched slice must be exactly the one the leader described."""
    if not matches(data, expected):
        raise ResumeError(f"resume file {expected.name} does not match the leader's description (size or hash)")


__all__ = [
    "ResumeError",
    "ResumeFile",
    "ResumePoint",
    "check_file",
    "corrupt_shards",
    "file_name",
    "prepare_resume",
]
