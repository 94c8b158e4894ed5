"""Signed chunks of the initial tensors a tensor-parallel split cuts, and a rank's shard made of them (torch-free).

Owns: which decoder-layer tensors a split cuts, along which dimension and by what (:data:`TP_SPLIT_LLAMA`,
:data:`TP_SPLIT_GPT2`, by a block's local parameter name; :mod:`arceusd.worker.hf_tp_tensors` cuts parameters
with the same tables), the index ranges a rank holds (:func:`rank_ranges`), and, for a checkpoint key of an
initial-weights file, the fixed chunking every legal split is a union of (:func:`chunking`):

* query heads (q rows, o columns; gpt2 ``attn.c_proj`` rows): one chunk per key/value group (a rank holds whole
  groups, :mod:`arceusd.worker.hf_tp_split`), ``n_head / n_kv_head * head_dim`` wide;
* key/value heads (k, v rows): one chunk per key/value head, ``head_dim`` wide;
* gpt2's fused ``c_attn`` (last dimension): one chunk per head in each of its q, k and v sections;
* MLP columns (gate/up rows, down columns; gpt2 ``c_fc`` last dimension, ``mlp.c_proj`` rows): at most
  :data:`COLUMN_CHUNKS` blocks of ``ceil(intermediate / COLUMN_CHUNKS)`` columns, the last one narrower. The planner
  splits columns in proportion to speed (any count), so a rank's range may end inside a block: it receives the
  blocks that cover its range and keeps its columns (at most one block more than its shard on each side).

Every count and size here comes from the config alone. A chunk is the sub-tensor of its index range along the
split dimension, its bytes in row-major order (:func:`read_chunk`); its digest is the sha256 of those bytes
(:func:`chunk_digests`); a split tensor's digest is :func:`chunks_root`, the sha256 of its chunk digests (32
raw bytes each, in order), so the signed table keeps one value per tensor. A rank checks the digest list against
that value (:func:`check_chunk_digests`: exactly the config's count), each chunk it receives against its digest
and size, and cuts its shard, as the worker's split holds it (:func:`assemble_shard`).

:mod:`arceusd.models.hf.weights_slice` signs, serves and checks initial weights with these.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import Shape, expected_tensors

COLUMN_CHUNKS = 64
"""The most chunks an MLP tensor is cut into along its columns."""

DIGEST_BYTES = 32
"""A chunk digest as it travels (raw sha256)."""


class SplitBy(enum.StrEnum):
    """What a split tensor is cut by: query heads, key/value heads, gpt2's fused q/k/v heads, MLP columns."""

    HEADS = "heads"
    KV = "kv"
    QKV = "qkv"
    COLUMNS = "columns"


TP_SPLIT_LLAMA: Mapping[str, tuple[int, SplitBy]] = {
    "layer.self_attn.q_proj.weight": (0, SplitBy.HEADS),
    "layer.self_attn.q_proj.bias": (0, SplitBy.HEADS),
    "layer.self_attn.k_proj.weight": (0, SplitBy.KV),
    "layer.self_attn.k_proj.bias": (0, SplitBy.KV),
    "layer.self_attn.v_proj.weight": (0, SplitBy.KV),
    "layer.self_attn.v_proj.bias": (0, SplitBy.KV),
    "layer.self_attn.o_proj.weight": (1, SplitBy.HEADS),
    "layer.mlp.gate_proj.weight": (0, SplitBy.COLUMNS),
    "layer.mlp.gate_proj.bias": (0, SplitBy.COLUMNS),
    "layer.mlp.up_proj.weight": (0, SplitBy.COLUMNS),
    "layer.mlp.up_proj.bias": (0, SplitBy.COLUMNS),
    "layer.mlp.down_proj.weight": (1, SplitBy.COLUMNS),
}
"""llama / qwen2 / mistral: a decoder block's local parameter name -> (dimension it is split along, by what)."""

TP_SPLIT_GPT2: Mapping[str, tuple[int, SplitBy]] = {
    "layer.attn.c_attn.weight": (-1, SplitBy.QKV),
    "layer.attn.c_attn.bias": (-1, SplitBy.QKV),
    "layer.attn.c_proj.weight": (0, SplitBy.HEADS),
    "layer.mlp.c_fc.weight": (-1, SplitBy.COLUMNS),
    "layer.mlp.c_fc.bias": (-1, SplitBy.COLUMNS),
    "layer.mlp.c_proj.weight": (0, SplitBy.COLUMNS),
}
"""gpt2 (``Conv1D``: weight (in, out)), as :data:`TP_SPLIT_LLAMA`. Output biases are replicated (in neither)."""


class ChunkError(ValueError):
    """Served chunks or digests that do not match the job's signed weights; the message is one line."""


def tp_split_table(config: HFModelConfig) -> Mapping[str, tuple[int, SplitBy]]:
    """The split table of ``config``'s architecture."""
    return TP_SPLIT_GPT2 if config.is_gpt2 else TP_SPLIT_LLAMA


def rank_ranges(
    by: SplitBy, config: HFModelConfig, kv_heads: Sequence[int], columns: Sequence[int], rank: int
) -> tuple[tuple[int, int], ...]:
    """The index ranges (along the split dimension) of rank ``rank``'s part of a tensor split by ``by``, for a
    split of ``kv_heads`` key/value heads and ``columns`` MLP columns per rank (a ``TPSplit``'s two fields)."""
    if by is SplitBy.COLUMNS:
        c0 = sum(columns[:rank])
        return ((c0, c0 + columns[rank]),)
    hd = config.head_dim
    k0, k1 = sum(kv_heads[:rank]), sum(kv_heads[: rank + 1])
    if by is SplitBy.KV:
        return ((k0 * hd, k1 * hd),)
    group = config.n_head // config.n_kv_head
    h0, h1 = k0 * group, k1 * group
    if by is SplitBy.HEADS:
        return ((h0 * hd, h1 * hd),)
    width = config.hidden  # gpt2's fused q, k, v sections of c_attn
    return tuple((sec * width + h0 * hd, sec * width + h1 * hd) for sec in range(3))


@dataclass(frozen=True)
class Chunking:
    """A split tensor of ``shape`` cut along ``dim`` (non-negative) at ``bounds`` (0 = b0 < b1 < ... = its size
    along ``dim``): chunk ``i`` is the index range ``[bounds[i], bounds[i + 1])``. ``by``: what it is split by."""

    shape: Shape
    dim: int
    bounds: tuple[int, ...]
    by: SplitBy

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    @property
    def outer(self) -> int:
        """Slabs before the split dimension (rows of a tensor split along its last dimension; 1 along the first)."""
        n = 1
        for d in self.shape[: self.dim]:
            n *= d
        return n

    @property
    def inner(self) -> int:
        """Elements after the split dimension, per index along it."""
        n = 1
        for d in self.shape[self.dim + 1 :]:
            n *= d
        return n

    def chunk_nbytes(self, index: int, itemsize: int) -> int:
        """The size of chunk ``index`` in bytes."""
        return self.outer * (self.bounds[index + 1] - self.bounds[index]) * self.inner * itemsize

    def covering(self, ranges: Sequence[tuple[int, int]]) -> tuple[int, ...]:
        """The chunks that overlap any of ``ranges`` (sorted): what a rank holding ``ranges`` receives."""
        return tuple(
            i for i in range(self.count) if any(a < self.bounds[i + 1] and self.bounds[i] < b for a, b in ranges)
        )


def _even_bounds(total: int, width: int) -> tuple[int, ...]:
    return (*range(0, total, width), total)


def chunking(config: HFModelConfig, key: str) -> Chunking | None:
    """How checkpoint key ``key``'s tensor is cut into signed chunks, or None when no split cuts it (embedding,
    norms, head, replicated biases; an unknown key)."""
    entry = expected_tensors(config).get(key)
    if entry is None:
        return None
    _, local, shape = entry
    layout = tp_split_table(config).get(local)
    if layout is None:
        return None
    dim, by = layout
    dim = dim % len(shape)
    hd, size = config.head_dim, shape[dim]
    if by is SplitBy.COLUMNS:
        width = -(-size // min(size, COLUMN_CHUNKS))
        bounds = _even_bounds(size, width)
    elif by is SplitBy.KV:
        bounds = _even_bounds(size, hd)
    elif by is SplitBy.HEADS:
        bounds = _even_bounds(size, config.n_head // config.n_kv_head * hd)
    else:
        bounds = _even_bounds(size, hd)  # 3 * n_head heads: q's, then k's, then v's
    return Chunking(shape, dim, bounds, by)


def _segments(c: Chunking, index: int, itemsize: int) -> tuple[int, int, int]:
    """Chunk ``index`` within the tensor's bytes: (offset of its piece in each slab, piece size, slab size)."""
    unit = c.inner * itemsize
    return c.bounds[index] * unit, (c.bounds[index + 1] - c.bounds[index]) * unit, c.shape[c.dim] * unit


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ChunkError(f"{getattr(f, 'name', 'the weights file')} ends inside a tensor")
    return data


def read_chunk(f: BinaryIO, start: int, c: Chunking, index: int, itemsize: int) -> bytes:
    """Chunk ``index`` of the tensor whose raw bytes start at ``start`` in the open file ``f`` (row-major)."""
    offset, piece, slab = _segments(c, index, itemsize)
    out = bytearray()
    for s in range(c.outer):
        f.seek(start + s * slab + offset)
        out += _read_exact(f, piece)
    return bytes(out)


def chunk_digests(data: bytes | memoryview, c: Chunking, itemsize: int) -> tuple[str, ...]:
    """Every chunk's sha256 from a whole tensor's raw bytes ``data`` (row-major)."""
    view = memoryview(data)
    total = c.outer * c.shape[c.dim] * c.inner * itemsize
    if len(view) != total:
        raise ChunkError(f"a tensor of shape {list(c.shape)} is {total} bytes, got {len(view)}")
    out = []
    for i in range(c.count):
        offset, piece, slab = _segments(c, i, itemsize)
        h = hashlib.sha256()
        for s in range(c.outer):
            h.update(view[s * slab + offset : s * slab + offset + piece])
        out.append(h.hexdigest())
    return tuple(out)


def chunks_root(digests: Sequence[str]) -> str:
    """A split tensor's one digest: the sha256 of its chunk digests (32 raw bytes each, in order)."""
    return hashlib.sha256(b"".join(bytes.fromhex(d) for d in digests)).hexdigest()


def check_chunk_digests(key: str, digests: Sequence[str], c: Chunking, signed: str, source: str) -> None:
    """The chunk digests ``source`` gave for ``key`` are exactly the config's count and hash to the signed value."""
    if len(digests) != c.count:
        raise ChunkError(f"{source} gave {len(digests)} chunk digests of {key}; the config cuts it in {c.count}")
    if chunks_root(digests) != signed:
        raise ChunkError(f"{source} gave chunk digests of {key} that do not match the job's signed digest; refused")


def shard_shape(c: Chunking, ranges: Sequence[tuple[int, int]]) -> Shape:
    """The shape of a rank's shard: ``ranges`` along the split dimension, the rest whole."""
    return (*c.shape[: c.dim], sum(b - a for a, b in ranges), *c.shape[c.dim + 1 :])


def assemble_shard(
    key: str,
    chunks: Mapping[int, bytes | memoryview],
    digests: Sequence[str],
    c: Chunking,
    itemsize: int,
    ranges: Sequence[tuple[int, int]],
    source: str = "the leader",
) -> bytes:
    """A rank's shard of ``key`` (raw bytes of :func:`shard_shape`, row-major, as its split holds it: ``ranges``
    concatenated along the split dimension) from the chunks that cover ``ranges``, each checked first against
    its size (from the config) and its digest in ``digests`` (checked against the signed table by
    :func:`check_chunk_digests`). :class:`ChunkError` (one line) for a missing, extra, short or altered chunk."""
    wanted = c.covering(ranges)
    if len(digests) != c.count:
        raise ChunkError(f"{len(digests)} chunk digests of {key}; the config cuts it in {c.count}")
    if sorted(chunks) != list(wanted):
        raise ChunkError(f"{source} served chunks {sorted(chunks)[:8]} of {key}; this rank needs {list(wanted)[:8]}")
    for i in wanted:
        data, size = chunks[i], c.chunk_nbytes(i, itemsize)
        if len(data) != size:
            raise ChunkError(f"{source} served {len(data)} bytes as chunk {i} of {key}, which is {size}; refused")
        got = hashlib.sha256(data).hexdigest()
        if got != digests[i]:
            raise ChunkError(
                f"{source} served chunk {i} of {key} not matching the job's signed digest "
                f"(sha256 {got[:16]}..., signed {digests[i][:16]}...); refused"
            )
    unit = c.inner * itemsize
    views = {i: memoryview(chunks[i]) for i in wanted}
    out = bytearray()
    for s in range(c.outer):
        for a, b in ranges:
            for i in wanted:
                lo, hi = max(a, c.bounds[i]), min(b, c.bounds[i + 1])
                if lo < hi:
                    width = (c.bounds[i + 1] - c.bounds[i]) * unit
                    base = s * width + (lo - c.bounds[i]) * unit
                    out += views[i][base : base + (hi - lo) * unit]
    return bytes(out)


__all__ = [
    "COLUMN_CHUNKS",
    "DIGEST_BYTES",
    "TP_SPLIT_GPT2",
    "TP_SPLIT_LLAMA",
    "ChunkError",
    "Chunking",
    "SplitBy",
    "assemble_shard",
    "check_chunk_digests",
    "chunk_digests",
    "chunking",
    "chunks_root",
    "rank_ranges",
    "read_chunk",
    "shard_shape",
    "tp_split_table",
]
