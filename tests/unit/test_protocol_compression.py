"""Compression codecs meet the error bounds their docstrings state; error feedback loses nothing."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import compression
from protocol.decoding import decode_tensor_frame
from protocol.error_feedback import ErrorFeedback
from protocol.errors import LocalProtocolError
from protocol.tensors import encode_tensor_frame

seeds = st.integers(0, 2**31)
sizes = st.integers(1, 3000)
scales = st.sampled_from([1e-3, 1.0, 1e3])


def _x(n: int, seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * scale


@settings(max_examples=60, deadline=None)
@given(sizes, seeds, scales)
def test_fp16_bound(n: int, seed: int, scale: float) -> None:
    x = _x(n, seed, scale)
    y = decode_tensor_frame(encode_tensor_frame(x, compression.Fp16Codec()))
    normal = x.abs() >= 2**-14
    err = (y - x).abs()
    assert bool((err[normal] <= 2**-11 * x.abs()[normal]).all())
    assert bool((err[~normal] <= 2**-25).all())


def test_fp16_overflow_is_refused() -> None:
    with pytest.raises(LocalProtocolError) as exc:
        encode_tensor_frame(torch.tensor([1e5]), compression.Fp16Codec())
    assert exc.value.reason == "fp16_overflow"


@settings(max_examples=60, deadline=None)
@given(sizes, seeds, scales)
def test_bf16_bound(n: int, seed: int, scale: float) -> None:
    x = _x(n, seed, scale)
    y = decode_tensor_frame(encode_tensor_frame(x, compression.Bf16Codec()))
    assert bool(((y - x).abs() <= 2**-8 * x.abs()).all())


@settings(max_examples=80, deadline=None)
@given(sizes, seeds, scales, st.sampled_from([1, 7, 64, 256, 1000]))
def test_int8_block_bound(n: int, seed: int, scale: float, block: int) -> None:
    x = _x(n, seed, scale)
    if n > 5:
        x[: n // 5] = 0.0  # include (partly) zero blocks
    y = decode_tensor_frame(encode_tensor_frame(x, compression.Int8BlockCodec(block)))
    nb = -(-n // block)
    padded = torch.nn.functional.pad(x, (0, nb * block - n)).view(nb, block)
    block_scale = (padded.abs().amax(dim=1) / 127.0).repeat_interleave(block)[:n]
    err = (y - x).abs()
    assert bool((err <= block_scale / 2 * (1 + 2**-16)).all())
    assert bool((y[x == 0] == 0).all())


def test_int8_block_refuses_non_finite() -> None:
    with pytest.raises(LocalProtocolError):
        encode_tensor_frame(torch.tensor([1.0, float("inf")]), compression.Int8BlockCodec())


def test_int8_wire_size() -> None:
    frame = encode_tensor_frame(torch.randn(4096), compression.Int8BlockCodec(256))
    plain = encode_tensor_frame(torch.randn(4096))
    assert len(frame) - len(plain) == (4096 + 16 * 4) - 4096 * 4 + 4  # body + u32 params


@settings(max_examples=60, deadline=None)
@given(sizes, seeds, st.floats(0.01, 1.0))
def test_topk_sends_largest_exactly(n: int, seed: int, ratio: float) -> None:
    x = _x(n, seed, 1.0)
    codec = compression.TopKCodec(ratio=ratio)
    y = decode_tensor_frame(encode_tensor_frame(x, codec))
    k = codec.k_for(n)
    sent = y != 0
    assert int(sent.sum()) == k  # randn has no exact zeros
    assert bool((y[sent] == x[sent]).all())  # sent values are exact
    if k < n:
        assert float(x[~sent].abs().max()) <= float(x[sent].abs().min())  # and they are the largest


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 500), seeds, st.integers(1, 6))
def test_error_feedback_carries_exactly_what_was_not_sent(n: int, seed: int, steps: int) -> None:
    ef = ErrorFeedback(compression.TopKCodec(k=max(1, n // 10)))
    total_in = torch.zeros(n, dtype=torch.float64)
    total_out = torch.zeros(n, dtype=torch.float64)
    for step in range(steps):
        x = _x(n, seed + step, 1.0)
        before = ef.residual.clone() if ef.residual is not None else torch.zeros(n)
        y = decode_tensor_frame(ef.encode(x))
        assert ef.residual is not None
        assert torch.equal(y + ef.residual, x + before)  # bitwise
        total_in += x.double()
        total_out += y.double()
    final = ef.residual
    assert final is not None
    assert torch.allclose(total_out + final.double(), total_in, atol=1e-4)


def test_error_feedback_shape_is_fixed() -> None:
    ef = ErrorFeedback(compression.TopKCodec(k=1))
    ef.encode(torch.ones(3))
    with pytest.raises(LocalProtocolError):
        ef.encode(torch.ones(4))
    ef.reset()
    ef.encode(torch.ones(4))


def test_codec_config_errors() -> None:
    for make in (
        lambda: compression.TopKCodec(),
        lambda: compression.TopKCodec(k=1, ratio=0.5),
        lambda: compression.TopKCodec(ratio=0.0),
        lambda: compression.Int8BlockCodec(0),
    ):
        with pytest.raises(LocalProtocolError):
            make()
