"""The schema-driven decoder (protocol/wire_reader.py): it accepts exactly what the former decoder (msgpack
builds the whole tree, then a walk checks it against the schema) accepted, with the same values; junk that
msgpack would have built costs it nothing; and a valid payload of any registered type allocates at most
MAX_BYTES_PER_WIRE_BYTE per byte (issue 29: 4 MiB of empty maps cost 500 MiB)."""

from __future__ import annotations

import random
import time
import tracemalloc
from typing import Any

import msgpack
import pytest

from protocol import codec, limits
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.gossip import SwimNack
from protocol.messages import (
    Address,
    BoolT,
    BytesT,
    EnumT,
    FieldType,
    FloatT,
    IntT,
    JoinRequest,
    MsgT,
    OptT,
    Schema,
    SeqT,
    StrT,
    registered_messages,
    schema_of,
)
from protocol.wire_reader import MAX_BYTES_PER_WIRE_BYTE
from tests.unit.test_decoder_fuzz import mutate, mutate_structure, random_message

SEED = 29


# --- the former decoder, kept here as the reference ------------------------------------------------------


class _Pairs:
    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError("ext")


def reference_decode(schema: Schema, data: bytes) -> object:
    """What protocol/codec.py did before issue 29 (msgpack.unpackb, then a walk): raises on refusal."""
    if len(data) > schema.max_size:
        raise RemoteProtocolError("message_too_large", "")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=True,
            object_pairs_hook=_Pairs,
            ext_hook=_refuse_ext,
            max_str_len=min(len(data), limits.MAX_STR_LEN),
            max_bin_len=min(len(data), limits.MAX_BIN_LEN),
            max_array_len=min(len(data), limits.MAX_ARRAY_LEN),
            max_map_len=min(len(data), limits.MAX_MAP_LEN),
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException):
        raise RemoteProtocolError("malformed", "") from None
    return _ref_msg(schema, raw)


def _ref_msg(schema: Schema, raw: Any) -> object:
    if not isinstance(raw, _Pairs):
        raise RemoteProtocolError("wrong_type", "")
    expected = dict(schema.fields)
    values: dict[str, Any] = {}
    for key, val in raw.pairs:
        if type(key) is not str or key not in expected or key in values:
            raise RemoteProtocolError("unknown_field", "")
        values[key] = _ref(expected[key], val)
    if len(values) != len(expected):
        raise RemoteProtocolError("missing_field", "")
    return schema.cls(**values)


def _ref(ft: FieldType, v: Any) -> Any:
    scalar: dict[type[Any], type[Any]] = {IntT: int, FloatT: float, BoolT: bool, StrT: str, BytesT: bytes}
    for kind, typ in scalar.items():
        if isinstance(ft, kind):
            if type(v) is not typ:
                raise RemoteProtocolError("wrong_type", "")
            if isinstance(ft, (StrT, BytesT)) and len(v.encode() if typ is str else v) > ft.max_len:
                raise RemoteProtocolError("too_long", "")
            return v
    if isinstance(ft, EnumT):
        if type(v) is not int:
            raise RemoteProtocolError("wrong_type", "")
        try:
            return ft.cls(v)
        except ValueError:
            raise RemoteProtocolError("bad_enum", "") from None
    if isinstance(ft, SeqT):
        if type(v) is not tuple or len(v) > ft.max_len:
            raise RemoteProtocolError("wrong_type", "")
        return tuple(_ref(ft.item, x) for x in v)
    if isinstance(ft, OptT):
        return None if v is None else _ref(ft.inner, v)
    assert isinstance(ft, MsgT)
    return _ref_msg(schema_of(ft.cls), v)


def _outcome(fn: Any, *args: Any) -> tuple[bool, Any]:
    try:
        return True, fn(*args)
    except RemoteProtocolError:
        return False, None


def test_accepts_exactly_what_the_former_decoder_accepted() -> None:
    rng = random.Random(SEED)
    schemas = registered_messages()
    accepted = refused = 0
    for i in range(6_000):
        schema = rng.choice(schemas)
        valid = codec.encode(random_message(schema, rng))
        data = valid if i % 5 == 0 else mutate_structure(valid, rng) if i % 2 else mutate(valid, rng)
        new, ref = _outcome(codec.decode, schema.type_id, data), _outcome(reference_decode, schema, data)
        # (by repr: a NaN float decoded alike by both is equal there, never under ==)
        assert repr(new) == repr(ref), f"{schema.cls.__name__}: {data[:80]!r}"
        accepted, refused = accepted + new[0], refused + (not new[0])
    assert accepted > 1_000 and refused > 1_000


def test_float32_and_every_int_width_read_like_msgpack() -> None:
    for seq in (0, 127, 128, 255, 256, 65_535, 65_536, 2**32, 2**64 - 1, -1, -32, -33, -129, -(2**31) - 1, -(2**63)):
        data = msgpack.packb({"seq": seq}, use_bin_type=True)
        assert codec.decode_as(SwimNack, data).seq == seq
    offer = codec.encode(JoinRequest("a" * 32, "b" * 32, Address("h", 1), 1, 0.1))
    wire = msgpack.unpackb(offer)
    single = msgpack.packb(wire, use_bin_type=True, use_single_float=True)
    assert len(single) < len(offer)
    assert codec.decode_as(JoinRequest, single).flops_per_s == msgpack.unpackb(single)["flops_per_s"]


# --- junk costs nothing -----------------------------------------------------------------------------------


def _junk(kind: str, size: int) -> bytes:
    """``size`` bytes of msgpack that the former decoder built in full before any check."""
    if kind == "empty_maps":  # {"<first field>": [[{}, {}, ...], ...]}
        inner = b"\xdc\xff\xff" + b"\x80" * 65_535
    elif kind == "empty_arrays":
        inner = b"\xdc\xff\xff" + b"\x90" * 65_535
    else:  # nested one-element arrays around small maps
        inner = b"\xdc\x40\x00" + b"\x91\x91\x81\xa1a\x00" * 0x4000
    n = max(1, (size - 16) // len(inner))
    return b"\xdc" + n.to_bytes(2, "big") + inner * n


@pytest.mark.parametrize("kind", ["empty_maps", "empty_arrays", "nested"])
def test_junk_of_every_big_type_costs_nothing(kind: str) -> None:
    for schema in registered_messages():
        if schema.max_size < 64 * 1024:
            continue
        first = schema.fields[0][0].encode()
        body = _junk(kind, schema.max_size - 64)
        data = bytes([0x81, 0xA0 | len(first)]) + first + body
        tracemalloc.start()
        start = time.perf_counter()
        try:
            with pytest.raises(RemoteProtocolError):
                codec.decode(schema.type_id, data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert time.perf_counter() - start < 0.05, schema.cls.__name__
        assert peak < 64 * 1024, (schema.cls.__name__, peak)


# --- a valid payload allocates at most MAX_BYTES_PER_WIRE_BYTE per byte --------------------------------------


def _dense(ft: FieldType, n: int) -> Any:
    """A value with many small allocating parts (ints past the small-int cache, two-character str and bytes,
    sequences of ``n`` items): the most objects per wire byte the schema allows."""
    if isinstance(ft, IntT):
        return 1000
    if isinstance(ft, FloatT):
        return 1.5
    if isinstance(ft, BoolT):
        return True
    if isinstance(ft, StrT):
        return "ab"[: ft.max_len]
    if isinstance(ft, BytesT):
        return b"ab"[: ft.max_len]
    if isinstance(ft, EnumT):
        return list(ft.cls)[-1]
    if isinstance(ft, SeqT):
        return tuple(_dense(ft.item, n) for _ in range(min(n, ft.max_len)))
    if isinstance(ft, OptT):
        return _dense(ft.inner, n)
    assert isinstance(ft, MsgT)
    schema = schema_of(ft.cls)
    return schema.cls(**{name: _dense(f, n) for name, f in schema.fields})


def _densest(schema: Schema) -> bytes:
    """The densest valid payload of ``schema`` that fits its ``max_size``."""

    def encode(n: int) -> bytes:
        return codec.encode(schema.cls(**{name: _dense(f, n) for name, f in schema.fields}))

    one, two = encode(1), encode(2)
    if len(two) == len(one):
        return one  # no sequences
    n = (schema.max_size - len(one)) // (len(two) - len(one)) + 1
    while True:
        try:
            return encode(n)
        except LocalProtocolError:
            n = n * 15 // 16


def test_a_valid_payload_allocates_at_most_a_constant_per_byte() -> None:
    worst = 0.0
    for schema in registered_messages():
        data = _densest(schema)
        tracemalloc.start()
        try:
            codec.decode(schema.type_id, data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        ratio = (peak - 4096) / len(data)
        worst = max(worst, ratio)
        assert ratio <= MAX_BYTES_PER_WIRE_BYTE, (schema.cls.__name__, len(data), peak)
    assert worst > 1  # the payloads did allocate: the bound was exercised
