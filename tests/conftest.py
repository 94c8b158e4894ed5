"""Shared pytest setup: make the source tree importable and expose the daemon harness."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: object) -> None:
    """Every local swarm of the run starts its daemons with one measurement of this machine, taken once by the
    first swarm (``arceusd.cli.swarm.PROFILE_ENV``): three daemons measuring at once on two cores each measured a
    third of it, and every daemon of the suite paid a torch import and a benchmark for it."""
    import os
    import tempfile

    from arceusd.cli.swarm import PROFILE_ENV

    if not os.environ.get(PROFILE_ENV):
        os.environ[PROFILE_ENV] = _MADE["profile"] = tempfile.mkdtemp(prefix="arceus-profile-")


_MADE: dict[str, str] = {}


def pytest_unconfigure(config: object) -> None:
    import shutil

    if "profile" in _MADE:
        shutil.rmtree(_MADE.pop("profile"), ignore_errors=True)
