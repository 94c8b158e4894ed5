"""A command of the CLI starts light: it imports neither torch nor trio (the control client is plain sockets)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_imports_no_event_loop_and_no_torch() -> None:
    """Every command (``status``, ``submit``, ``--watch``'s polls) paid trio's import (0.2 s of a 2-core machine's
    CPU, a fifth of the command's start) for the daemon's side of the control socket it never serves."""
    code = "import sys, arceusd.cli.commands; print(sorted(m for m in ('trio', 'torch') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
