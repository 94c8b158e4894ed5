"""Checkpoints: safetensors shards plus a signed manifest, written atomically and verified before use.

Layout under a checkpoint root (one per job): ``step-<S>/<shard>.safetensors`` and ``step-<S>/manifest.json``.
A step exists only once its manifest is committed: the two-phase protocol is (1) every stage writes its shard(s)
with :func:`write_shard` and reports ``(name, sha256, size)``, (2) the leader calls :func:`commit_manifest`, which
signs ``(job, term, epoch, step, shard hashes, extra state)`` with its Ed25519 key. Loading
(:func:`load_latest`) picks the newest step whose manifest signature verifies against a trusted key and whose
shards hash correctly, looking in replica roots when a local shard is missing or corrupt. Nothing is unpickled:
shards are safetensors and the manifest is JSON.

Every write is atomic: temporary file, fsync, rename, fsync of the directory. Only the newest ``keep`` committed
steps are kept; uncommitted step folders older than the newest committed step are removed with them.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from safetensors import SafetensorError

from arceusd.base.atomic_files import atomic_write
from arceusd.base.identity import Identity, peer_id_from_public_key, verify_signature

if TYPE_CHECKING:  # torch is loaded by the functions that read or write tensors (workers, child processes):
    import torch  # the daemon uses the manifests and files only, and never imports torch

MANIFEST_NAME = "manifest.json"
DOMAIN = b"arceus/checkpoint-manifest/v1\x00"
_STEP_DIR = re.compile(r"^step-(\d{10})$")
SHARD_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}\.safetensors$")
"""What a shard (or resume slice) file may be called: a plain file name, no path."""


def shard_file_name(stage: int, rank: int) -> str:
    """The file name of the shard that the device at ``(stage, rank)`` of a plan writes: derived from the plan
    on every side (the worker that writes it, the leader that copies it), never taken from a report."""
    return f"stage{int(stage)}-rank{int(rank)}.safetensors"


class CheckpointError(Exception):
    """A checkpoint cannot be written or used; the message says which file and why."""


@dataclass(frozen=True)
class ShardRecord:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    job_id: str
    term: int
    epoch: int
    step: int
    shards: tuple[ShardRecord, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def canonical(self) -> bytes:
        body = {
            "job_id": self.job_id,
            "term": self.term,
            "epoch": self.epoch,
            "step": self.step,
            "shards": [[s.name, s.sha256, s.size] for s in sorted(self.shards, key=lambda s: s.name)],
            "extra": self.extra,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:010d}"


def write_shard(
    root: Path, step: int, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> ShardRecord:
    """Phase one: write one shard of step ``step`` atomically and return its record for the manifest."""
    if not SHARD_NAME.match(name):
        raise CheckpointError(f"shard name {name!r} must match {SHARD_NAME.pattern}")
    from arceusd.files.safetensors_io import save_bytes as st_save  # torch: child processes only

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    data = st_save(cpu, metadata=dict(metadata or {}))
    atomic_write(step_dir(root, step) / name, data, failpoint="checkpoint.before-rename")
    return ShardRecord(name, hashlib.sha256(data).hexdigest(), len(data))


def commit_manifest(root: Path, manifest: Manifest, signer: Identity, keep: int = 3) -> Path:
    """Phase two: check that every listed shard is present and intact, sign and write the manifest, prune.

    Error handling: :class:`CheckpointError` when a shard is missing or does not match its record; nothing is
    committed then.
    """
    directory = step_dir(root, manifest.step)
    for shard in manifest.shards:
        if not SHARD_NAME.match(shard.name):  # a name is a file in the step's folder, never a path
            raise CheckpointError(f"shard name {shard.name[:80]!r} must match {SHARD_NAME.pattern}; not committed")
        _check_shard(directory / shard.name, shard)
    body = manifest.canonical()
    envelope = {
        "manifest": json.loads(body),
        "signer": signer.public_key_raw.hex(),
        "signature": signer.sign(DOMAIN + body).hex(),
    }
    path = directory / MANIFEST_NAME
    atomic_write(path, json.dumps(envelope, sort_keys=True, indent=1).encode())
    prune(root, keep)
    return path


class Described(Protocol):
    """Anything that states a file's size and sha256 (a shard record, a resume slice)."""

    @property
    def size(self) -> int: ...
    @property
    def sha256(self) -> str: ...


def matches(data: bytes, record: Described) -> bool:
    """Whether ``data`` is exactly the file ``record`` describes (size and sha256)."""
    return len(data) == record.size and hashlib.sha256(data).hexdigest() == record.sha256


def file_matches(path: Path, record: Described) -> bool:
    """:func:`matches` for a file on disk; False when it cannot be read."""
    try:
        return matches(path.read_bytes(), record)
    except OSError:
        return False


def _check_shard(path: Path, record: ShardRecord) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"shard {path} cannot be read: {exc.strerror}") from None
    if not matches(data, record):
        raise CheckpointError(f"shard {path} does not match its manifest (size or sha256 differ): corrupt")
    return data


def read_manifest(directory: Path, trusted_signers: Iterable[str]) -> tuple[Manifest, str]:
    """The verified manifest in ``directory`` and its signer's peer id.

    ``trusted_signers`` are peer ids whose signatures we accept (the job's members).
    Error handling: :class:`CheckpointError` for a missing, malformed, untrusted or forged manifest.
    """
    path = directory / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing (step not committed)") from None
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read: {exc.strerror}") from None
    return parse_manifest(data, trusted_signers, str(path))


def parse_manifest(data: bytes, trusted_signers: Iterable[str], where: str = "manifest") -> tuple[Manifest, str]:
    """:func:`read_manifest` for manifest bytes (e.g. a copy that came over the network); ``where`` names them
    in errors."""
    path = where
    try:
        envelope = json.loads(data)
        raw = envelope["manifest"]
        signer_pub = bytes.fromhex(envelope["signer"])
        signature = bytes.fromhex(envelope["signature"])
        manifest = Manifest(
            job_id=str(raw["job_id"]),
            term=int(raw["term"]),
            epoch=int(raw["epoch"]),
            step=int(raw["step"]),
            shards=tuple(ShardRecord(str(n), str(h), int(s)) for n, h, s in raw["shards"]),
            extra=dict(raw["extra"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is malformed: {exc}") from None
    signer = peer_id_from_public_key(signer_pub) if len(signer_pub) == 32 else "?"
    if signer not in set(trusted_signers):
        raise CheckpointError(f"{path} is signed by {signer}, who is not a trusted member of this job")
    if not verify_signature(signer_pub, signature, DOMAIN + manifest.canonical()):
        raise CheckpointError(f"{path} has an invalid signature: forged or corrupt")
    for shard in manifest.shards:
        if not SHARD_NAME.match(shard.name):
            raise CheckpointError(f"{path} names an invalid shard {shard.name!r}")
    return manifest, signer


def committed_steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / MANIFEST_NAME).exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` committed steps; drop older ones and stale uncommitted step folders."""
    steps = committed_steps(root)
    if not steps:
        return
    keep_set = set(steps[-keep:])
    newest = steps[-1]
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if not m:
            continue
        step = int(m.group(1))
        if step in keep_set or step > newest:
            continue
        shutil.rmtree(child, ignore_errors=True)


@dataclass(frozen=True)
class LoadedCheckpoint:
    manifest: Manifest
    signer: str
    shards: dict[str, dict[str, torch.Tensor]]
    used_replica: bool
    metadata: dict[str, dict[str, str]] = field(default_factory=dict)
    """Each shard's safetensors metadata (its stage, rank and split)."""


def load_step(
    roots: Sequence[Path], step: int, trusted_signers: Iterable[str], wanted: Iterable[str] | None = None
) -> LoadedCheckpoint:
    """Load step ``step``: manifest from the first root that has a valid one; each wanted shard from the first
    root where it hashes correctly (so a corrupt local shard falls back to a replica)."""
    from arceusd.files.safetensors_io import SafetensorsHeaderError, read_metadata  # torch: child processes only
    from arceusd.files.safetensors_io import load_bytes as st_load  # torch

    trusted = list(trusted_signers)
    errors: list[str] = []
    for root in roots:
        try:
            manifest, signer = read_manifest(step_dir(root, step), trusted)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        names = set(wanted) if wanted is not None else {s.name for s in manifest.shards}
        records = {s.name: s for s in manifest.shards}
        missing = names - set(records)
        if missing:
            raise CheckpointError(f"step {step} has no shard(s) {sorted(missing)}")
        shards: dict[str, dict[str, torch.Tensor]] = {}
        metadata: dict[str, dict[str, str]] = {}
        used_replica = False
        for name in sorted(names):
            for i, candidate_root in enumerate(roots):
                try:
                    data = _check_shard(step_dir(candidate_root, step) / name, records[name])
                    shards[name] = st_load(data)
                    metadata[name] = read_metadata(data)
                except (CheckpointError, SafetensorError, SafetensorsHeaderError) as exc:
                    errors.append(str(exc))
                    continue
                used_replica = used_replica or candidate_root != root or i > 0
                break
            else:
                raise CheckpointError(f"no intact copy of shard {name} of step {step}: " + "; ".join(errors[-3:]))
        return LoadedCheckpoint(manifest, signer, shards, used_replica, metadata)
    raise CheckpointError(f"no valid manifest for step {step}: " + "; ".join(errors))


def load_latest(
    roots: Sequence[Path], trusted_signers: Iterable[str], wanted: Iterable[str] | None = None
) -> LoadedCheckpoint | None:
    """The newest step that loads and verifies from any root, or None when there is none."""
    trusted = list(trusted_signers)
    steps = sorted({s for root in roots for s in committed_steps(root)}, reverse=True)
    for step in steps:
        try:
            return load_step(roots, step, trusted, wanted)
        except CheckpointError:
            continue
    return None
