"""Writing safetensors files without numpy (``safetensors.torch.save`` imports numpy; numpy is installed only so
that torch does not warn about its absence, and no code of ours needs it).

The format is small and fixed: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and ``data_offsets``, padded with spaces to 8-byte alignment, then the raw little-endian bytes; the layout
is :func:`arceusd.files.safetensors_image.layout`'s (torch-free: the daemon rebuilds images with it). Reading goes
through ``safetensors.torch.load``, the library's own validating parser, so files we write are checked by the
reference implementation in the tests.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping

import torch
from safetensors.torch import load as _load

from arceusd.files.safetensors_image import Part, layout
from protocol.tensors import tensor_memoryview

_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def save_bytes(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise ``tensors`` (any device; copied to CPU) into safetensors bytes."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors writing is only implemented for little-endian machines")
    parts: list[Part] = []
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        dtype = _DTYPES.get(t.dtype)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in safetensors here")
        view = tensor_memoryview(t.view(torch.uint8) if t.dtype == torch.bool else t)
        parts.append(Part(name, dtype, tuple(t.shape), view))
    return layout(parts, metadata)


def load_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes with the reference parser (no pickle, no numpy on little-endian machines)."""
    return _load(data)


class SafetensorsHeaderError(ValueError):
    """The bytes do not start with a valid safetensors header."""


def read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (header only; the tensors are not touched)."""
    if len(data) < 8:
        raise SafetensorsHeaderError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, 1 << 24):
        raise SafetensorsHeaderError("header length is out of range")
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as exc:
        raise SafetensorsHeaderError(f"header is not JSON: {exc}") from None
    meta = header.get("__metadata__") or {} if isinstance(header, dict) else {}
    if not isinstance(meta, dict):
        raise SafetensorsHeaderError("__metadata__ is not an object")
    return {str(k): str(v) for k, v in meta.items()}
