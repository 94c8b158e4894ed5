"""IDX reader (the MNIST file format), gzip or plain, without numpy.

Owns: reading IDX payloads into torch tensors (the header: :mod:`arceusd.data.idx_header`, torch-free).

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

import zlib
from pathlib import Path

import torch

from arceusd.data.errors import IdxFormatError
from arceusd.data.idx_header import (
    DEFAULT_MAX_BYTES,
    GZIP_MAGIC,
    MAX_NDIM,
    IdxHeader,
    open_idx,
    parse_header,
    read_exact,
    read_idx_header,
)

#: IDX dtype code -> torch dtype (sizes: :data:`arceusd.data.idx_header.IDX_ITEMSIZES`).
IDX_DTYPES: dict[int, torch.dtype] = {
    0x08: torch.uint8,
    0x09: torch.int8,
    0x0B: torch.int16,
    0x0C: torch.int32,
    0x0D: torch.float32,
    0x0E: torch.float64,
}

__all__ = ["DEFAULT_MAX_BYTES", "GZIP_MAGIC", "IDX_DTYPES", "MAX_NDIM", "IdxHeader", "read_idx", "read_idx_header"]


def read_idx(path: str | Path, *, expect_magic: int | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
    """Read a whole IDX file into a tensor of its declared dtype and shape (uint8 for MNIST).

    ``expect_magic`` (e.g. 2051 for images, 2049 for labels) rejects a file of the wrong kind.
    Multi-byte dtypes are converted from big-endian to native order. The result owns its memory.
    """
    p = Path(path)
    with open_idx(p) as f:
        header = parse_header(f, p, max_bytes)
        if expect_magic is not None and header.magic != expect_magic:
            raise IdxFormatError(
                f"{p}: IDX magic is {header.magic}, expected {expect_magic} "
                "(2051 = uint8 images with 3 dims, 2049 = uint8 labels with 1 dim)"
            )
        payload = read_exact(f, header.payload_bytes, p, f"IDX data for shape {list(header.shape)}")
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
    return flat.view(IDX_DTYPES[header.code]).reshape(header.shape)
