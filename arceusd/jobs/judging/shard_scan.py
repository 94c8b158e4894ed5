"""Checking a committed checkpoint shard inside the daemon, without torch: its safetensors header and its values.

The leader checks every shard of a checkpoint before it signs the manifest (issue #19): the parameters must be
exactly the names and shapes the writer's place in the plan implies, and no floating-point value may be a NaN or
an infinity. The expected shapes depend only on the spec and the plan, so they are computed once per plan in a
child process that has torch (:func:`arceusd.jobs.procs.filework.plan_shapes`); the per-commit scan here reads the
header itself and tests the values' exponent bits with byte slicing and ``bytes.translate`` (C speed, no numpy),
in a worker thread, chunk by chunk through a memory map (memory stays bounded whatever the shard's size). A
torch child per commit used to cost 2-4 s of CPU, so commits fell behind the workers of a fast job.

The same pass bounds each parameter tensor's largest magnitude from its values' exponent bits alone
(:class:`Magnitude`, within a factor of two), which the leader sets against how far the optimizer can move a
parameter between two checkpoints (:mod:`arceusd.jobs.judging.plausibility`, issue #29 item 8).

Everything here reads a file the leader already bounded (its size came from the plan, its digest matched the
member's report); the header is still parsed as untrusted input: lengths, offsets, dtypes and shapes are
checked against the file before any value is read.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from arceusd.files.safetensors_image import ITEM_BYTES, ImageError, described

Shapes = Mapping[str, tuple[int, ...]]
"""Parameter name (``param.blocks.<i>.<name>``) -> shape."""


def _table(test: object) -> bytes:
    """A ``bytes.translate`` table mapping each byte value to 1 where ``test(value)`` holds, else 0."""
    return bytes(1 if test(b) else 0 for b in range(256))  # type: ignore[operator]


_EXPONENT: dict[str, tuple[int, int, int, bytes, bytes]] = {
    # dtype: (item size, offset of the byte with the exponent's top bits, offset of the byte with the rest,
    #         top-byte table, rest-byte table); a float is a NaN or an infinity exactly when all its exponent bits
    #         are set (little-endian: the top byte is the last one)
    "F64": (8, 7, 6, _table(lambda b: b & 0x7F == 0x7F), _table(lambda b: b & 0xF0 == 0xF0)),
    "F32": (4, 3, 2, _table(lambda b: b & 0x7F == 0x7F), _table(lambda b: b & 0x80 == 0x80)),
    "BF16": (2, 1, 0, _table(lambda b: b & 0x7F == 0x7F), _table(lambda b: b & 0x80 == 0x80)),
    "F16": (2, 1, 1, _table(lambda b: b & 0x7C == 0x7C), _table(lambda b: True)),
}
"""How to find a non-finite value of each float dtype from its bytes alone (C-speed slicing and translation,
no numpy: the daemon imports neither torch nor numpy)."""

_FORMAT = {"F64": (11, 1023), "F32": (8, 127), "BF16": (8, 127), "F16": (5, 15)}
"""Exponent bits and bias of each float dtype: the exponent sits just below the sign bit, in the item's top two
bytes (little-endian: the last two)."""


class Magnitude(NamedTuple):
    """Bounds on the largest absolute value of a tensor (or of what was scanned of it): ``lower <= max |x| <
    upper``, read from the largest exponent (a factor of two apart; zero and subnormals: ``lower`` 0)."""

    lower: float
    upper: float

    @staticmethod
    def of_exponent(exponent: int, dtype: str) -> Magnitude:
        """The bounds of a largest biased exponent ``exponent`` of ``dtype``."""
        bias = _FORMAT[dtype][1]
        if exponent <= 0:
            return Magnitude(0.0, math.ldexp(1.0, 1 - bias))
        return Magnitude(math.ldexp(1.0, exponent - bias), math.ldexp(1.0, exponent - bias + 1))


def _any_both(a: bytes, b: bytes) -> bool:
    """Whether some position holds 1 in both 0/1 byte strings ``a`` and ``b`` (big-integer AND: C speed)."""
    return int.from_bytes(a, "little") & int.from_bytes(b, "little") != 0


_MASK7 = bytes(b & 0x7F for b in range(256))


def _max_exponent(data: bytes, dtype: str) -> int:
    """The largest biased exponent of the little-endian floats in ``data`` (a whole number of them, all finite),
    with C-speed slicing and translation: the top byte's seven exponent bits first, then the next byte's among
    the values that share the largest top byte."""
    item = ITEM_BYTES[dtype]
    bits = _FORMAT[dtype][0]
    tops = data[item - 1 :: item].translate(_MASK7)
    top = max(tops, default=0)
    if bits <= 7:  # F16: every exponent bit is in the top byte (bits 6..2)
        return top >> (7 - bits)
    low_bits = bits - 7  # in the next byte's top bits
    at_top = tops.translate(bytes(1 if b == top else 0 for b in range(256)))
    nexts = data[item - 2 :: item]
    for low in range((1 << low_bits) - 1, 0, -1):
        table = bytes(1 if b >> (8 - low_bits) == low else 0 for b in range(256))
        if _any_both(at_top, nexts.translate(table)):
            return (top << low_bits) | low
    return top << low_bits


MAX_HEADER = 1 << 24
CHUNK_BYTES = 1 << 24
"""Values are tested this many bytes at a time (the temporary arrays stay this small)."""


class ShardScanError(ValueError):
    """The shard is not what its place in the plan implies; the message says what is wrong."""


def _non_finite(data: bytes, dtype: str) -> bool:
    """Whether the little-endian floats in ``data`` (a whole number of them) hold a NaN or an infinity."""
    item, top, rest, top_table, rest_table = _EXPONENT[dtype]
    tops = data[top::item].translate(top_table)
    if b"\x01" not in tops:
        return False  # the common case: no value has its exponent's top bits all set
    rests = data[rest::item].translate(rest_table)
    return int.from_bytes(tops, "little") & int.from_bytes(rests, "little") != 0


def _scan_values(mapped: mmap.mmap, begin: int, end: int, dtype: str, measure: bool) -> int | None:
    """Read the floats at ``begin:end`` of ``mapped`` chunk by chunk: None when one is non-finite, else their
    largest biased exponent when ``measure`` (0 otherwise)."""
    item = _EXPONENT[dtype][0]
    step = CHUNK_BYTES - CHUNK_BYTES % item
    largest = 0
    for at in range(begin, end, step):
        chunk = mapped[at : min(end, at + step)]
        if _non_finite(chunk, dtype):
            return None
        if measure:
            largest = max(largest, _max_exponent(chunk, dtype))
    return largest


def scan_shard(path: Path, expected: Shapes | None) -> dict[str, Magnitude]:
    """Check the shard at ``path``: its ``param.*`` tensors are exactly ``expected`` (names and shapes), every
    tensor lies within the file, and no floating-point value is a NaN or an infinity (``expected`` None: any
    parameters). Returns the bounds on each non-empty floating-point parameter tensor's largest magnitude.
    :class:`ShardScanError` says what is wrong;
    :class:`OSError` when the file cannot be read."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size < 8:
            raise ShardScanError("it is shorter than a safetensors header")
        fh.seek(0)
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > min(size - 8, MAX_HEADER):
            raise ShardScanError("its safetensors header length is out of range")
        try:
            header = json.loads(fh.read(n))
        except ValueError:
            raise ShardScanError("its safetensors header is not JSON") from None
        try:
            entries = described(header, size - 8 - n)
        except ImageError as exc:
            raise ShardScanError(str(exc)) from None
        got = {k: shape for k, (_, shape, _, _) in entries.items() if k.startswith("param.")}
        want = got if expected is None else {k: tuple(v) for k, v in expected.items()}
        if got != want:
            wrong = sorted(set(got) ^ set(want)) or sorted(k for k in got if got[k] != want[k])
            raise ShardScanError(f"its shard's parameters are not its stage's (names or shapes differ: {wrong[:3]})")
        floats = [(k, e) for k, e in sorted(entries.items()) if e[0] in _EXPONENT and e[3] > e[2]]
        magnitudes: dict[str, Magnitude] = {}
        if not floats:
            return magnitudes
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            for name, (dtype, _, begin, end) in floats:
                param = name.startswith("param.")
                largest = _scan_values(mapped, 8 + n + begin, 8 + n + end, dtype, param)
                if largest is None:
                    raise ShardScanError(f"its shard holds non-finite values ({name})")
                if param:
                    magnitudes[name] = Magnitude.of_exponent(largest, dtype)
        return magnitudes


def scan_all(folder: Path) -> dict[str, dict[str, Magnitude]]:
    """:func:`scan_shard` of every shard (``*.safetensors``) in ``folder`` (a committed step's, already checked
    when it was committed): file name -> its parameters' magnitudes."""
    return {path.name: scan_shard(path, None) for path in sorted(folder.glob("*.safetensors"))[:4096]}


__all__ = ["ITEM_BYTES", "Magnitude", "Shapes", "ShardScanError", "scan_all", "scan_shard"]
