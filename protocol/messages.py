"""Control-plane message types: frozen dataclasses with append-only integer type ids.

This module owns the registry (``@message(type_id, max_size=...)``), the field schema derived from each
class's type hints, and the initial set of control messages. The msgpack encoding lives in
:mod:`protocol.codec`.

Declaring a message::

    @message(40, max_size=4096)
    @dataclass(frozen=True)
    class Hello:
        peer_id: str = field(metadata={"max_len": 64})
        ports: tuple[int, ...] = ()

Field types are drawn from a small set: ``int``, ``float``, ``bool``, ``str``, ``bytes``, an ``IntEnum``
subclass, ``tuple[X, ...]`` of any of these, another registered message, and ``X | None``. ``max_len`` field
metadata tightens the default length limit of a top-level str/bytes/tuple field (see :mod:`protocol.limits`).
Anything else is a :class:`LocalProtocolError` at import time, as is a duplicate type id or a schema deeper
than ``MAX_SCHEMA_DEPTH``.

Type ids are append-only: never reuse or renumber one; retire a type by leaving its id unused. Ids are uint16
(they travel in the envelope header). Peer ids and job ids are 32 lowercase hex characters (16 bytes).

==== ================ ========== ==========================================================================
id   type             max_size   meaning
==== ================ ========== ==========================================================================
1    Address          256        host + port of a daemon (nested only)
10   Ping             64 KiB     SWIM direct probe of ``target``; piggybacks gossip
11   Ack              64 KiB     reply to Ping / forwarded PingReq, same ``seq``; piggybacks gossip
12   PingReq          64 KiB     ask the receiver to probe ``target`` on our behalf (indirect probe)
13   Nack             1 KiB      Lifeguard: the indirect prober got no ack from ``target`` in time
14   MemberUpdate     4 KiB      one member's state claim (gossip unit); "alive" is signed by that peer
15   PushPull         1 MiB      full state exchange (anti-entropy); ``join`` marks a joiner's first sync
20   TermRequest      1 KiB      candidate asks to lead ``job_id`` in ``term``
21   TermAck          1 KiB      a member's vote on a TermRequest
30   JobAnnounce      1 MiB      a job exists: owner, spec bytes and their hash
31   JoinRequest      4 KiB      a device asks to become a member of a job
32   JoinReply        64 KiB     the job owner's / leader's answer
50-57 (gossip)                   SWIM driver messages and the peer hello: :mod:`protocol.gossip`
60-62 (elections)                vote request/reply, leader announce: :mod:`protocol.election_wire`
70-84 (jobs)                     job start/go/stop/report, shard, resume-slice, standby and data transfer, link
                                 echo: :mod:`protocol.job_wire`
==== ================ ========== ==========================================================================

Ids 10-15 are superseded by the signed-gossip messages 50-57 (the SWIM driver needs each update's origin and
signature); they stay reserved, never to be reused.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from protocol import limits
from protocol.errors import LocalProtocolError

# ----------------------------------------------------------------------------------------------------
# Schema: what a field may hold. Built once per class at registration; the codec walks it.
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntT:
    pass


@dataclass(frozen=True)
class FloatT:
    pass


@dataclass(frozen=True)
class BoolT:
    pass


@dataclass(frozen=True)
class StrT:
    max_len: int


@dataclass(frozen=True)
class BytesT:
    max_len: int


@dataclass(frozen=True)
class EnumT:
    cls: type[enum.IntEnum]


@dataclass(frozen=True)
class SeqT:
    item: FieldType
    max_len: int


@dataclass(frozen=True)
class OptT:
    inner: FieldType


@dataclass(frozen=True)
class MsgT:
    cls: type[Any]


FieldType = IntT | FloatT | BoolT | StrT | BytesT | EnumT | SeqT | OptT | MsgT


@dataclass(frozen=True)
class Schema:
    """The compiled description of one message type."""

    cls: type[Any]
    type_id: int
    max_size: int
    fields: tuple[tuple[str, FieldType], ...]
    depth: int


_BY_ID: dict[int, Schema] = {}
_BY_CLASS: dict[type[Any], Schema] = {}

T = TypeVar("T")


def message(type_id: int, *, max_size: int) -> Callable[[type[T]], type[T]]:
    """Register a frozen dataclass as a wire message with an append-only ``type_id`` (0 < id < 65536).

    Error handling: raises :class:`LocalProtocolError` (at import time) for a duplicate id, a class that is
    not a frozen dataclass, an unsupported field type, a ``max_size`` outside ``1..MAX_MESSAGE_SIZE`` or a
    schema nested deeper than ``limits.MAX_SCHEMA_DEPTH``.
    """

    def register(cls: type[T]) -> type[T]:
        if not (0 < type_id < 65536):
            raise LocalProtocolError("bad_type_id", f"{cls.__name__}: type id {type_id} is not in 1..65535")
        if type_id in _BY_ID:
            other = _BY_ID[type_id].cls.__name__
            raise LocalProtocolError(
                "duplicate_type_id",
                f"{cls.__name__}: type id {type_id} is already used by {other}; ids are append-only, pick a new one",
            )
        if not (0 < max_size <= limits.MAX_MESSAGE_SIZE):
            raise LocalProtocolError(
                "bad_max_size", f"{cls.__name__}: max_size {max_size} not in 1..{limits.MAX_MESSAGE_SIZE}"
            )
        params = getattr(cls, "__dataclass_params__", None)
        if not dataclasses.is_dataclass(cls) or params is None or not params.frozen:
            raise LocalProtocolError(
                "not_frozen_dataclass", f"{cls.__name__}: apply @dataclass(frozen=True) below @message"
            )
        hints = typing.get_type_hints(cls)
        fields: list[tuple[str, FieldType]] = []
        for f in dataclasses.fields(cls):
            ft = _compile(cls.__name__, f.name, hints[f.name], f.metadata.get("max_len"))
            fields.append((f.name, ft))
        if len(fields) > limits.MAX_MAP_LEN:
            raise LocalProtocolError("too_many_fields", f"{cls.__name__}: more than {limits.MAX_MAP_LEN} fields")
        depth = 1 + max((_depth(ft) for _, ft in fields), default=0)
        if depth > limits.MAX_SCHEMA_DEPTH:
            raise LocalProtocolError(
                "schema_too_deep", f"{cls.__name__}: nesting depth {depth} > {limits.MAX_SCHEMA_DEPTH}"
            )
        schema = Schema(cls=cls, type_id=type_id, max_size=max_size, fields=tuple(fields), depth=depth)
        _BY_ID[type_id] = schema
        _BY_CLASS[cls] = schema
        return cls

    return register


def _compile(owner: str, name: str, hint: Any, max_len: Any) -> FieldType:
    where = f"{owner}.{name}"
    if max_len is not None and (not isinstance(max_len, int) or max_len < 0):
        raise LocalProtocolError("bad_field_type", f"{where}: max_len metadata must be a non-negative int")
    ft = _compile_type(where, hint)
    if max_len is None:
        return ft
    if isinstance(ft, StrT):
        return StrT(min(max_len, ft.max_len))
    if isinstance(ft, BytesT):
        return BytesT(min(max_len, ft.max_len))
    if isinstance(ft, SeqT):
        return SeqT(ft.item, min(max_len, ft.max_len))
    raise LocalProtocolError("bad_field_type", f"{where}: max_len applies to str, bytes or tuple fields only")


def _compile_type(where: str, hint: Any) -> FieldType:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is bool:
        return BoolT()
    if hint is int:
        return IntT()
    if hint is float:
        return FloatT()
    if hint is str:
        return StrT(limits.MAX_STR_LEN)
    if hint is bytes:
        return BytesT(limits.MAX_BIN_LEN)
    if isinstance(hint, type) and issubclass(hint, enum.IntEnum):
        return EnumT(hint)
    if isinstance(hint, type) and hint in _BY_CLASS:
        return MsgT(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return SeqT(_compile_type(where, args[0]), limits.MAX_ARRAY_LEN)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = args[0] if args[1] is type(None) else args[1]
        return OptT(_compile_type(where, inner))
    raise LocalProtocolError(
        "bad_field_type",
        f"{where}: unsupported field type {hint!r}; use int, float, bool, str, bytes, an IntEnum, "
        "tuple[X, ...], X | None or a registered message (declared above this one)",
    )


def _depth(ft: FieldType) -> int:
    if isinstance(ft, SeqT):
        return 1 + _depth(ft.item)
    if isinstance(ft, OptT):
        return _depth(ft.inner)
    if isinstance(ft, MsgT):
        return _BY_CLASS[ft.cls].depth
    return 0


def schema_for_id(type_id: int) -> Schema | None:
    """The registered schema with this id, or None."""
    return _BY_ID.get(type_id)


def schema_of(cls: type[Any]) -> Schema:
    """The schema of a registered class. Raises LocalProtocolError for an unregistered one."""
    schema = _BY_CLASS.get(cls)
    if schema is None:
        raise LocalProtocolError("unregistered_message", f"{cls.__name__} is not a registered @message")
    return schema


def type_id_of(msg_or_cls: object) -> int:
    """The type id of a registered message instance or class."""
    cls = msg_or_cls if isinstance(msg_or_cls, type) else type(msg_or_cls)
    return schema_of(cls).type_id


def registered_messages() -> tuple[Schema, ...]:
    """All registered schemas, by type id (for tests and tooling)."""
    return tuple(_BY_ID[i] for i in sorted(_BY_ID))


# ----------------------------------------------------------------------------------------------------
# The initial control messages. Append new ones with new ids; never renumber.
# ----------------------------------------------------------------------------------------------------

ID_LEN: Final = 64
"""max_len for id fields (32 hex chars expected; semantic checks belong to the consumer)."""


_ID: Final = {"max_len": ID_LEN}


class MemberState(enum.IntEnum):
    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3


@message(1, max_size=256)
@dataclass(frozen=True)
class Address:
    host: str = field(metadata={"max_len": 253})
    port: int


@message(14, max_size=4096)
@dataclass(frozen=True)
class MemberUpdate:
    """``peer_id`` claims ``state`` at ``incarnation``. For ALIVE, ``public_key`` is the peer's raw Ed25519
    key and ``signature`` is that peer's signature over the encoding of this update with ``signature=b""``
    (the encoding is deterministic); SUSPECT/DEAD/LEFT are vouched for by the envelope's sender."""

    peer_id: str = field(metadata=_ID)
    address: Address
    incarnation: int
    state: MemberState
    public_key: bytes = field(default=b"", metadata={"max_len": 64})
    signature: bytes = field(default=b"", metadata={"max_len": 128})


@message(10, max_size=64 * 1024)
@dataclass(frozen=True)
class Ping:
    seq: int
    target: str = field(metadata=_ID)
    incarnation: int = 0
    """The sender's own incarnation."""
    piggyback: tuple[MemberUpdate, ...] = field(default=(), metadata={"max_len": 32})


@message(11, max_size=64 * 1024)
@dataclass(frozen=True)
class Ack:
    seq: int
    responder: str = field(metadata=_ID)
    incarnation: int = 0
    piggyback: tuple[MemberUpdate, ...] = field(default=(), metadata={"max_len": 32})


@message(12, max_size=64 * 1024)
@dataclass(frozen=True)
class PingReq:
    seq: int
    target: str = field(metadata=_ID)
    target_address: Address
    piggyback: tuple[MemberUpdate, ...] = field(default=(), metadata={"max_len": 32})


@message(13, max_size=1024)
@dataclass(frozen=True)
class Nack:
    seq: int
    target: str = field(metadata=_ID)


@message(15, max_size=1024 * 1024)
@dataclass(frozen=True)
class PushPull:
    members: tuple[MemberUpdate, ...] = field(metadata={"max_len": 4096})
    join: bool = False


@message(20, max_size=1024)
@dataclass(frozen=True)
class TermRequest:
    job_id: str = field(metadata=_ID)
    term: int
    candidate: str = field(metadata=_ID)
    plan_epoch: int = 0
    """The newest plan epoch the candidate knows (voters may refuse candidates that are behind)."""


@message(21, max_size=1024)
@dataclass(frozen=True)
class TermAck:
    job_id: str = field(metadata=_ID)
    term: int
    voter: str = field(metadata=_ID)
    granted: bool
    highest_term: int = 0
    """The highest term the voter has seen (lets a stale candidate catch up)."""


@message(30, max_size=1024 * 1024)
@dataclass(frozen=True)
class JobAnnounce:
    job_id: str = field(metadata=_ID)
    owner: str = field(metadata=_ID)
    spec_hash: bytes = field(metadata={"max_len": 64})
    spec: bytes = field(metadata={"max_len": 1024 * 1024 - 1024})


@message(31, max_size=4096)
@dataclass(frozen=True)
class JoinRequest:
    job_id: str = field(metadata=_ID)
    peer_id: str = field(metadata=_ID)
    address: Address
    free_memory_bytes: int = 0
    flops_per_s: float = 0.0
    # the device's measured calibration (arceusd.device.profile; defaults: uncalibrated)
    block_efficiency: float = 1.0
    dispatch_s: float = 0.0
    adamw_s_per_param: float = 0.0
    sgd_s_per_param: float = 0.0
    message_s: float = 0.0
    kind: str = field(default="cpu", metadata={"max_len": 16})


@message(32, max_size=64 * 1024)
@dataclass(frozen=True)
class JoinReply:
    job_id: str = field(metadata=_ID)
    accepted: bool
    reason: str = field(default="", metadata={"max_len": 1024})
    members: tuple[str, ...] = field(default=(), metadata={"max_len": 1024})
    done: bool = False  # the job is over (what a returning owner learns the end from)
    retry: bool = False  # a refusal that may pass soon (the leader holds the device dead): ask again
