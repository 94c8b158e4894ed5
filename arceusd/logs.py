"""Logging setup: stderr in the foreground, a file in the state directory as a service; and ``arceusd logs``."""

from __future__ import annotations

import logging
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
        handler = logging.FileHandler(log_file, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("zeroconf", "grpc"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (without reading the whole file into memory)."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        return [line.rstrip("\n") for line in deque(fh, maxlen=lines)]
