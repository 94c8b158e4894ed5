"""A device's slice of a job's initial weights: which tensors its place reads, their signed digests, the bytes
that travel, and the file the member keeps (torch-free: the daemon runs all of it).

A stock LM's initial weights (``[model] weights``, a safetensors file under the architecture's keys) stay on the
job's owner. When the spec is read there (:mod:`arceusd.jobs.spec.hf`), :func:`digest_file` hashes the file and,
in the same pass, every tensor's raw bytes: the spec's canonical form records ``weights_tensors`` (key ->
``[dtype, sha256]``) beside ``weights_sha256``, so the job's signed identity covers each tensor. A member of a
plan then needs only the tensors its place builds from (:func:`place_keys`: its stage's blocks; a tied head
without block 0 reads the embedding's; a head a tied checkpoint stores no tensor for reads the embedding's):

- the leader serves the raw bytes of those tensors, in the order of :func:`slice_layout`, one after the other
  (:func:`read_slice`: byte ranges of its file, no tensor is decoded);
- the member computes the same layout from what it verified itself (the plan, the signed spec: names, dtypes,
  shapes, hence the exact size), downloads that many bytes, checks every tensor against its signed digest and
  writes a safetensors file of its own (:func:`assemble_slice`: names, dtypes and shapes from the layout,
  never from the peer). A tensor that does not match is refused with one line naming it.

Its worker reads that local file as it would the owner's (:mod:`arceusd.models.hf.weights`); no device but the
owner (and the standby, which keeps a whole copy on disk to lead if the owner dies) holds the whole file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import Shape, block_tensors, expected_tensors, hf_key, untied_head_source
from arceusd.models.hf.weights_check import MAX_HEADER_BYTES, header_of

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
"""The dtypes initial weights may hold (:data:`arceusd.models.hf.weights_check.FLOAT_DTYPES`) and their sizes."""

_READ = 1 << 20

TensorDigests = Mapping[str, tuple[str, str]]
"""A weights file's tensors: checkpoint key -> (dtype, sha256 of its raw bytes, 64 hex characters)."""


class WeightsSliceError(ValueError):
    """A weights file or a served slice does not match the job's signed description; the message is one line."""


@dataclass(frozen=True)
class SliceEntry:
    """One tensor of a slice: its key, dtype, shape, size in bytes and signed digest."""

    key: str
    dtype: str
    shape: Shape
    nbytes: int
    sha256: str


def _header(f: BinaryIO, where: str) -> tuple[dict[str, Any], int]:
    """The safetensors header of the open file (``__metadata__`` dropped) and where its data starts."""
    try:
        return header_of(f, where)
    except ValueError as e:
        raise WeightsSliceError(str(e)) from None


def _span(header: Mapping[str, Any], key: str, where: str) -> tuple[int, int]:
    entry = header.get(key)
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise WeightsSliceError(f"{where}: {key} has no valid data_offsets")
    return offsets[0], offsets[1]


def digest_file(path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """The file's sha256 and every tensor's ``(dtype, sha256 of its bytes)``, in one pass over the file."""
    whole = hashlib.sha256()
    tensors: dict[str, tuple[str, str]] = {}
    with path.open("rb") as f:
        header, start = _header(f, str(path))
        f.seek(0)
        whole.update(f.read(start))
        pos = start
        spans = sorted((_span(header, k, str(path)), k) for k in header)
        for (a, b), key in spans:
            if start + a < pos:
                raise WeightsSliceError(f"{path}: {key} overlaps another tensor")
            _copy(f, start + a - pos, whole)
            part = hashlib.sha256()
            _copy(f, b - a, whole, part)
            pos = start + b
            dtype = header[key].get("dtype")
            tensors[key] = (str(dtype), part.hexdigest())
        while chunk := f.read(_READ):
            whole.update(chunk)
    return whole.hexdigest(), tensors


def _copy(f: BinaryIO, n: int, *hashes: Any) -> None:
    while n > 0:
        chunk = f.read(min(n, _READ))
        if not chunk:
            raise WeightsSliceError(f"{getattr(f, 'name', 'the weights file')} ends inside a tensor")
        for h in hashes:
            h.update(chunk)
        n -= len(chunk)


def place_keys(config: HFModelConfig, start: int, end: int, available: Collection[str]) -> tuple[str, ...]:
    """The file keys that building blocks ``[start, end)`` reads (sorted): each block's own tensors; a head
    whose file stores no ``lm_head.weight`` reads the embedding's; a tied head on a stage without block 0 builds
    block 0 to copy its embedding (:func:`arceusd.models.hf.blocks.tie_hf_blocks`), so reads block 0's too."""
    n = num_hf_blocks(config)
    if not 0 <= start < end <= n:
        raise WeightsSliceError(f"blocks [{start}, {end}) are not a place in a model of {n} blocks")
    blocks = list(range(start, end))
    if config.tied and end == n and start > 0:
        blocks.append(0)
    keys: set[str] = set()
    for index in blocks:
        for local in block_tensors(config, index):
            key = hf_key(config, index, local)
            source = untied_head_source(config, key)
            if key not in available and source is not None and source in available:
                key = source
            if key not in available:
                raise WeightsSliceError(f"the signed weights hold no tensor {key} (block {index})")
            keys.add(key)
    return tuple(sorted(keys))


def slice_layout(config: HFModelConfig, keys: Sequence[str], table: TensorDigests) -> tuple[SliceEntry, ...]:
    """The tensors of ``keys`` as they travel: shapes from the config, dtypes and digests from the signed table."""
    shapes = {k: shape for k, (_, _, shape) in expected_tensors(config).items()}
    out = []
    for key in keys:
        if key not in shapes or key not in table:
            raise WeightsSliceError(f"the signed weights hold no tensor {key}")
        dtype, digest = table[key]
        if dtype not in DTYPE_BYTES:
            raise WeightsSliceError(f"{key} is {dtype}; allowed: {', '.join(DTYPE_BYTES)}")
        count = 1
        for d in shapes[key]:
            count *= d
        out.append(SliceEntry(key, dtype, shapes[key], count * DTYPE_BYTES[dtype], digest))
    return tuple(out)


def slice_size(layout: Sequence[SliceEntry]) -> int:
    """The bytes a slice travels as: its tensors' raw bytes, one after the other."""
    return sum(e.nbytes for e in layout)


def read_slice(path: Path, layout: Sequence[SliceEntry], offset: int, length: int) -> bytes:
    """Leader: bytes ``[offset, offset + length)`` of the slice ``layout`` cut from the weights file ``path``
    (each tensor's byte range as its header places it; a tensor whose dtype or size differs is refused)."""
    out = bytearray()
    with path.open("rb") as f:
        header, start = _header(f, str(path))
        pos = 0
        for e in layout:
            if pos >= offset + length:
                break
            a, b = _span(header, e.key, str(path))
            if b - a != e.nbytes or header[e.key].get("dtype") != e.dtype:
                raise WeightsSliceError(f"{path}: {e.key} is not the tensor the job signed")
            lo, hi = max(offset, pos), min(offset + length, pos + e.nbytes)
            if lo < hi:
                f.seek(start + a + lo - pos)
                piece = f.read(hi - lo)
                if len(piece) != hi - lo:
                    raise WeightsSliceError(f"{path} ends inside {e.key}")
                out += piece
            pos += e.nbytes
    return bytes(out)


def slice_header(layout: Sequence[SliceEntry]) -> bytes:
    """The safetensors header of the file a slice is kept as (its 8-byte length, then the JSON padded to 8 bytes):
    names, dtypes, shapes and offsets from ``layout`` alone; the tensors' bytes follow it in layout order."""
    header: dict[str, Any] = {}
    offset = 0
    for e in layout:
        header[e.key] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def check_slice(data: bytes | memoryview, layout: Sequence[SliceEntry], source: str = "the leader") -> None:
    """Member: check the served bytes tensor by tensor against the signed digests; :class:`WeightsSliceError`
    (one line naming the tensor) when anything differs."""
    if len(data) != slice_size(layout):
        raise WeightsSliceError(
            f"initial weights from {source}: {len(data)} bytes where the signed tensors are {slice_size(layout)}; "
            "refused"
        )
    view, pos = memoryview(data), 0
    for e in layout:
        got = hashlib.sha256(view[pos : pos + e.nbytes]).hexdigest()
        if got != e.sha256:
            raise WeightsSliceError(
                f"initial weights from {source}: tensor {e.key} does not match the job's signed digest "
                f"(sha256 {got[:16]}..., signed {e.sha256[:16]}...); refused"
            )
        pos += e.nbytes


def assemble_slice(data: bytes, layout: Sequence[SliceEntry], source: str = "the leader") -> bytes:
    """:func:`check_slice`, then the safetensors file the worker reads (:func:`slice_header` and the bytes)."""
    check_slice(data, layout, source)
    return slice_header(layout) + bytes(data)


def slice_file_matches(path: Path, layout: Sequence[SliceEntry]) -> bool:
    """Whether ``path`` is exactly the file :func:`assemble_slice` makes of ``layout`` (a slice kept from an
    earlier plan of the same place is used again, never trusted unchecked)."""
    try:
        if os.path.getsize(path) > MAX_HEADER_BYTES + 8 + slice_size(layout):
            return False
        with path.open("rb") as f:
            raw = f.read()
        _, start = _header(io.BytesIO(raw), str(path))
        return assemble_slice(raw[start:], layout) == raw
    except (OSError, WeightsSliceError):
        return False


__all__ = [
    "DTYPE_BYTES",
    "SliceEntry",
    "TensorDigests",
    "WeightsSliceError",
    "assemble_slice",
    "check_slice",
    "digest_file",
    "place_keys",
    "read_slice",
    "slice_file_matches",
    "slice_header",
    "slice_layout",
    "slice_size",
]
