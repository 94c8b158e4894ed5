"""The project's one formatter and its linter hold over every tracked Python file (issue 32): ``ruff format --check``
and ``ruff check`` run here so that CI, which runs the test suite, fails on an unformatted or unlinted file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("arceus", "arceusd", "protocol", "partitioner", "tests", "bench")


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    beside_python = Path(sys.executable).with_name("ruff")
    exe = str(beside_python) if beside_python.exists() else shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: run `pip install -e '.[dev]'` (make test does)")
    return subprocess.run([exe, *args, *SOURCES], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_file_is_as_ruff_format_writes_it() -> None:
    result = ruff("format", "--check")
    assert result.returncode == 0, f"run `ruff format {' '.join(SOURCES)}`:\n{result.stdout}{result.stderr}"


def test_ruff_check_finds_nothing() -> None:
    result = ruff("check")
    assert result.returncode == 0, f"`ruff check` found:\n{result.stdout}{result.stderr}"
