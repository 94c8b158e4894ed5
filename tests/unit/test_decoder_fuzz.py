"""Seeded fuzzing of the three decoders that face the network: the message codec, the envelope opener and the
tensor-frame decoder. Over 10,000 generated and mutated inputs; the only exception allowed out is
RemoteProtocolError, and no single input may take long (no hangs, no big allocations)."""

from __future__ import annotations

import contextlib
import random
import struct
import time
from typing import Any

import msgpack
import pytest
import torch

from arceusd.base.identity import Identity
from protocol import codec, compression, envelope
from protocol.decoding import decode_tensor_frame
from protocol.errors import RemoteProtocolError
from protocol.messages import (
    BoolT,
    BytesT,
    EnumT,
    FieldType,
    FloatT,
    IntT,
    MsgT,
    OptT,
    Schema,
    SeqT,
    StrT,
    registered_messages,
    schema_of,
)
from protocol.replay import ReplayGuard
from protocol.tensors import DTYPE_CODES, RAW, TensorCodec, encode_tensor_frame

SEED = 20240601
PER_INPUT_LIMIT_S = 0.5
INTERESTING = [
    0x00,
    0x01,
    0x7F,
    0x80,
    0xFF,
    0xC0,
    0xC1,
    0xC2,
    0xC4,
    0xC6,
    0xC9,
    0xD4,
    0xDB,
    0xDD,
    0xDF,
    0x91,
    0x81,
]
LENGTH_BOMBS = [
    b"\xdb\xff\xff\xff\xff",
    b"\xc6\x7f\xff\xff\xff",
    b"\xdd\xff\xff\xff\xff",
    b"\xdf\x00\x01\x00\x00",
]


def random_value(ft: FieldType, rng: random.Random) -> Any:
    if isinstance(ft, IntT):
        return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randrange(-(10**6), 10**6)])
    if isinstance(ft, FloatT):
        return rng.choice([0.0, -1.5, 1e300, rng.uniform(-1e3, 1e3)])
    if isinstance(ft, BoolT):
        return rng.random() < 0.5
    if isinstance(ft, StrT):
        return "".join(rng.choice("abc0123é☃") for _ in range(rng.randrange(min(ft.max_len // 4, 12) + 1)))
    if isinstance(ft, BytesT):
        return rng.randbytes(rng.randrange(min(ft.max_len, 40) + 1))
    if isinstance(ft, EnumT):
        return rng.choice(list(ft.cls))
    if isinstance(ft, SeqT):
        return tuple(random_value(ft.item, rng) for _ in range(rng.randrange(min(ft.max_len, 3) + 1)))
    if isinstance(ft, OptT):
        return None if rng.random() < 0.3 else random_value(ft.inner, rng)
    assert isinstance(ft, MsgT)
    return random_message(schema_of(ft.cls), rng)


def random_message(schema: Schema, rng: random.Random) -> Any:
    return schema.cls(**{name: random_value(ft, rng) for name, ft in schema.fields})


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[min(pos, len(b) - 1)] = rng.choice(INTERESTING)
        elif op == 2:
            b[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and b:
            del b[pos : pos + rng.randint(1, 8)]
        elif op == 4:
            del b[pos:]
        elif op == 5:
            b[pos:pos] = rng.choice(LENGTH_BOMBS)
        elif op == 6 and b:
            end = min(len(b), pos + rng.randint(1, 16))
            b[pos:pos] = b[pos:end] * rng.randint(1, 50)
        elif op == 7 and len(b) >= 8:
            at = rng.randrange(len(b) - 7)
            b[at : at + 8] = struct.pack(">Q", rng.choice([0, 1, 2**31, 2**63, 2**64 - 1]))
    return bytes(b)


ODD_VALUES: list[Any] = [
    0,
    -1,
    2**64 - 1,
    1.5,
    True,
    None,
    b"x",
    "s",
    [],
    {},
    [[[]]],
    {"a": {"b": 1}},
    [1, "x"],
]


def mutate_structure(data: bytes, rng: random.Random) -> bytes:
    """Decode valid msgpack, change one value/key somewhere (type swap, drop, extra, wrap), encode again: the
    result is well-formed msgpack, so it exercises the schema checks rather than the parser."""
    obj = msgpack.unpackb(data, raw=False)
    maps: list[dict[Any, Any]] = []

    def collect(o: Any) -> None:
        if isinstance(o, dict):
            maps.append(o)
            for v in o.values():
                collect(v)
        elif isinstance(o, list):
            for v in o:
                collect(v)

    collect(obj)
    target = rng.choice(maps)
    op = rng.randrange(4)
    if op == 0 and target:
        target[rng.choice(list(target))] = rng.choice(ODD_VALUES)
    elif op == 1 and target:
        del target[rng.choice(list(target))]
    elif op == 2:
        target[rng.choice(["zz", "seq", ""])] = rng.choice(ODD_VALUES)
    elif target:
        key = rng.choice(list(target))
        target[key] = [target[key]]
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _expect_only_remote(fn: Any, *args: Any, **kw: Any) -> None:
    start = time.perf_counter()
    with contextlib.suppress(RemoteProtocolError):
        fn(*args, **kw)
    took = time.perf_counter() - start
    assert took < PER_INPUT_LIMIT_S, f"one input took {took:.3f}s"


def _fuzz_messages(rng: random.Random, n: int) -> int:
    schemas = registered_messages()
    ids = [s.type_id for s in schemas]
    for i in range(n):
        schema = rng.choice(schemas)
        valid = codec.encode(random_message(schema, rng))
        assert codec.decode(schema.type_id, valid) is not None
        if i % 10 == 0:
            data = rng.randbytes(rng.randrange(64))
        elif i % 2:
            data = mutate_structure(valid, rng)
        else:
            data = mutate(valid, rng)
        type_id = schema.type_id if rng.random() < 0.8 else rng.choice([*ids, 0, 9999])
        _expect_only_remote(codec.decode, type_id, data)
    return n


def _fuzz_envelopes(rng: random.Random, n: int) -> int:
    alice, bob = Identity.generate(), Identity.generate()
    keys = {alice.peer_id: alice.public_key_raw}
    guard = ReplayGuard(max_keys=64, max_tombstones=64)
    schemas = registered_messages()
    now = 1_700_000_000_000
    jobs = [envelope.NO_JOB, "ab" * 16]
    for i in range(n):
        schema = rng.choice(schemas)
        payload = codec.encode(random_message(schema, rng))
        authentic = i % 2 == 0
        if authentic:
            payload = (
                mutate_structure(payload, rng) if i % 4 == 0 else mutate(payload, rng)
            )  # signed, so only the post-signature checks and the codec refuse it
        frame = envelope.seal(
            alice,
            msg_type=schema.type_id if rng.random() < 0.9 else rng.randrange(65536),
            payload=payload,
            boot_id=rng.randrange(3),
            seq=rng.randrange(2000),
            timestamp_ms=now + rng.randrange(-60_000, 60_000),
            recipient=rng.choice([bob.peer_id, envelope.BROADCAST, alice.peer_id]),
            job_id=rng.choice(jobs),
            term=rng.randrange(4),
            epoch=rng.randrange(4),
            stream_id=rng.randrange(3),
        )
        if not authentic:
            frame = mutate(frame, rng)
        _expect_only_remote(
            envelope.open_message,
            frame,
            lookup_key=keys.get,
            expect_recipient=bob.peer_id,
            expect_job=rng.choice([None, *jobs]),
            replay_guard=guard,
            now_ms=now,
            min_term=rng.randrange(3),
            min_epoch=rng.randrange(3),
        )
    return n


def _fuzz_tensors(rng: random.Random, n: int) -> int:
    codecs: list[TensorCodec] = [
        RAW,
        compression.Fp16Codec(),
        compression.Bf16Codec(),
        compression.Int8BlockCodec(rng.choice([1, 16, 256])),
        compression.TopKCodec(ratio=0.3),
    ]
    dtypes = list(DTYPE_CODES)
    for i in range(n):
        dtype = rng.choice(dtypes)
        shape = tuple(rng.randrange(5) for _ in range(rng.randrange(4)))
        codec_ = rng.choice(codecs if dtype.is_floating_point else codecs[:1])
        t = (torch.randn(shape) * 10).to(dtype)
        valid = encode_tensor_frame(t, codec_)
        data = mutate(valid, rng) if i % 10 else rng.randbytes(rng.randrange(64))
        expected = shape if rng.random() < 0.5 else None
        _expect_only_remote(decode_tensor_frame, data, expected_shape=expected, max_bytes=1 << 20)
    return n


@pytest.mark.timeout(120)
def test_decoders_only_raise_remote_protocol_error() -> None:
    rng = random.Random(SEED)
    start = time.perf_counter()
    total = _fuzz_messages(rng, 4000) + _fuzz_envelopes(rng, 2500) + _fuzz_tensors(rng, 4000)
    assert total >= 10_000
    assert time.perf_counter() - start < 60
