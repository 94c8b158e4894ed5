"""Decoding a tensor frame of any codec: the raw one (:mod:`protocol.tensors`, which owns the frame's layout) and
the lossy ones (:mod:`protocol.compression`). It sits above both, so neither imports the other's way back.
What is checked before anything is allocated is in :mod:`protocol.tensors`' docstring."""

from __future__ import annotations

import torch

from protocol import limits
from protocol.compression import DECODERS
from protocol.errors import RemoteProtocolError
from protocol.tensors import CODEC_RAW, Buffer, Decoder, Shape, decode_raw, read_tensor_header


def decode_tensor_frame(
    frame: Buffer,
    *,
    expected_shape: Shape | None = None,
    expected_dtype: torch.dtype | None = None,
    max_bytes: int = limits.TENSOR_MAX_BYTES,
) -> torch.Tensor:
    """Validate and decode a frame into a new tensor of the frame's logical dtype and shape.

    ``expected_shape``/``expected_dtype`` (the plan's) are compared before anything is allocated."""
    head = read_tensor_header(frame, max_bytes=max_bytes)
    if expected_shape is not None and head.shape != tuple(expected_shape):
        raise RemoteProtocolError(
            "unexpected_shape", f"got shape {list(head.shape)}, the plan expects {list(expected_shape)}"
        )
    if expected_dtype is not None and head.dtype != expected_dtype:
        raise RemoteProtocolError("unexpected_dtype", f"got {head.dtype}, the plan expects {expected_dtype}")
    mv = memoryview(frame).cast("B")
    body = mv[head.body_offset :]
    return decoder_for(head.codec_id)(head.params, body, head.dtype, head.shape)


def decoder_for(codec_id: int) -> Decoder:
    """The decode function of a codec id; RemoteProtocolError ``unknown_codec`` for an unknown one."""
    if codec_id == CODEC_RAW:
        return decode_raw
    dec = DECODERS.get(codec_id)
    if dec is None:
        raise RemoteProtocolError("unknown_codec", f"tensor codec {codec_id} is unknown")
    return dec
