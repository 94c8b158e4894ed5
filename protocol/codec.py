"""msgpack encoding of registered messages, with hard limits and strict type checks.

A message travels as a msgpack map ``{field name: value}`` in declaration order (so the encoding of a value is
deterministic and can be signed). Its type id is not in the payload: it travels in the envelope header.

Decoding is defensive: the payload's size against the type's ``max_size``, then :mod:`protocol.wire_reader`
reads the bytes following the schema, so a value the schema does not allow in its place is refused by its
first byte and nothing is built before its type and declared length are checked (a length of 4 GiB, 4 MiB
of empty maps or arrays nested deeper than the schema cost nothing); every value's exact type (``bool`` is
not an ``int``, an ``int`` is not a ``float``), per-field lengths, enum membership, and that the map holds
exactly the declared fields, once each. What a payload may allocate is bounded by its size times a small
constant (:data:`protocol.wire_reader.MAX_BYTES_PER_WIRE_BYTE`).

Error handling: whatever is wrong with received bytes raises :class:`RemoteProtocolError` (reasons
``unknown_type``, ``message_too_large``, ``malformed``, ``wrong_type``, ``missing_field``, ``unknown_field``,
``too_long``, ``bad_enum``). Encoding a value that does not fit its schema, or an encoding larger than the
type's ``max_size``, raises :class:`LocalProtocolError` - that is our bug, not the peer's.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

import msgpack

from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.messages import (
    BoolT,
    BytesT,
    EnumT,
    FieldType,
    FloatT,
    IntT,
    OptT,
    Schema,
    SeqT,
    StrT,
    schema_for_id,
    schema_of,
)
from protocol.wire_reader import read_message

M = TypeVar("M")

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


# ----------------------------------------------------------------------------------------------------
# encode
# ----------------------------------------------------------------------------------------------------


def encode(msg: object) -> bytes:
    """The msgpack payload of a registered message instance.

    Error handling: LocalProtocolError when ``msg`` is not registered, a field value does not match its
    declared type or length limit, or the encoding is larger than the type's ``max_size``.
    """
    schema = schema_of(type(msg))
    data: bytes = msgpack.packb(_to_wire_msg(schema, msg), use_bin_type=True, strict_types=True)
    if len(data) > schema.max_size:
        raise LocalProtocolError(
            "message_too_large",
            f"{schema.cls.__name__} encodes to {len(data)} bytes > max_size {schema.max_size}; "
            "send less (split it) or raise max_size in its declaration",
        )
    return data


def _to_wire_msg(schema: Schema, msg: object) -> dict[str, Any]:
    if type(msg) is not schema.cls:
        _local(schema.cls.__name__, f"expected a {schema.cls.__name__}, got {type(msg).__name__}")
    out: dict[str, Any] = {}
    for name, ft in schema.fields:
        out[name] = _to_wire(f"{schema.cls.__name__}.{name}", ft, getattr(msg, name))
    return out


def _to_wire(where: str, ft: FieldType, v: Any) -> Any:
    if isinstance(ft, IntT):
        if type(v) is not int or not (_INT_MIN <= v <= _INT_MAX):
            _local(where, f"expected an int in msgpack range, got {type(v).__name__}")
        return v
    if isinstance(ft, FloatT):
        if type(v) is not float:
            _local(where, f"expected a float, got {type(v).__name__}")
        return v
    if isinstance(ft, BoolT):
        if type(v) is not bool:
            _local(where, f"expected a bool, got {type(v).__name__}")
        return v
    if isinstance(ft, StrT):
        if type(v) is not str:
            _local(where, f"expected a str, got {type(v).__name__}")
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError:
            _local(where, "str is not encodable as UTF-8 (lone surrogate?)")
        if n > ft.max_len:
            _local(where, f"str longer than {ft.max_len} bytes")
        return v
    if isinstance(ft, BytesT):
        if type(v) is not bytes:
            _local(where, f"expected bytes, got {type(v).__name__}")
        if len(v) > ft.max_len:
            _local(where, f"bytes longer than {ft.max_len}")
        return v
    if isinstance(ft, EnumT):
        if not isinstance(v, ft.cls):
            _local(where, f"expected a {ft.cls.__name__}, got {type(v).__name__}")
        return int(v)
    if isinstance(ft, SeqT):
        if type(v) is not tuple:
            _local(where, f"expected a tuple, got {type(v).__name__}")
        if len(v) > ft.max_len:
            _local(where, f"tuple longer than {ft.max_len}")
        return [_to_wire(where + "[]", ft.item, x) for x in v]
    if isinstance(ft, OptT):
        return None if v is None else _to_wire(where, ft.inner, v)
    return _to_wire_msg(schema_of(ft.cls), v)


def _local(where: str, what: str) -> NoReturn:
    raise LocalProtocolError("bad_field_value", f"{where}: {what}")


# ----------------------------------------------------------------------------------------------------
# decode
# ----------------------------------------------------------------------------------------------------


def decode(type_id: int, data: bytes | bytearray | memoryview) -> object:
    """Decode the payload of message type ``type_id`` (from an authenticated envelope header).

    Error handling: RemoteProtocolError (``unknown_type`` and the reasons in the module docstring).
    """
    schema = schema_for_id(type_id)
    if schema is None:
        raise RemoteProtocolError("unknown_type", f"no message type {type_id}; the peer may be newer than us")
    return _decode(schema, data)


def decode_as(cls: type[M], data: bytes | bytearray | memoryview) -> M:
    """Decode ``data`` as a ``cls`` (a registered message class)."""
    obj = _decode(schema_of(cls), data)
    return obj  # type: ignore[return-value]  # _decode builds exactly schema.cls


def _decode(schema: Schema, data: bytes | bytearray | memoryview) -> object:
    size = len(data) if not isinstance(data, memoryview) else data.nbytes
    if size > schema.max_size:
        raise RemoteProtocolError(
            "message_too_large", f"{schema.cls.__name__} of {size} bytes > max_size {schema.max_size}"
        )
    return read_message(schema, data if type(data) is bytes else bytes(data))
