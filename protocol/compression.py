"""Lossy tensor codecs for activations and gradients, selected on decode by the tensor frame's codec id.

=== ============ =========================== ==========================================================
id  codec        wire bytes per element      error bound (documented per class, checked by the tests)
=== ============ =========================== ==========================================================
0   raw          itemsize                    exact (protocol.tensors.RawCodec)
1   fp16         2                           round-to-nearest float16: rel. 2^-11 in the normal range
2   bf16         2                           round-to-nearest bfloat16: rel. 2^-8
3   int8-block   1 + 4/block                 |err| <= scale/2 (1 + 2^-16) per element, scale per block
4   top-k        k/numel * (4 + itemsize)    sent values exact, the rest zero; ErrorFeedback keeps them
=== ============ =========================== ==========================================================

All lossy codecs take a floating logical dtype (float32, float16, bfloat16); the frame header records it and
the receiver gets that dtype back. Decoders check parameters and body length before allocating anything.
:class:`protocol.error_feedback.ErrorFeedback` wraps any codec with a residual: what was not sent this step is
added to the next step's input. A frame of any codec is decoded by :mod:`protocol.decoding`.
"""

from __future__ import annotations

import math
import struct

import torch
import torch.nn.functional as F

from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.tensors import (
    FLOAT_DTYPES,
    Buffer,
    Decoder,
    Shape,
    itemsize,
    tensor_from_bytes,
    tensor_memoryview,
)

CODEC_FP16 = 1
CODEC_BF16 = 2
CODEC_INT8_BLOCK = 3
CODEC_TOPK = 4

MAX_BLOCK = 1 << 20
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def require_float(dtype: torch.dtype, name: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise LocalProtocolError("codec_dtype", f"the {name} codec compresses floating tensors, not {dtype}")


def _remote_require_float(dtype: torch.dtype, name: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise RemoteProtocolError("bad_codec_dtype", f"a {name} frame must carry a floating dtype, not {dtype}")


def _no_params(params: bytes, name: str) -> None:
    if params:
        raise RemoteProtocolError("bad_codec_params", f"the {name} codec takes no parameters")


# ----------------------------------------------------------------------------------------------------
# casts
# ----------------------------------------------------------------------------------------------------


class Fp16Codec:
    """Cast to float16 (round to nearest even).

    Error bound: for |x| in the normal range [2^-14, 65504], |decoded - x| <= 2^-11 |x|; below it the absolute
    error is <= 2^-25. Finite values beyond +-65504 would become inf, so encoding them raises
    LocalProtocolError (``fp16_overflow``): use bf16 for such tensors."""

    codec_id = CODEC_FP16

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        require_float(t.dtype, "fp16")
        h = t.to(torch.float16)
        # Cheap screen first (a max is ~15x cheaper than the elementwise test); values in (65504, 65520)
        # still round to 65504, so only then look for finite values that became inf.
        if (
            t.dtype != torch.float16
            and t.numel()
            and bool(t.abs().max() > 65504.0)
            and bool((torch.isinf(h) & torch.isfinite(t)).any())
        ):
            raise LocalProtocolError("fp16_overflow", "values beyond +-65504 do not fit fp16; use the bf16 codec")
        return b"", [tensor_memoryview(h)]


def _decode_fp16(params: bytes, body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    _no_params(params, "fp16")
    _remote_require_float(dtype, "fp16")
    return tensor_from_bytes(body, torch.float16, shape).to(dtype)


class Bf16Codec:
    """Cast to bfloat16 (round to nearest even): float32's range, 8 significant bits.

    Error bound: |decoded - x| <= 2^-8 |x| for normal values (2^-133 absolute below 2^-126)."""

    codec_id = CODEC_BF16

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        require_float(t.dtype, "bf16")
        return b"", [tensor_memoryview(t.to(torch.bfloat16))]


def _decode_bf16(params: bytes, body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    _no_params(params, "bf16")
    _remote_require_float(dtype, "bf16")
    return tensor_from_bytes(body, torch.bfloat16, shape).to(dtype)


# ----------------------------------------------------------------------------------------------------
# int8 block quantization
# ----------------------------------------------------------------------------------------------------


class Int8BlockCodec:
    """Symmetric int8 quantization with one float32 scale per block of ``block_size`` values (flattened
    order).

    ``scale = max|x| / 127`` over the block, ``q = round(x / scale)`` in [-127, 127], decoded ``q * scale``.
    Error bound (float32 logical dtype): |decoded - x| <= scale/2 * (1 + 2^-16) per element (the 2^-16 covers
    float32 rounding of the division and product); an all-zero block is exact. For a float16/bfloat16 logical
    dtype add that dtype's rounding of the result. Non-finite inputs raise LocalProtocolError
    (``non_finite``). Wire: ``ceil(n / block)`` float32 scales, then n int8 values."""

    codec_id = CODEC_INT8_BLOCK

    def __init__(self, block_size: int = 256) -> None:
        if not (1 <= block_size <= MAX_BLOCK):
            raise LocalProtocolError("bad_codec_params", f"block_size must be in 1..{MAX_BLOCK}")
        self.block_size = block_size

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        require_float(t.dtype, "int8-block")
        x = t.reshape(-1).to(torch.float32)
        n, b = x.numel(), self.block_size
        nb = -(-n // b)
        pad = nb * b - n
        blocks = (F.pad(x, (0, pad)) if pad else x).view(nb, b)
        amax = blocks.abs().amax(dim=1) if nb else torch.empty(0)
        if not bool(torch.isfinite(amax).all()):
            raise LocalProtocolError("non_finite", "int8-block cannot encode inf or nan values")
        scale = (amax / 127.0).contiguous()
        div = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(blocks / div[:, None]).clamp_(-127, 127).to(torch.int8).reshape(-1)[:n]
        return _U32.pack(b), [tensor_memoryview(scale), tensor_memoryview(q.contiguous())]


def _decode_int8_block(params: bytes, body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    _remote_require_float(dtype, "int8-block")
    if len(params) != _U32.size:
        raise RemoteProtocolError("bad_codec_params", "int8-block params are one u32 block size")
    (b,) = _U32.unpack(params)
    if not (1 <= b <= MAX_BLOCK):
        raise RemoteProtocolError("bad_codec_params", f"int8-block block size {b} not in 1..{MAX_BLOCK}")
    n = math.prod(shape)
    nb = -(-n // b)
    if body.nbytes != nb * 4 + n:
        raise RemoteProtocolError(
            "length_mismatch", f"int8-block of {n} values needs {nb * 4 + n} body bytes, got {body.nbytes}"
        )
    scale = tensor_from_bytes(body[: nb * 4], torch.float32, (nb,))
    if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
        raise RemoteProtocolError("bad_scale", "int8-block scales must be finite and non-negative")
    q = tensor_from_bytes(body[nb * 4 :], torch.int8, (n,))
    pad = nb * b - n
    qf = q.to(torch.float32)
    blocks = (F.pad(qf, (0, pad)) if pad else qf).view(nb, b)
    return (blocks * scale[:, None]).reshape(-1)[:n].reshape(shape).to(dtype)


# ----------------------------------------------------------------------------------------------------
# top-k sparsification
# ----------------------------------------------------------------------------------------------------


class TopKCodec:
    """Send the ``k`` largest-magnitude values (or ``ceil(ratio * numel)``) with their flat indices.

    Error bound: sent values are exact (bitwise), all others decode to zero; with :class:`ErrorFeedback` the
    residual holds exactly what was not sent (``decoded + residual == input + previous residual``, bitwise for
    float32). Wire: k int32 indices, strictly increasing, then k values in the logical dtype."""

    codec_id = CODEC_TOPK

    def __init__(self, *, k: int | None = None, ratio: float | None = None) -> None:
        if (k is None) == (ratio is None):
            raise LocalProtocolError("bad_codec_params", "give exactly one of k or ratio")
        if k is not None and k < 0:
            raise LocalProtocolError("bad_codec_params", "k must be >= 0")
        if ratio is not None and not (0.0 < ratio <= 1.0):
            raise LocalProtocolError("bad_codec_params", "ratio must be in (0, 1]")
        self.k = k
        self.ratio = ratio

    def k_for(self, numel: int) -> int:
        k = self.k if self.k is not None else math.ceil((self.ratio or 0.0) * numel)
        return min(k, numel)

    def encode(self, t: torch.Tensor) -> tuple[bytes, list[Buffer]]:
        require_float(t.dtype, "top-k")
        x = t.reshape(-1)
        if x.numel() > 2**31 - 1:
            raise LocalProtocolError("too_large", "top-k indexes with int32: split the tensor")
        k = self.k_for(x.numel())
        idx = torch.topk(x.abs().float(), k, sorted=False).indices.sort().values
        vals = x[idx].contiguous()
        return _U64.pack(k), [tensor_memoryview(idx.to(torch.int32)), tensor_memoryview(vals)]


def _decode_topk(params: bytes, body: memoryview, dtype: torch.dtype, shape: Shape) -> torch.Tensor:
    _remote_require_float(dtype, "top-k")
    if len(params) != _U64.size:
        raise RemoteProtocolError("bad_codec_params", "top-k params are one u64 k")
    (k,) = _U64.unpack(params)
    n = math.prod(shape)
    if k > n:
        raise RemoteProtocolError("bad_codec_params", f"top-k k={k} > numel {n}")
    if body.nbytes != k * (4 + itemsize(dtype)):
        raise RemoteProtocolError("length_mismatch", f"top-k with k={k} needs {k * (4 + itemsize(dtype))} bytes")
    idx = tensor_from_bytes(body[: k * 4], torch.int32, (k,))
    vals = tensor_from_bytes(body[k * 4 :], dtype, (k,))
    if k and (int(idx[0]) < 0 or int(idx[-1]) >= n or (k > 1 and not bool((idx[1:] > idx[:-1]).all()))):
        raise RemoteProtocolError("bad_indices", "top-k indices must be strictly increasing and in range")
    out = torch.zeros(n, dtype=dtype)
    out[idx.long()] = vals
    return out.reshape(shape)


DECODERS: dict[int, Decoder] = {
    CODEC_FP16: _decode_fp16,
    CODEC_BF16: _decode_bf16,
    CODEC_INT8_BLOCK: _decode_int8_block,
    CODEC_TOPK: _decode_topk,
}
"""Codec id -> decode function (raw, id 0, lives in protocol.tensors)."""
