"""Error feedback (Seide et al. 2014, Stich et al. 2018): a lossy codec's sender keeps what it did not send this
step and adds it to the next step's input. It decodes its own frames (:mod:`protocol.decoding`) to know what the
receiver gets."""

from __future__ import annotations

import torch

from protocol.compression import require_float
from protocol.decoding import decode_tensor_frame
from protocol.errors import LocalProtocolError
from protocol.tensors import TensorCodec, encode_tensor_frame


class ErrorFeedback:
    """Stateful wrapper: ``acc = t + residual``; send ``codec(acc)``; ``residual = acc - decoded``.

    The residual is kept in float32 and its shape is fixed by the first call (one object per tensor
    stream). ``decoded + residual == acc`` holds exactly for top-k (sent positions are exact, others zero)."""

    def __init__(self, codec: TensorCodec) -> None:
        self.codec = codec
        self.residual: torch.Tensor | None = None

    def encode(self, t: torch.Tensor) -> bytes:
        """The tensor frame for ``t`` plus the carried residual; updates the residual."""
        require_float(t.dtype, "error-feedback")
        r = self.residual
        if r is not None and r.shape != t.shape:
            raise LocalProtocolError(
                "shape_changed",
                f"residual shape {list(r.shape)} != {list(t.shape)}; use one object per stream",
            )
        acc = t.detach().to(torch.float32) + (r if r is not None else 0.0)
        frame = encode_tensor_frame(acc.to(t.dtype), self.codec)
        decoded = decode_tensor_frame(frame).to(torch.float32)
        self.residual = acc - decoded
        return frame

    def reset(self) -> None:
        self.residual = None
