"""The byte layout of a safetensors image, without torch: laying one out from raw tensor bytes, and reading the
tensors' descriptions back from untrusted bytes.

The format: an 8-byte little-endian header length, a JSON header (``__metadata__`` first when there is one, then
each tensor by name, sorted, with its dtype, shape and ``data_offsets``), padded with spaces to 8-byte alignment,
then the raw little-endian bytes in the same order. :func:`arceusd.files.safetensors_io.save_bytes` writes
through :func:`layout`, so the daemon (which never imports torch) can rebuild exactly the bytes a worker
serialised from the same tensors (:mod:`arceusd.files.outer_witness`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple

ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
"""The dtypes written here, and their item sizes."""
MAX_HEADER = 1 << 24
"""The longest header read back (bytes)."""
MAX_RANK = 8


class Part(NamedTuple):
    """One tensor of an image: its name, safetensors dtype, shape and raw little-endian bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview


class Entry(NamedTuple):
    """One tensor's description read from a header: dtype, shape and its bytes' ``begin:end`` in the body."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class ImageError(ValueError):
    """The bytes are not a well-formed safetensors image; the message says what is wrong."""


def layout(parts: Sequence[Part], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors image of ``parts`` (written in name order) with ``metadata`` (in its own order)."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    ordered = sorted(parts, key=lambda p: p.name)
    for part in ordered:
        size = len(part.data) if isinstance(part.data, bytes) else part.data.nbytes
        header[part.name] = {"dtype": part.dtype, "shape": list(part.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out = bytearray(struct.pack("<Q", len(text)))
    out += text
    for part in ordered:
        out += part.data
    return bytes(out)


def entries(data: bytes) -> tuple[dict[str, Entry], int]:
    """Each tensor's description in the image ``data`` (untrusted: the header length, dtypes, shapes and offsets
    are checked against the bytes), and where its body starts. :class:`ImageError` says what is wrong."""
    if len(data) < 8:
        raise ImageError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, MAX_HEADER):
        raise ImageError("its header length is out of range")
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError:
        raise ImageError("its header is not JSON") from None
    return described(header, len(data) - 8 - n), 8 + n


def described(header: object, body: int) -> dict[str, Entry]:
    """Each tensor's description in a parsed (untrusted) safetensors ``header``, checked against the ``body``
    bytes that follow it: dtypes known, shapes of at most :data:`MAX_RANK` non-negative sizes, offsets inside the
    body and as long as the shape needs. :class:`ImageError` says what is wrong."""
    if not isinstance(header, dict):
        raise ImageError("its header is not an object")
    out: dict[str, Entry] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ImageError(f"tensor {name[:80]!r} has no description")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in ITEM_BYTES:
            raise ImageError(f"tensor {name[:80]!r} has an unknown dtype {str(dtype)[:20]!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ImageError(f"tensor {name[:80]!r} has a malformed shape")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise ImageError(f"tensor {name[:80]!r} has malformed data offsets")
        begin, end = offsets
        if not 0 <= begin <= end <= body or end - begin != math.prod(shape) * ITEM_BYTES[str(dtype)]:
            raise ImageError(f"tensor {name[:80]!r} does not fit the file (offsets {begin}..{end})")
        out[str(name)] = Entry(str(dtype), tuple(shape), begin, end)
    return out


__all__ = ["ITEM_BYTES", "Entry", "ImageError", "Part", "entries", "layout"]
