"""Message registry and msgpack codec: round trips, strictness, limits and decoder bombs."""

from __future__ import annotations

import dataclasses
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codec, messages
from protocol.errors import LocalProtocolError, RemoteProtocolError
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
    message,
    registered_messages,
    schema_of,
)


def strategy_for(ft: FieldType, depth: int = 0) -> st.SearchStrategy[Any]:
    if isinstance(ft, IntT):
        return st.integers(min_value=-(2**63), max_value=2**64 - 1)
    if isinstance(ft, FloatT):
        return st.floats(allow_nan=False)
    if isinstance(ft, BoolT):
        return st.booleans()
    if isinstance(ft, StrT):
        return st.text(max_size=min(ft.max_len // 4, 20))
    if isinstance(ft, BytesT):
        return st.binary(max_size=min(ft.max_len, 40))
    if isinstance(ft, EnumT):
        return st.sampled_from(list(ft.cls))
    if isinstance(ft, SeqT):
        return st.lists(strategy_for(ft.item, depth + 1), max_size=min(ft.max_len, 3)).map(tuple)
    if isinstance(ft, OptT):
        return st.none() | strategy_for(ft.inner, depth)
    assert isinstance(ft, MsgT)
    return message_strategy(schema_of(ft.cls))


def message_strategy(schema: Schema) -> st.SearchStrategy[Any]:
    return st.builds(schema.cls, **{name: strategy_for(ft) for name, ft in schema.fields})


ALL = registered_messages()
any_message = st.one_of(*(message_strategy(s) for s in ALL))


def test_initial_ids_are_registered() -> None:
    ids = {s.cls.__name__: s.type_id for s in ALL}
    # Append-only ids other helpers rely on: changing any of these breaks the wire.
    assert ids["Ping"] == 10 and ids["Ack"] == 11 and ids["PingReq"] == 12 and ids["MemberUpdate"] == 14
    assert ids["PushPull"] == 15 and ids["TermRequest"] == 20 and ids["TermAck"] == 21
    assert ids["JobAnnounce"] == 30 and ids["JoinRequest"] == 31 and ids["JoinReply"] == 32


@settings(max_examples=300, deadline=None)
@given(any_message)
def test_every_message_round_trips(msg: Any) -> None:
    data = codec.encode(msg)
    assert codec.decode(messages.type_id_of(msg), data) == msg
    assert codec.decode_as(type(msg), data) == msg
    assert codec.encode(msg) == data  # deterministic: can be signed


def test_duplicate_type_id_is_local_error() -> None:
    with pytest.raises(LocalProtocolError) as exc:

        @message(10, max_size=100)
        @dataclass(frozen=True)
        class Clash:
            x: int

    assert exc.value.reason == "duplicate_type_id"


def test_unsupported_field_and_unfrozen_are_local_errors() -> None:
    with pytest.raises(LocalProtocolError) as exc:

        @message(60001, max_size=100)
        @dataclass(frozen=True)
        class WithList:
            x: list[int]

    assert exc.value.reason == "bad_field_type"
    with pytest.raises(LocalProtocolError) as exc:

        @message(60002, max_size=100)
        @dataclass
        class Mutable:
            x: int

    assert exc.value.reason == "not_frozen_dataclass"
    assert messages.schema_for_id(60001) is None and messages.schema_for_id(60002) is None


def test_encode_checks_types_and_size() -> None:
    with pytest.raises(LocalProtocolError):
        codec.encode(messages.Nack(seq="1", target="a" * 32))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        codec.encode(messages.Nack(seq=True, target="a" * 32))  # bool is not an int on the wire
    with pytest.raises(LocalProtocolError):
        codec.encode(messages.Nack(seq=1, target="a" * 65))  # over the field's max_len
    big = messages.JoinReply(job_id="a" * 32, accepted=True, members=tuple("b" * 64 for _ in range(1024)))
    with pytest.raises(LocalProtocolError) as exc:
        codec.encode(big)
    assert exc.value.reason == "message_too_large"


def _nack_map(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"seq": 7, "target": "a" * 32}
    base.update(over)
    return base


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_pack(_nack_map(seq=b"\x07")), "wrong_type"),  # bytes where int expected
        (_pack(_nack_map(seq=7.0)), "wrong_type"),
        (_pack(_nack_map(seq=True)), "wrong_type"),
        (_pack(_nack_map(target=7)), "wrong_type"),
        (_pack(_nack_map(extra=1)), "unknown_field"),
        (_pack({"seq": 7}), "missing_field"),
        (_pack([7, "a" * 32]), "wrong_type"),
        (_pack(_nack_map(target="a" * 65)), "too_long"),
        (_pack(_nack_map()) + b"\x00", "malformed"),  # trailing data
        (b"\x82\xa3seq\x07", "malformed"),  # truncated
        (_pack(_nack_map())[:-3], "malformed"),
        (b"\x83\xa3seq\x07\xa3seq\x08\xa6target\xa1a", "malformed"),  # duplicate key
        (b"\x82\x01\x07\xa6target\xa1a", "malformed"),  # int map key (strict_map_key)
        (b"\xd4\x05\x00", "malformed"),  # ext type
        (b"\xc7\x00\x05", "malformed"),  # zero-length ext type
        (b"\xc1", "malformed"),  # reserved byte
    ],
)
def test_decode_rejects_with_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode(messages.type_id_of(messages.Nack), payload)
    assert exc.value.reason == reason


def test_enum_and_nested_checks() -> None:
    upd = messages.MemberUpdate("a" * 32, messages.Address("h", 1), 1, messages.MemberState.ALIVE)
    wire = msgpack.unpackb(codec.encode(upd))
    wire["state"] = 9
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode_as(messages.MemberUpdate, _pack(wire))
    assert exc.value.reason == "bad_enum"
    wire["state"] = 0
    wire["address"] = {"host": "h"}
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode_as(messages.MemberUpdate, _pack(wire))
    assert exc.value.reason == "missing_field"


def test_unknown_type_id() -> None:
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode(65000, _pack({}))
    assert exc.value.reason == "unknown_type"


# --- bombs: each must fail fast with a typed error, without allocating what it declares -----------------


BOMBS = {
    "oversized": (b"\x80" + b"\x00" * (2 * 1024 * 1024), "message_too_large"),
    "bin32_4gib": (b"\x81\xa6target\xc6\xff\xff\xff\xff", "malformed"),
    "str32_4gib": (b"\x81\xa6target\xdb\xff\xff\xff\xff", "malformed"),
    "array32_4g_items": (b"\x81\xa6target\xdd\xff\xff\xff\xff", "malformed"),
    "map32_4g_items": (b"\xdf\xff\xff\xff\xff", "malformed"),
    "deep_nesting": (b"\x91" * 60_000, "wrong_type"),  # an array where the message's map belongs
    "deep_maps": (b"\x81\xa1a" * 5_000 + b"\x00", "unknown_field"),  # refused at its first key
    "ext32": (b"\xc9\xff\xff\xff\xff\x05", "malformed"),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decoder_bombs_fail_fast(name: str) -> None:
    payload, reason = BOMBS[name]
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(RemoteProtocolError) as exc:
            codec.decode_as(messages.Ping, payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.reason == reason
    assert time.perf_counter() - start < 0.5
    assert peak < 1 << 20  # nothing near the declared 4 GiB (or the 2 MiB input) was allocated


def test_nesting_deeper_than_schema_is_wrong_type() -> None:
    # Well-formed msgpack, small, but nested where the schema expects a str: refused at that level.
    nested: Any = "x"
    for _ in range(100):
        nested = [nested]
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode_as(messages.Ping, _pack({"seq": 1, "target": nested, "incarnation": 0, "piggyback": []}))
    assert exc.value.reason == "wrong_type"


def test_schema_field_order_is_declaration_order() -> None:
    msg = messages.TermAck(job_id="j" * 32, term=3, voter="v" * 32, granted=True)
    keys = list(msgpack.unpackb(codec.encode(msg)).keys())
    assert keys == [f.name for f in dataclasses.fields(messages.TermAck)]


def test_max_len_metadata_tightens() -> None:
    ping = schema_of(messages.Ping)
    fields = dict(ping.fields)
    assert fields["target"] == StrT(messages.ID_LEN)
    assert isinstance(fields["piggyback"], SeqT) and fields["piggyback"].max_len == 32
    too_many = messages.Ping(1, "a" * 32, 0, piggyback=tuple(_update(i) for i in range(33)))
    with pytest.raises(LocalProtocolError):
        codec.encode(too_many)


def _update(i: int) -> messages.MemberUpdate:
    return messages.MemberUpdate(f"{i:032x}", messages.Address("10.0.0.1", 7000 + i), i, messages.MemberState.SUSPECT)


def test_optional_fields_round_trip() -> None:
    @message(60010, max_size=512)
    @dataclass(frozen=True)
    class WithOpt:
        a: int | None
        b: tuple[messages.Address, ...] | None = None
        c: str = field(default="", metadata={"max_len": 8})

    for v in (WithOpt(None), WithOpt(5, (messages.Address("x", 1),), "abc")):
        assert codec.decode_as(WithOpt, codec.encode(v)) == v
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode_as(WithOpt, _pack({"a": None, "b": None, "c": "123456789"}))
    assert exc.value.reason == "too_long"


def test_a_job_starts_member_ids_are_bounded_and_checked() -> None:
    """``JobStart.members`` (issue 31: what a member shows as the job's members): at most ``JOB_MEMBERS_MAX`` ids
    on the wire, each a peer id; a leader's longest list fits the message."""
    from protocol.job_wire import JOB_MEMBERS_MAX, JobStart
    from protocol.validation import member_ids

    ids = tuple(f"{i:032x}" for i in range(JOB_MEMBERS_MAX))
    start = JobStart("a" * 32, 1, 1, b"{}", b"{}", b"{}", members=ids)
    assert codec.decode_as(JobStart, codec.encode(start)).members == ids
    with pytest.raises(LocalProtocolError):
        codec.encode(dataclasses.replace(start, members=(*ids, "f" * 32)))
    fields = {f.name: getattr(start, f.name) for f in dataclasses.fields(start)}
    too_many = _pack({**fields, "members": [*ids, "f" * 32]})
    with pytest.raises(RemoteProtocolError) as exc:
        codec.decode_as(JobStart, too_many)
    assert exc.value.reason == "too_long"
    assert member_ids(("b" * 32, "a" * 32, "b" * 32)) == ("a" * 32, "b" * 32)  # sorted, each once
    for bad in ("A" * 32, "a" * 31, "../" + "a" * 29, ""):
        with pytest.raises(RemoteProtocolError) as exc:
            member_ids(("a" * 32, bad))
        assert exc.value.reason == "bad_peer_id"
    with pytest.raises(RemoteProtocolError) as exc:
        member_ids(ids[:3], limit=2)
    assert exc.value.reason == "too_long"
