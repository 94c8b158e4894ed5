"""IDX headers (the MNIST file format), gzip or plain: read and validated without torch.

Owns: opening an IDX file (gzip detected by its magic bytes), parsing and validating its header, and reading an
exact number of bytes with clear errors. :mod:`arceusd.data.idx` reads the payload into a tensor; the job spec
checks (in the daemon, which never imports torch) need only the header.

Validation: the magic (zero prefix, known dtype code, 1..``MAX_NDIM`` dims), every dimension positive, and the
declared size against ``max_bytes`` before any payload is read (a hostile header or a gzip bomb cannot make us
allocate). Every problem raises :class:`~arceusd.data.errors.IdxFormatError` naming the file; a missing file
raises ``DataError``.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from arceusd.data.errors import DataError, IdxFormatError

GZIP_MAGIC = b"\x1f\x8b"
MAX_NDIM = 8
#: Default ceiling on an IDX payload (decompressed): 1 GiB. The full MNIST training images are 47 MB.
DEFAULT_MAX_BYTES = 1 << 30

#: IDX dtype code -> element size in bytes (the codes: uint8, int8, int16, int32, float32, float64).
IDX_ITEMSIZES: dict[int, int] = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


@dataclass(frozen=True)
class IdxHeader:
    """A validated IDX header: ``magic`` as the usual integer (e.g. 2051), element dtype code, shape."""

    magic: int
    code: int
    itemsize: int
    shape: tuple[int, ...]

    @property
    def payload_bytes(self) -> int:
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n

    @property
    def header_bytes(self) -> int:
        return 4 + 4 * len(self.shape)


def open_idx(path: Path) -> io.BufferedIOBase:
    """Open ``path`` for reading, transparently un-gzipping when the first bytes are the gzip magic."""
    try:
        with path.open("rb") as probe:
            head = probe.read(2)
        if head == GZIP_MAGIC:
            return gzip.open(path, "rb")
        return path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected an IDX file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror or e}") from None


def read_exact(f: io.BufferedIOBase, n: int, path: Path, what: str) -> bytes:
    try:
        data = f.read(n)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise IdxFormatError(f"{path}: corrupt gzip stream while reading {what}: {e}") from None
    if len(data) != n:
        raise IdxFormatError(f"{path}: truncated {what}: expected {n} bytes, file has only {len(data)}")
    return data


def parse_header(f: io.BufferedIOBase, path: Path, max_bytes: int) -> IdxHeader:
    magic_bytes = read_exact(f, 4, path, "IDX magic")
    if magic_bytes[:2] != b"\x00\x00":
        raise IdxFormatError(
            f"{path}: not an IDX file: magic starts with {magic_bytes[:2].hex()}, expected 0000 "
            "(IDX magic is 00 00 <dtype> <ndim>, e.g. 2051 for MNIST images, 2049 for labels)"
        )
    code, ndim = magic_bytes[2], magic_bytes[3]
    if code not in IDX_ITEMSIZES:
        allowed = ", ".join(f"0x{c:02x}" for c in IDX_ITEMSIZES)
        raise IdxFormatError(f"{path}: unknown IDX dtype code 0x{code:02x}; allowed: {allowed}")
    if not 1 <= ndim <= MAX_NDIM:
        raise IdxFormatError(f"{path}: IDX header declares {ndim} dimensions; allowed 1..{MAX_NDIM}")
    dims = struct.unpack(f">{ndim}I", read_exact(f, 4 * ndim, path, "IDX dimensions"))
    if any(d == 0 for d in dims):
        raise IdxFormatError(f"{path}: IDX dimensions {list(dims)} contain a zero; every dimension must be >= 1")
    header = IdxHeader(magic=int.from_bytes(magic_bytes, "big"), code=code, itemsize=IDX_ITEMSIZES[code], shape=dims)
    if header.payload_bytes > max_bytes:
        raise IdxFormatError(
            f"{path}: IDX dimensions {list(dims)} declare {header.payload_bytes} bytes of data, "
            f"over the limit of {max_bytes} bytes (raise max_bytes if the file is genuine)"
        )
    return header


def read_idx_header(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> IdxHeader:
    """Read and validate only the header of an IDX file (cheap: reads a few bytes even when gzipped)."""
    p = Path(path)
    with open_idx(p) as f:
        return parse_header(f, p, max_bytes)


__all__ = [
    "DEFAULT_MAX_BYTES",
    "GZIP_MAGIC",
    "IDX_ITEMSIZES",
    "MAX_NDIM",
    "IdxHeader",
    "open_idx",
    "parse_header",
    "read_exact",
    "read_idx_header",
]
