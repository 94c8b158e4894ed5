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

A tensor a tensor-parallel split cuts (:mod:`arceusd.models.hf.weights_chunks`: q/k/v/o by heads, the MLP by
column blocks) is signed as the root of its chunks' digests. A pipeline stage still receives it whole (and
checks the root of the chunks it hashes itself); a rank of a split stage (``split`` of :func:`slice_layout`)
receives, for each such tensor, its chunk digests (checked against the signed root; their count from the config)
and then only the chunks that cover its heads or columns, checks each, and keeps just its shard, in the shape
its split layer holds. Only whole tensors are ever kept for the embedding, norms and head.

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
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import Shape, block_tensors, expected_tensors, hf_key, untied_head_source
from arceusd.models.hf.weights_check import MAX_HEADER_BYTES, header_of
from arceusd.models.hf.weights_chunks import (
    DIGEST_BYTES,
    ChunkError,
    Chunking,
    assemble_shard,
    check_chunk_digests,
    chunk_digests,
    chunking,
    chunks_root,
    rank_ranges,
    read_chunk,
    shard_shape,
)

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
"""The dtypes initial weights may hold (:data:`arceusd.models.hf.weights_check.FLOAT_DTYPES`) and their sizes."""

_READ = 1 << 20

TensorDigests = Mapping[str, tuple[str, str]]
"""A weights file's tensors: checkpoint key -> (dtype, digest, 64 hex characters): the sha256 of its raw bytes, or
for a tensor a tensor-parallel split cuts, :func:`arceusd.models.hf.weights_chunks.chunks_root` of its chunks."""

RankSplit = tuple[Sequence[int], Sequence[int], int]
"""A tensor-parallel rank's place in its stage's split: key/value heads and MLP columns per rank, its rank."""


class WeightsSliceError(ChunkError):
    """A weights file or a served slice does not match the job's signed description; the message is one line."""


@dataclass(frozen=True)
class SliceEntry:
    """One tensor of a slice: its key, dtype, shape (whole), size in bytes as it travels and signed digest;
    ``chunks`` when a split cuts it (its digest is then its chunks' root), ``ranges`` (along the split dimension)
    when this device is a rank that receives only its shard: the chunk digests, then the chunks covering them."""

    key: str
    dtype: str
    shape: Shape
    nbytes: int
    sha256: str
    chunks: Chunking | None = None
    ranges: tuple[tuple[int, int], ...] = ()

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kept_shape(self) -> Shape:
        """The shape the member keeps: its shard's, or the whole tensor's."""
        return shard_shape(self.chunks, self.ranges) if self.chunks is not None and self.ranges else self.shape

    @property
    def kept_nbytes(self) -> int:
        n = self.itemsize
        for d in self.kept_shape:
            n *= d
        return n

    def pieces(self) -> tuple[tuple[int | None, int], ...]:
        """How a shard entry travels: (None, the digest list's size), then (chunk index, its size) per chunk."""
        assert self.chunks is not None
        c = self.chunks
        wanted = c.covering(self.ranges)
        return ((None, c.count * DIGEST_BYTES), *((i, c.chunk_nbytes(i, self.itemsize)) for i in wanted))


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


def digest_file(path: Path, config: HFModelConfig) -> tuple[str, dict[str, tuple[str, str]]]:
    """The file's sha256 and every tensor's ``(dtype, digest)``, in one pass over the file: the sha256 of its
    bytes, or the root of its chunks' for a tensor a split cuts (:func:`arceusd.models.hf.weights_chunks.chunking`
    of ``config``)."""
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
            dtype = str(header[key].get("dtype"))
            c = chunking(config, key)
            if c is None or dtype not in DTYPE_BYTES:
                part = hashlib.sha256()
                _copy(f, b - a, whole, part)
                digest = part.hexdigest()
            else:
                digest = _chunked_digest(f, c, DTYPE_BYTES[dtype], b - a, whole, f"{path}: {key}")
            pos = start + b
            tensors[key] = (dtype, digest)
        while chunk := f.read(_READ):
            whole.update(chunk)
    return whole.hexdigest(), tensors


def _chunked_digest(f: BinaryIO, c: Chunking, itemsize: int, size: int, whole: Any, where: str) -> str:
    """The root of the chunks of the tensor at ``f``'s position (``size`` bytes), fed to ``whole`` as read."""
    unit = c.inner * itemsize
    widths = [(c.bounds[i + 1] - c.bounds[i]) * unit for i in range(c.count)]
    if c.outer * sum(widths) != size:
        raise WeightsSliceError(f"{where} is {size} bytes, not a tensor of shape {list(c.shape)}")
    parts = [hashlib.sha256() for _ in widths]
    slab = sum(widths)
    for _ in range(c.outer):
        if slab > _READ:
            for part, width in zip(parts, widths, strict=True):
                _copy(f, width, whole, part)
            continue
        row = f.read(slab)  # one read per row of a tensor cut along its columns
        if len(row) != slab:
            raise WeightsSliceError(f"{where}: the file ends inside the tensor")
        whole.update(row)
        view, at = memoryview(row), 0
        for part, width in zip(parts, widths, strict=True):
            part.update(view[at : at + width])
            at += width
    return chunks_root([p.hexdigest() for p in parts])


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


def slice_layout(
    config: HFModelConfig, keys: Sequence[str], table: TensorDigests, split: RankSplit | None = None
) -> tuple[SliceEntry, ...]:
    """The tensors of ``keys`` as they travel: shapes and chunks from the config, dtypes and digests from the
    signed table; with ``split`` (a tensor-parallel rank's), each tensor a split cuts travels as its shard."""
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
        entry = SliceEntry(key, dtype, shapes[key], count * DTYPE_BYTES[dtype], digest, chunking(config, key))
        if split is not None and entry.chunks is not None:
            kv_heads, columns, rank = split
            ranges = rank_ranges(entry.chunks.by, config, kv_heads, columns, rank)
            entry = replace(entry, ranges=ranges)
            entry = replace(entry, nbytes=sum(n for _, n in entry.pieces()))
        out.append(entry)
    return tuple(out)


def slice_size(layout: Sequence[SliceEntry]) -> int:
    """The bytes a slice travels as: its tensors' raw bytes (a shard's: chunk digests and chunks), in order."""
    return sum(e.nbytes for e in layout)


@lru_cache(maxsize=1024)
def _file_chunk_digests(path: str, stamp: tuple[int, int], start: int, c: Chunking, itemsize: int) -> tuple[str, ...]:
    """The chunk digests of the tensor at ``start`` in ``path`` (as of ``stamp``: its size and mtime), read once
    per tensor while the file stays the same (every piece a rank asks for needs the tensor's list)."""
    del stamp  # part of the cache key only
    with open(path, "rb") as f:
        return tuple(hashlib.sha256(read_chunk(f, start, c, i, itemsize)).hexdigest() for i in range(c.count))


def _travel_bytes(f: BinaryIO, path: Path, e: SliceEntry, at: int, lo: int, hi: int) -> bytes:
    """Bytes ``[lo, hi)`` of shard entry ``e`` as it travels, its tensor's raw bytes starting at ``at``."""
    assert e.chunks is not None
    out, pos = bytearray(), 0
    for index, n in e.pieces():
        if pos < hi and lo < pos + n:
            if index is None:
                st = os.stat(path)
                digests = _file_chunk_digests(str(path), (st.st_size, st.st_mtime_ns), at, e.chunks, e.itemsize)
                piece = b"".join(bytes.fromhex(d) for d in digests)
            else:
                piece = read_chunk(f, at, e.chunks, index, e.itemsize)
            out += piece[max(lo - pos, 0) : hi - pos]
        pos += n
    return bytes(out)


def read_slice(path: Path, layout: Sequence[SliceEntry], offset: int, length: int) -> bytes:
    """Leader: bytes ``[offset, offset + length)`` of the slice ``layout`` cut from the weights file ``path``
    (each tensor's byte range as its header places it; a shard: its chunk digests, then its chunks; a tensor
    whose dtype or size differs is refused)."""
    out = bytearray()
    with path.open("rb") as f:
        header, start = _header(f, str(path))
        pos = 0
        for e in layout:
            if pos >= offset + length:
                break
            a, b = _span(header, e.key, str(path))
            if b - a != _whole_nbytes(e) or header[e.key].get("dtype") != e.dtype:
                raise WeightsSliceError(f"{path}: {e.key} is not the tensor the job signed")
            lo, hi = max(offset, pos), min(offset + length, pos + e.nbytes)
            if lo < hi and e.ranges:
                out += _travel_bytes(f, path, e, start + a, lo - pos, hi - pos)
            elif lo < hi:
                f.seek(start + a + lo - pos)
                piece = f.read(hi - lo)
                if len(piece) != hi - lo:
                    raise WeightsSliceError(f"{path} ends inside {e.key}")
                out += piece
            pos += e.nbytes
    return bytes(out)


def _whole_nbytes(e: SliceEntry) -> int:
    n = e.itemsize
    for d in e.shape:
        n *= d
    return n


def slice_header(layout: Sequence[SliceEntry]) -> bytes:
    """The safetensors header of the file a slice is kept as (its 8-byte length, then the JSON padded to 8 bytes):
    names, dtypes, shapes (a rank's shard's) and offsets from ``layout`` alone; the tensors' bytes follow it in
    layout order."""
    header: dict[str, Any] = {}
    offset = 0
    for e in layout:
        header[e.key] = {
            "dtype": e.dtype,
            "shape": list(e.kept_shape),
            "data_offsets": [offset, offset + e.kept_nbytes],
        }
        offset += e.kept_nbytes
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _refused(source: str, what: str, got: str, signed: str) -> WeightsSliceError:
    return WeightsSliceError(
        f"initial weights from {source}: {what} does not match the job's signed digest "
        f"(sha256 {got[:16]}..., signed {signed[:16]}...); refused"
    )


def check_slice(
    data: bytes | memoryview, layout: Sequence[SliceEntry], source: str = "the leader"
) -> tuple[bytes | memoryview, ...]:
    """Member: check the served bytes tensor by tensor against the signed digests (a shard: its chunk digests
    against the signed root, each chunk against its digest and size); the tensors' bytes as the member keeps
    them, in layout order (a whole tensor as served, a shard cut from its chunks). :class:`WeightsSliceError`
    (one line naming the tensor) when anything differs."""
    if len(data) != slice_size(layout):
        raise WeightsSliceError(
            f"initial weights from {source}: {len(data)} bytes where the signed tensors are {slice_size(layout)}; "
            "refused"
        )
    view, pos = memoryview(data), 0
    kept: list[bytes | memoryview] = []
    for e in layout:
        if e.ranges:
            kept.append(_check_shard(view[pos : pos + e.nbytes], e, source))
            pos += e.nbytes
            continue
        part = view[pos : pos + e.nbytes]
        if e.chunks is None:
            got = hashlib.sha256(part).hexdigest()
        else:
            got = chunks_root(chunk_digests(part, e.chunks, e.itemsize))
        if got != e.sha256:
            raise _refused(source, f"tensor {e.key}", got, e.sha256)
        kept.append(part)
        pos += e.nbytes
    return tuple(kept)


def _check_shard(view: memoryview, e: SliceEntry, source: str) -> bytes:
    """A rank's shard of ``e`` from what travelled (chunk digests, then the chunks covering its ranges)."""
    assert e.chunks is not None
    chunks: dict[int, memoryview] = {}
    digests: list[str] = []
    pos = 0
    for index, n in e.pieces():
        piece = view[pos : pos + n]
        if index is None:
            digests = [bytes(piece[i : i + DIGEST_BYTES]).hex() for i in range(0, n, DIGEST_BYTES)]
        else:
            chunks[index] = piece
        pos += n
    try:
        check_chunk_digests(e.key, digests, e.chunks, e.sha256, source)
        return assemble_shard(e.key, chunks, digests, e.chunks, e.itemsize, e.ranges, source)
    except ChunkError as exc:
        raise WeightsSliceError(str(exc)) from None


def assemble_slice(data: bytes, layout: Sequence[SliceEntry], source: str = "the leader") -> bytes:
    """:func:`check_slice`, then the safetensors file the worker reads (:func:`slice_header` and the bytes)."""
    return slice_header(layout) + b"".join(check_slice(data, layout, source))


def slice_file_matches(path: Path, layout: Sequence[SliceEntry]) -> bool:
    """Whether ``path`` is exactly the file :func:`assemble_slice` makes of ``layout`` (a slice kept from an
    earlier plan of the same place is used again, never trusted unchecked). A rank's shards cannot be checked
    again without the chunks it did not keep: such a slice is always fetched again."""
    if any(e.ranges for e in layout):
        return False
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
    "RankSplit",
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
