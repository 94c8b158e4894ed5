"""A msgpack decoder driven by a message's schema: a peer's bytes build only what the schema allows where it stands.

This module owns turning a payload's bytes into a registered message (:func:`read_message`; the codec checks
the payload's size against the type's ``max_size`` first). It reads the msgpack bytes itself, one value at a
time, and at each position knows from the schema what may stand there, so:

* a tag of another kind (a map where an int belongs, an array nested deeper than the schema, an ext type, the
  reserved ``0xc1``) is refused by its first byte, before anything behind it is read or built;
* a declared length is checked against the bytes left (each array item and map entry takes at least one byte)
  and then the field's ``max_len`` before the value is built;
* nesting never goes deeper than the schema (at most ``limits.MAX_SCHEMA_DEPTH``), and a map holds only the
  declared fields, once each: the loop over a map's entries ends after at most its field count + 1 keys.

Hence what a payload of ``n`` bytes may allocate is bounded before it is built: every object built is a value
the schema allows in its place, takes at least one byte on the wire (one-byte values are small ints, bools,
None, empty or one-character strings and bytes: all shared singletons in CPython) and costs at most a few
dozen bytes of Python object per byte it took, so a payload never builds more than ``n`` objects nor more than
:data:`MAX_BYTES_PER_WIRE_BYTE` ``* n`` bytes (tested per type in ``tests/unit/test_wire_reader.py``). The
former decoder let msgpack build the whole tree before any check: 4 MiB of empty maps became 4 million
objects, ~500 MiB and 6 s on the event loop.

The accepted language is exactly what ``msgpack.unpackb(raw=False, strict_map_key=True)`` + a schema walk
accepted: ints as ints (``bool`` is not an ``int``, an ``int`` is not a ``float``; float32 and float64 both
read as ``float``), str as strict UTF-8, bin as ``bytes``, arrays as tuples, ``nil`` only for ``X | None``,
map keys only str, no duplicate keys, no trailing bytes.

Error handling: :class:`RemoteProtocolError` with reason ``malformed`` (truncated, trailing bytes, a declared
length beyond the bytes left, an ext type or reserved byte, a non-str or duplicate map key, invalid UTF-8),
``wrong_type``, ``unknown_field``, ``missing_field``, ``too_long`` or ``bad_enum``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NoReturn

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
    schema_of,
)

MAX_BYTES_PER_WIRE_BYTE = 32
"""What one byte of payload may cost in Python objects, at most (the bound the tests assert per type)."""

Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads one value at an offset of the payload; returns it and the offset after it."""

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_INTS = {
    0xCC: _U8,
    0xCD: _U16,
    0xCE: _U32,
    0xCF: struct.Struct(">Q"),
    0xD0: struct.Struct(">b"),
    0xD1: struct.Struct(">h"),
    0xD2: struct.Struct(">i"),
    0xD3: struct.Struct(">q"),
}
_FLOATS = {0xCA: struct.Struct(">f"), 0xCB: struct.Struct(">d")}
_STR_SIZED = {0xD9: _U8, 0xDA: _U16, 0xDB: _U32}
_BIN_SIZED = {0xC4: _U8, 0xC5: _U16, 0xC6: _U32}
_ARRAY_SIZED = {0xDC: _U16, 0xDD: _U32}
_MAP_SIZED = {0xDE: _U16, 0xDF: _U32}
_NEVER = frozenset({0xC1, 0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8})
"""The reserved byte and every ext type: never valid anywhere in a message."""

_CACHE: dict[type[Any], Reader] = {}


def read_message(schema: Schema, data: bytes) -> object:
    """Decode ``data`` (a whole payload) as a ``schema.cls``.

    Error handling: RemoteProtocolError (the reasons in the module docstring)."""
    reader = _message_reader(schema)
    try:
        value, end = reader(data, 0)
    except (IndexError, struct.error):
        _remote("malformed", schema.cls.__name__, "truncated")
    if end != len(data):
        _remote("malformed", schema.cls.__name__, f"{len(data) - end} trailing bytes")
    return value


# ----------------------------------------------------------------------------------------------------
# compiling a schema into readers (once per message class)
# ----------------------------------------------------------------------------------------------------


def _message_reader(schema: Schema) -> Reader:
    reader = _CACHE.get(schema.cls)
    if reader is None:
        reader = _CACHE[schema.cls] = _compile_message(schema, schema.cls.__name__)
    return reader


def _compile(ft: FieldType, where: str) -> Reader:
    if isinstance(ft, IntT):
        return _int_reader(where)
    if isinstance(ft, FloatT):
        return _float_reader(where)
    if isinstance(ft, BoolT):
        return _bool_reader(where)
    if isinstance(ft, StrT):
        return _str_reader(ft.max_len, where)
    if isinstance(ft, BytesT):
        return _bytes_reader(ft.max_len, where)
    if isinstance(ft, EnumT):
        return _enum_reader(ft, where)
    if isinstance(ft, SeqT):
        return _seq_reader(_compile(ft.item, where + "[]"), ft.max_len, where)
    if isinstance(ft, OptT):
        return _opt_reader(_compile(ft.inner, where))
    assert isinstance(ft, MsgT)
    return _lazy_message(ft.cls, where)


def _lazy_message(cls: type[Any], where: str) -> Reader:
    """A nested message's reader, compiled at first use (its class is registered by then)."""
    compiled: list[Reader] = []

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        if not compiled:
            compiled.append(_compile_message(schema_of(cls), where))
        return compiled[0](data, pos)

    return read


def _compile_message(schema: Schema, where: str) -> Reader:
    fields = {name.encode(): (name, _compile(ft, f"{where}.{name}")) for name, ft in schema.fields}
    count = len(fields)
    cls = schema.cls

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        if 0x80 <= tag <= 0x8F:
            n, pos = tag & 0x0F, pos + 1
        elif tag in _MAP_SIZED:
            n, pos = _sized(data, pos, _MAP_SIZED[tag])
        else:
            _wrong(data, pos, where, "a map")
        if 2 * n > len(data) - pos:
            _remote("malformed", where, f"a map of {n} entries in {len(data) - pos} bytes")
        values: dict[str, Any] = {}
        for _ in range(n):
            key, pos = _read_key(data, pos, where)
            entry = fields.get(key)
            if entry is None:
                _remote("unknown_field", where, f"unknown field {key[:64].decode('utf-8', 'replace')!r}")
            name, reader = entry
            if name in values:
                _remote("malformed", where, f"duplicate field {name!r}")
            values[name], pos = reader(data, pos)
        if len(values) != count:
            missing = [f.decode() for f in fields if f.decode() not in values]
            _remote("missing_field", where, f"missing fields {missing}")
        return cls(**values), pos

    return read


def _read_key(data: bytes, pos: int, where: str) -> tuple[bytes, int]:
    tag = data[pos]
    if 0xA0 <= tag <= 0xBF:
        n, pos = tag & 0x1F, pos + 1
    elif tag in _STR_SIZED:
        n, pos = _sized(data, pos, _STR_SIZED[tag])
    else:
        _remote("malformed", where, f"a map key that is not a str ({_kind(tag)})")
    if n > len(data) - pos:
        _remote("malformed", where, f"a key of {n} bytes in {len(data) - pos}")
    return data[pos : pos + n], pos + n


# ----------------------------------------------------------------------------------------------------
# readers of one value
# ----------------------------------------------------------------------------------------------------


def _int_reader(where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        if tag <= 0x7F:
            return tag, pos + 1
        if tag >= 0xE0:
            return tag - 0x100, pos + 1
        fmt = _INTS.get(tag)
        if fmt is None:
            _wrong(data, pos, where, "int")
        return fmt.unpack_from(data, pos + 1)[0], pos + 1 + fmt.size

    return read


def _float_reader(where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        fmt = _FLOATS.get(data[pos])
        if fmt is None:
            _wrong(data, pos, where, "float")
        return fmt.unpack_from(data, pos + 1)[0], pos + 1 + fmt.size

    return read


def _bool_reader(where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        if tag == 0xC2:
            return False, pos + 1
        if tag == 0xC3:
            return True, pos + 1
        _wrong(data, pos, where, "bool")

    return read


def _str_reader(max_len: int, where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        if 0xA0 <= tag <= 0xBF:
            n, pos = tag & 0x1F, pos + 1
        elif tag in _STR_SIZED:
            n, pos = _sized(data, pos, _STR_SIZED[tag])
        else:
            _wrong(data, pos, where, "str")
        _fits(data, pos, n, max_len, where, "str")
        try:
            return data[pos : pos + n].decode("utf-8"), pos + n
        except UnicodeDecodeError:
            _remote("malformed", where, "str is not valid UTF-8")

    return read


def _bytes_reader(max_len: int, where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        fmt = _BIN_SIZED.get(tag)
        if fmt is None:
            _wrong(data, pos, where, "bytes")
        n, pos = _sized(data, pos, fmt)
        _fits(data, pos, n, max_len, where, "bytes")
        return data[pos : pos + n], pos + n

    return read


def _enum_reader(ft: EnumT, where: str) -> Reader:
    read_int = _int_reader(where)
    cls = ft.cls

    def read(data: bytes, pos: int) -> tuple[Any, int]:
        v, pos = read_int(data, pos)
        try:
            return cls(v), pos
        except ValueError:
            _remote("bad_enum", where, f"{v} is not a {cls.__name__}")

    return read


def _seq_reader(item: Reader, max_len: int, where: str) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        if 0x90 <= tag <= 0x9F:
            n, pos = tag & 0x0F, pos + 1
        elif tag in _ARRAY_SIZED:
            n, pos = _sized(data, pos, _ARRAY_SIZED[tag])
        else:
            _wrong(data, pos, where, "array")
        _fits(data, pos, n, max_len, where, "array")
        out = []
        for _ in range(n):
            v, pos = item(data, pos)
            out.append(v)
        return tuple(out), pos

    return read


def _opt_reader(inner: Reader) -> Reader:
    def read(data: bytes, pos: int) -> tuple[Any, int]:
        if data[pos] == 0xC0:
            return None, pos + 1
        return inner(data, pos)

    return read


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------


def _sized(data: bytes, pos: int, fmt: struct.Struct) -> tuple[int, int]:
    """The length after a sized tag at ``pos``, and the offset after that length."""
    n: int = fmt.unpack_from(data, pos + 1)[0]
    return n, pos + 1 + fmt.size


def _fits(data: bytes, pos: int, n: int, max_len: int, where: str, what: str) -> None:
    """A declared length ``n`` (bytes, or items of at least one byte each) at ``pos``: within the bytes left,
    then within the field's limit."""
    if n > len(data) - pos:
        _remote("malformed", where, f"{what} of {n} declared, {len(data) - pos} bytes left")
    if n > max_len:
        _remote("too_long", where, f"{what} longer than {max_len}")


def _declared(data: bytes, pos: int) -> int:
    """What the tag at ``pos`` declares it holds (bytes or items); 0 for tags without a length."""
    tag = data[pos]
    fmt = _STR_SIZED.get(tag) or _BIN_SIZED.get(tag) or _ARRAY_SIZED.get(tag) or _MAP_SIZED.get(tag)
    if fmt is not None and pos + 1 + fmt.size <= len(data):
        return _sized(data, pos, fmt)[0]
    return 0


def _wrong(data: bytes, pos: int, where: str, expected: str) -> NoReturn:
    """Refuse the tag at ``pos``: ``malformed`` when it is never valid or declares more than is left (a
    length bomb is malformed whatever the schema), else ``wrong_type``."""
    tag = data[pos]
    if tag in _NEVER:
        _remote("malformed", where, f"{_kind(tag)} is not allowed")
    if _declared(data, pos) > len(data) - pos:
        _remote("malformed", where, f"{_kind(tag)} declares more than the {len(data) - pos} bytes left")
    _remote("wrong_type", where, f"expected {expected}, got {_kind(tag)}")


def _kind(tag: int) -> str:
    if tag <= 0x7F or tag >= 0xE0 or tag in _INTS:
        return "int"
    if 0x80 <= tag <= 0x8F or tag in _MAP_SIZED:
        return "map"
    if 0x90 <= tag <= 0x9F or tag in _ARRAY_SIZED:
        return "array"
    if 0xA0 <= tag <= 0xBF or tag in _STR_SIZED:
        return "str"
    if tag in _BIN_SIZED:
        return "bytes"
    if tag in _FLOATS:
        return "float"
    if tag in (0xC2, 0xC3):
        return "bool"
    if tag == 0xC0:
        return "nil"
    if tag == 0xC1:
        return "the reserved byte 0xc1"
    return "an ext type"


def _remote(reason: str, where: str, what: str) -> NoReturn:
    raise RemoteProtocolError(reason, f"{where}: {what}")
