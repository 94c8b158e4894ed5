"""Tensor frames: a small header (dtype, shape, codec) + raw bytes. No pickle, no numpy, no per-element
copies.

Frame layout (big-endian header, little-endian element bytes)::

    magic  b"AT"        2 bytes
    version             u8   (FRAME_VERSION)
    dtype code          u8   (DTYPE_CODES: the *logical* dtype the receiver gets back)
    codec id            u8   (0 raw; the others are in protocol.compression)
    ndim                u8   (<= TENSOR_MAX_NDIM)
    params length       u16  (<= TENSOR_MAX_PARAMS)
    dims                ndim x u64 (each <= TENSOR_MAX_DIM)
    codec params        params-length bytes
    body                the rest: codec-specific (raw: numel * itemsize element bytes)

Zero copy: :func:`tensor_memoryview` exposes a contiguous CPU tensor's memory as a read-only memoryview by
placing a ctypes array over ``data_ptr()``; the view keeps the tensor alive. It costs about a microsecond
whatever the size (``bytes(t.untyped_storage())`` walks element by element). :func:`encode_tensor_parts`
returns ``[header, body view]`` without copying; :func:`encode_tensor_frame` joins them (one memcpy). Decoding
copies the body once into a fresh, aligned, writable tensor with a single memcpy (``torch.frombuffer`` over
received bytes would alias an immutable and possibly misaligned buffer).

Error handling: :func:`protocol.decoding.decode_tensor_frame` raises :class:`RemoteProtocolError` (``bad_tensor_frame``,
``bad_dtype``, ``bad_shape``, ``tensor_too_large``, ``unexpected_shape``, ``unexpected_dtype``,
``unknown_codec``, ``length_mismatch`` and codec-specific reasons) before allocating anything sized by the
peer beyond the validated ``numel * itemsize <= max_bytes``. Encoding an unsupported dtype, a non-CPU tensor
or on a big-endian host raises :class:`LocalProtocolError`.
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from protocol import limits
from protocol.errors import LocalProtocolError, RemoteProtocolError

FRAME_MAGIC = b"AT"
FRAME_VERSION = 1
_HEAD = struct.Struct(">2sBBBBH")
_DIM = struct.Struct(">Q")

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int64: 4,
    torch.int32: 5,
    torch.int8: 6,
    torch.uint8: 7,
}
"""The dtype allow-list and its wire codes (append-only)."""
DTYPES_BY_CODE: dict[int, torch.dtype] = {v: k for k, v in DTYPE_CODES.items()}
FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})

CODEC_RAW = 0

Shape = tuple[int, ...]
Buffer = bytes | bytearray | memoryview


class TensorCodec(Protocol):
    """The encoding side of a codec (see protocol.compression for the lossy ones)."""

    @property
    def codec_id(self) -> int: ...

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        """(codec params, body parts) for a contiguous CPU tensor of an allowed dtype."""
        ...


Decoder = Callable[[bytes, memoryview, torch.dtype, Shape], torch.Tensor]
"""(params, body, logical dtype, shape) -> tensor. Must check the body length before allocating."""


@dataclass(frozen=True)
class TensorHeader:
    dtype: torch.dtype
    shape: Shape
    codec_id: int
    params: bytes
    body_offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)


_ITEMSIZE: dict[torch.dtype, int] = {d: torch.empty((), dtype=d).element_size() for d in DTYPE_CODES}


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of an allowed dtype."""
    size = _ITEMSIZE.get(dtype)
    if size is None:
        raise LocalProtocolError("bad_dtype", f"{dtype} is not on the wire allow-list")
    return size


# ----------------------------------------------------------------------------------------------------
# zero-copy memory access
# ----------------------------------------------------------------------------------------------------


# A ctypes array type placed over existing memory (never allocated); being a subclass, its instances take
# attributes, which is how a view pins the tensor that owns the memory.
_RawMemory: type[ctypes.Array[ctypes.c_char]] = type("_RawMemory", (ctypes.c_char * (1 << 40),), {})


def tensor_memoryview(t: torch.Tensor) -> memoryview:
    """A read-only byte view of a contiguous CPU tensor's memory, without copying. The view keeps ``t``
    alive; writing to ``t`` while the view is in use changes what it shows."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise LocalProtocolError(
            "not_contiguous_cpu", "tensor_memoryview needs a contiguous CPU tensor; call .contiguous().cpu()"
        )
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(b"")
    raw = _RawMemory.from_address(t.data_ptr())
    raw._keep = t  # type: ignore[attr-defined]  # the subclass has a __dict__; this pins the storage
    return memoryview(raw).cast("B")[:n].toreadonly()


def _writable_view(t: torch.Tensor) -> memoryview:
    raw = _RawMemory.from_address(t.data_ptr())
    raw._keep = t  # type: ignore[attr-defined]
    return memoryview(raw).cast("B")[: t.numel() * t.element_size()]


def tensor_from_bytes(body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    """A new tensor of ``dtype``/``shape`` filled from ``body`` with one memcpy.

    Error handling: RemoteProtocolError ``length_mismatch`` when ``body`` is not exactly numel * itemsize
    bytes (checked before allocating)."""
    n = math.prod(shape) * _ITEMSIZE[dtype]
    if body.nbytes != n:
        raise RemoteProtocolError(
            "length_mismatch", f"{dtype} {list(shape)} needs {n} bytes, the frame carries {body.nbytes}"
        )
    out = torch.empty(shape, dtype=dtype)
    if n:
        _writable_view(out)[:] = body
    return out


# ----------------------------------------------------------------------------------------------------
# raw codec
# ----------------------------------------------------------------------------------------------------


class RawCodec:
    """No compression: the element bytes themselves (exact)."""

    codec_id = CODEC_RAW

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        return b"", [tensor_memoryview(t)]


def decode_raw(params: bytes, body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    if params:
        raise RemoteProtocolError("bad_codec_params", "the raw codec takes no parameters")
    return tensor_from_bytes(body, dtype, shape)


RAW = RawCodec()


# ----------------------------------------------------------------------------------------------------
# frames
# ----------------------------------------------------------------------------------------------------


def encode_tensor_parts(t: torch.Tensor, codec: TensorCodec = RAW) -> list[Buffer]:
    """``[header, *body parts]`` of a tensor frame; the raw body is a view of ``t`` (no copy), so do not
    modify ``t`` until the parts are sent. Non-contiguous tensors are made contiguous first (a copy).

    Error handling: LocalProtocolError for a dtype outside the allow-list, a non-CPU tensor, too many dims,
    or a big-endian host."""
    if sys.byteorder != "little":
        raise LocalProtocolError("big_endian_host", "tensor frames carry little-endian element bytes")
    code = DTYPE_CODES.get(t.dtype)
    if code is None:
        raise LocalProtocolError(
            "bad_dtype", f"{t.dtype} is not on the wire allow-list {sorted(str(d) for d in DTYPE_CODES)}"
        )
    if t.device.type != "cpu":
        raise LocalProtocolError("not_cpu", "move the tensor to the CPU before framing it (t.cpu())")
    if t.dim() > limits.TENSOR_MAX_NDIM or any(d > limits.TENSOR_MAX_DIM for d in t.shape):
        raise LocalProtocolError("bad_shape", f"shape {list(t.shape)} exceeds the frame limits")
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    params, body = codec.encode(t)
    if len(params) > limits.TENSOR_MAX_PARAMS:
        raise LocalProtocolError("bad_codec_params", f"codec params of {len(params)} bytes")
    head = _HEAD.pack(FRAME_MAGIC, FRAME_VERSION, code, codec.codec_id, t.dim(), len(params))
    head += b"".join(_DIM.pack(d) for d in t.shape) + params
    return [head, *body]


def encode_tensor_frame(t: torch.Tensor, codec: TensorCodec = RAW) -> bytes:
    """The frame as one bytes object (one copy of the body)."""
    return b"".join(encode_tensor_parts(t, codec))


def read_tensor_header(frame: Buffer, *, max_bytes: int = limits.TENSOR_MAX_BYTES) -> TensorHeader:
    """Parse and bound-check a frame header (no allocation sized by the peer)."""
    mv = memoryview(frame).cast("B")
    if mv.nbytes < _HEAD.size:
        raise RemoteProtocolError("bad_tensor_frame", f"{mv.nbytes} bytes is shorter than a frame header")
    magic, version, code, codec_id, ndim, plen = _HEAD.unpack_from(mv, 0)
    if magic != FRAME_MAGIC or version != FRAME_VERSION:
        raise RemoteProtocolError("bad_tensor_frame", f"magic {magic!r} version {version} is not a tensor frame")
    dtype = DTYPES_BY_CODE.get(code)
    if dtype is None:
        raise RemoteProtocolError("bad_dtype", f"dtype code {code} is not on the allow-list")
    if ndim > limits.TENSOR_MAX_NDIM:
        raise RemoteProtocolError("bad_shape", f"{ndim} dims > {limits.TENSOR_MAX_NDIM}")
    if plen > limits.TENSOR_MAX_PARAMS:
        raise RemoteProtocolError("bad_codec_params", f"{plen} bytes of codec params")
    off = _HEAD.size
    end = off + ndim * _DIM.size + plen
    if mv.nbytes < end:
        raise RemoteProtocolError("bad_tensor_frame", "frame ends inside its header")
    shape = tuple(_DIM.unpack_from(mv, off + i * _DIM.size)[0] for i in range(ndim))
    if any(d > limits.TENSOR_MAX_DIM for d in shape):
        raise RemoteProtocolError("bad_shape", f"a dimension of {list(shape)} exceeds {limits.TENSOR_MAX_DIM}")
    nbytes = math.prod(shape) * _ITEMSIZE[dtype]
    if nbytes > max_bytes:
        raise RemoteProtocolError("tensor_too_large", f"{dtype} {list(shape)} is {nbytes} bytes > {max_bytes}")
    params = bytes(mv[end - plen : end])
    return TensorHeader(dtype=dtype, shape=shape, codec_id=codec_id, params=params, body_offset=end)
