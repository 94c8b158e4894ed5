"""Writing a file so that readers see the old one or the whole new one, never a part (torch-free, no imports of the
project beyond :mod:`arceusd.base.failpoints`): checkpoints, job records, the ledger's companions, the quote's
timings all write through :func:`atomic_write`."""

from __future__ import annotations

import os
from pathlib import Path

from arceusd.base import failpoints


def atomic_write(path: Path, data: bytes | memoryview, failpoint: str = "") -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part
    (a temporary file beside it, fsynced, renamed over it, the folder fsynced); ``failpoint``: a named point the
    tests may fail between the write and the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if failpoint:
        failpoints.hit(failpoint)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename in folder ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["atomic_write", "fsync_dir"]
