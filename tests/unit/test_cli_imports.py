"""A command of the CLI starts light: it imports neither torch nor trio (the control client is plain sockets), nor
the job machine or the planner, which only a daemon or a quote uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_imports_no_event_loop_and_no_torch() -> None:
    """Every command (``status``, ``submit``, ``--watch``'s polls) paid trio's import (0.2 s of a 2-core machine's
    CPU, a fifth of the command's start) for the daemon's side of the control socket it never serves, the job
    machine (0.2 s, for a view of a job's state) and the quote's estimate (0.13 s): 1.08 s to start, now 0.55 s."""
    heavy = ("trio", "torch", "arceusd.jobs.core.machine", "arceusd.market.estimate")
    code = f"import sys, arceusd.cli.commands; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
