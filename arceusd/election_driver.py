"""Per-job leader election over the peer service (driver of the pure core in :mod:`arceusd.election`)."""

from __future__ import annotations

from typing import Any


def install_elections(node: Any, peers: Any) -> None:
    """Attach per-job elections to ``node`` (placeholder until the driver lands: no job elects yet)."""
    node.elections = None
