"""Logging setup: stderr in the foreground, a file in the state directory as a service; and ``arceusd logs``.

The log file is the daemon user's alone (mode 0600, whoever created it and whatever the umask: issue 29): it
names peers, jobs and paths another local user has no business reading.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import deque
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str, log_file: Path | None) -> None:
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        make_private(log_file)
        handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("zeroconf", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def make_private(path: Path) -> None:
    """Create ``path`` if it is missing, mode 0600 from the start, and make an existing one 0600.

    Error handling: OSError when it cannot be created or is not ours to change."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def open_private_log(path: Path) -> int:
    """``path`` opened for appending, as :func:`make_private` leaves it: a file descriptor (the caller closes it)."""
    make_private(path)
    return os.open(path, os.O_WRONLY | os.O_APPEND)


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (without reading the whole file into memory)."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return [line.rstrip("\n") for line in deque(fh, maxlen=lines)]
