"""IDX reader (the MNIST file format), gzip or plain, without numpy.

Owns: parsing and validating IDX headers and payloads into torch tensors.

Format (big-endian): two zero bytes, a dtype code, the number of dimensions, then one uint32 per dimension,
then the elements in row-major order. MNIST images are ``0x00 0x00 0x08 0x03`` (= 2051: uint8, 3 dims), labels
``0x00 0x00 0x08 0x01`` (= 2049: uint8, 1 dim). Gzip is detected by its magic bytes (``1f 8b``), not by the
name.

Validation: the magic (zero prefix, known dtype code, 1..``MAX_NDIM`` dims), every dimension positive, the
declared size against ``max_bytes`` *before* reading the payload (so a hostile header or a gzip bomb cannot
make us allocate), and the declared size against the bytes actually present (truncated and trailing data both
fail).

Error handling: every problem raises :class:`~arceusd.data.errors.IdxFormatError` naming the file and the
problem; a missing file raises ``DataError``.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from arceusd.data.errors import DataError, IdxFormatError

GZIP_MAGIC = b"\x1f\x8b"
MAX_NDIM = 8
#: Default ceiling on an IDX payload (decompressed): 1 GiB. The full MNIST training images are 47 MB.
DEFAULT_MAX_BYTES = 1 << 30

#: IDX dtype code -> (torch dtype, element size in bytes).
IDX_DTYPES: dict[int, tuple[torch.dtype, int]] = {
    0x08: (torch.uint8, 1),
    0x09: (torch.int8, 1),
    0x0B: (torch.int16, 2),
    0x0C: (torch.int32, 4),
    0x0D: (torch.float32, 4),
    0x0E: (torch.float64, 8),
}


@dataclass(frozen=True)
class IdxHeader:
    """A validated IDX header: ``magic`` as the usual integer (e.g. 2051), element dtype, shape."""

    magic: int
    dtype: torch.dtype
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


def _open(path: Path) -> io.BufferedIOBase:
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


def _read_exact(f: io.BufferedIOBase, n: int, path: Path, what: str) -> bytes:
    try:
        data = f.read(n)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise IdxFormatError(f"{path}: corrupt gzip stream while reading {what}: {e}") from None
    if len(data) != n:
        raise IdxFormatError(f"{path}: truncated {what}: expected {n} bytes, file has only {len(data)}")
    return data


def _parse_header(f: io.BufferedIOBase, path: Path, max_bytes: int) -> IdxHeader:
    magic_bytes = _read_exact(f, 4, path, "IDX magic")
    if magic_bytes[:2] != b"\x00\x00":
        raise IdxFormatError(
            f"{path}: not an IDX file: magic starts with {magic_bytes[:2].hex()}, expected 0000 "
            "(IDX magic is 00 00 <dtype> <ndim>, e.g. 2051 for MNIST images, 2049 for labels)"
        )
    code, ndim = magic_bytes[2], magic_bytes[3]
    if code not in IDX_DTYPES:
        allowed = ", ".join(f"0x{c:02x}" for c in IDX_DTYPES)
        raise IdxFormatError(f"{path}: unknown IDX dtype code 0x{code:02x}; allowed: {allowed}")
    if not 1 <= ndim <= MAX_NDIM:
        raise IdxFormatError(f"{path}: IDX header declares {ndim} dimensions; allowed 1..{MAX_NDIM}")
    dims = struct.unpack(f">{ndim}I", _read_exact(f, 4 * ndim, path, "IDX dimensions"))
    if any(d == 0 for d in dims):
        raise IdxFormatError(
            f"{path}: IDX dimensions {list(dims)} contain a zero; every dimension must be >= 1"
        )
    dtype, itemsize = IDX_DTYPES[code]
    header = IdxHeader(magic=int.from_bytes(magic_bytes, "big"), dtype=dtype, itemsize=itemsize, shape=dims)
    if header.payload_bytes > max_bytes:
        raise IdxFormatError(
            f"{path}: IDX dimensions {list(dims)} declare {header.payload_bytes} bytes of data, "
            f"over the limit of {max_bytes} bytes (raise max_bytes if the file is genuine)"
        )
    return header


def read_idx_header(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> IdxHeader:
    """Read and validate only the header of an IDX file (cheap: reads a few bytes even when gzipped)."""
    p = Path(path)
    with _open(p) as f:
        return _parse_header(f, p, max_bytes)


def read_idx(
    path: str | Path, *, expect_magic: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> torch.Tensor:
    """Read a whole IDX file into a tensor of its declared dtype and shape (uint8 for MNIST).

    ``expect_magic`` (e.g. 2051 for images, 2049 for labels) rejects a file of the wrong kind.
    Multi-byte dtypes are converted from big-endian to native order. The result owns its memory.
    """
    p = Path(path)
    with _open(p) as f:
        header = _parse_header(f, p, max_bytes)
        if expect_magic is not None and header.magic != expect_magic:
            raise IdxFormatError(
                f"{p}: IDX magic is {header.magic}, expected {expect_magic} "
                "(2051 = uint8 images with 3 dims, 2049 = uint8 labels with 1 dim)"
            )
        payload = _read_exact(f, header.payload_bytes, p, f"IDX data for shape {list(header.shape)}")
        try:
            extra = f.read(1)
        except (OSError, EOFError, zlib.error) as e:
            raise IdxFormatError(f"{p}: corrupt gzip stream after the IDX data: {e}") from None
        if extra:
            raise IdxFormatError(
                f"{p}: trailing bytes after the {header.payload_bytes} bytes of data declared by "
                f"dimensions {list(header.shape)}; the file is not a valid IDX file"
            )
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    if header.itemsize > 1:
        # Big-endian on disk: reverse the bytes of each element, then reinterpret.
        flat = flat.view(-1, header.itemsize).flip(1).contiguous().view(-1)
    return flat.view(header.dtype).reshape(header.shape)
