"""Text data files without torch: reading a UTF-8 file with clear errors, its hash, and the train/validation cut.

Owns: what the daemon (which never imports torch) needs of a text data set to check a job spec; the vocabulary
and the tensors are :mod:`arceusd.data.text`'s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from arceusd.data.errors import DataError

#: Refuse text files above this size by default (256 MiB); a character model on more is out of scope here.
DEFAULT_MAX_TEXT_BYTES = 256 << 20


def split_point(length: int, val_fraction: float) -> int:
    """Index where validation starts: ``int(length * (1 - val_fraction))`` (nanoGPT's 90/10 for 0.1)."""
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}")
    return int(length * (1.0 - val_fraction))


def read_text(path: str | Path, *, max_bytes: int = DEFAULT_MAX_TEXT_BYTES) -> str:
    """Read a UTF-8 text file with clear errors (missing, too large, not UTF-8, empty)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise DataError(f"{p}: {size} bytes, over the limit of {max_bytes} bytes for a text data set")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{p}: is a directory, expected a UTF-8 text file") from None
    except OSError as e:
        raise DataError(f"{p}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not valid UTF-8 at byte {e.start}: {e.reason}") from None
    if not text:
        raise DataError(f"{p}: the text file is empty")
    return text


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes (streamed)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["DEFAULT_MAX_TEXT_BYTES", "file_sha256", "read_text", "split_point"]
