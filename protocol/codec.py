"""msgpack encoding of registered messages, with hard limits and strict type checks.

A message travels as a msgpack map ``{field name: value}`` in declaration order (so the encoding of a value is
deterministic and can be signed). Its type id is not in the payload: it travels in the envelope header.

Decoding is defensive, in this order: total size against the type's ``max_size``; msgpack's own length limits
(``max_str_len``/``max_bin_len``/``max_array_len``/``max_map_len`` derived from the payload size and our
limits, ``max_ext_len=0`` plus an ext hook that refuses every ext type) so that a declared length of 4 GiB
fails before anything is allocated; duplicate map keys are refused; then a walk that follows the schema (so
input nesting is bounded by the schema's depth) and checks every value's exact type (``bool`` is not an
``int``, an ``int`` is not a ``float``), per-field lengths, enum membership, and that the map holds exactly
the declared fields.

Error handling: whatever is wrong with received bytes raises :class:`RemoteProtocolError` (reasons
``unknown_type``, ``message_too_large``, ``malformed``, ``wrong_type``, ``missing_field``, ``unknown_field``,
``too_long``, ``bad_enum``). Encoding a value that does not fit its schema, or an encoding larger than the
type's ``max_size``, raises :class:`LocalProtocolError` - that is our bug, not the peer's.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar

import msgpack

from protocol import limits
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

M = TypeVar("M")

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


class _Pairs:
    """A decoded msgpack map as its key/value pairs (keeps duplicates visible)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise ValueError(f"ext type {code} is not allowed")


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
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            use_list=False,
            strict_map_key=True,
            object_pairs_hook=_Pairs,
            ext_hook=_refuse_ext,
            max_str_len=min(size, limits.MAX_STR_LEN),
            max_bin_len=min(size, limits.MAX_BIN_LEN),
            max_array_len=min(size, limits.MAX_ARRAY_LEN),
            max_map_len=min(size, limits.MAX_MAP_LEN),
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(
            "malformed", f"{schema.cls.__name__}: not valid msgpack within limits ({exc})"
        ) from None
    return _from_wire_msg(schema, raw, schema.cls.__name__)


def _from_wire_msg(schema: Schema, raw: Any, where: str) -> object:
    if not isinstance(raw, _Pairs):
        _remote("wrong_type", where, f"expected a map, got {_kind(raw)}")
    expected = dict(schema.fields)
    values: dict[str, Any] = {}
    for key, val in raw.pairs:
        if type(key) is not str or key not in expected:
            _remote("unknown_field", where, f"unknown field {str(key)[:64]!r}")
        if key in values:
            _remote("malformed", where, f"duplicate field {key!r}")
        values[key] = _from_wire(expected[key], val, f"{where}.{key}")
    if len(values) != len(expected):
        missing = [n for n in expected if n not in values]
        _remote("missing_field", where, f"missing fields {missing}")
    return schema.cls(**values)


def _from_wire(ft: FieldType, v: Any, where: str) -> Any:
    if isinstance(ft, IntT):
        if type(v) is not int:
            _remote("wrong_type", where, f"expected int, got {_kind(v)}")
        return v
    if isinstance(ft, FloatT):
        if type(v) is not float:
            _remote("wrong_type", where, f"expected float, got {_kind(v)}")
        return v
    if isinstance(ft, BoolT):
        if type(v) is not bool:
            _remote("wrong_type", where, f"expected bool, got {_kind(v)}")
        return v
    if isinstance(ft, StrT):
        if type(v) is not str:
            _remote("wrong_type", where, f"expected str, got {_kind(v)}")
        if len(v) > ft.max_len or len(v.encode("utf-8")) > ft.max_len:
            _remote("too_long", where, f"str longer than {ft.max_len} bytes")
        return v
    if isinstance(ft, BytesT):
        if type(v) is not bytes:
            _remote("wrong_type", where, f"expected bytes, got {_kind(v)}")
        if len(v) > ft.max_len:
            _remote("too_long", where, f"bytes longer than {ft.max_len}")
        return v
    if isinstance(ft, EnumT):
        if type(v) is not int:
            _remote("wrong_type", where, f"expected int ({ft.cls.__name__}), got {_kind(v)}")
        try:
            return ft.cls(v)
        except ValueError:
            _remote("bad_enum", where, f"{v} is not a {ft.cls.__name__}")
    if isinstance(ft, SeqT):
        if type(v) is not tuple:
            _remote("wrong_type", where, f"expected array, got {_kind(v)}")
        if len(v) > ft.max_len:
            _remote("too_long", where, f"array longer than {ft.max_len}")
        return tuple(_from_wire(ft.item, x, where + "[]") for x in v)
    if isinstance(ft, OptT):
        return None if v is None else _from_wire(ft.inner, v, where)
    return _from_wire_msg(schema_of(ft.cls), v, where)


def _kind(v: Any) -> str:
    if isinstance(v, _Pairs):
        return "map"
    return type(v).__name__


def _remote(reason: str, where: str, what: str) -> NoReturn:
    raise RemoteProtocolError(reason, f"{where}: {what}")
