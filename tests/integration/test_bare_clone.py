"""A newcomer's machine: this checkout ``git clone``d into an empty temporary folder (nothing beside it, so no
shared data folder and no sibling checkout), and the demo run there with a short ``--steps``. It must train, save the
model and print a sample. The current interpreter runs it with PYTHONPATH at the clone (the clone's own code, not
this checkout's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_demo_runs_in_a_bare_clone(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "arceus"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=120)
    assert [p.name for p in empty.iterdir()] == ["arceus"]  # nothing beside the clone
    assert (clone / "data" / "tinyshakespeare" / "input.txt").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("ARCEUS_STATE_DIR",)}
    env["PYTHONPATH"] = str(clone)
    proc = subprocess.run(
        [sys.executable, "-m", "arceusd", "demo", "--steps", "20", "--dir", str(tmp_path / "swarm")],
        cwd=clone, env=env, capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "model saved to" in out and "a sample from the trained model" in out, out[-4000:]
    assert "Traceback" not in out and "NumPy" not in out, out[-4000:]
    assert str(clone) in subprocess.run(
        [sys.executable, "-c", "import arceusd; print(arceusd.__file__)"], cwd=clone, env=env, capture_output=True,
        text=True, timeout=60,
    ).stdout  # fmt: skip
