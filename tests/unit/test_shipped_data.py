"""The data sets ship inside the repository, unchanged, and no tracked file reaches outside it for data."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"


def _readme_digests() -> dict[str, str]:
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([0-9a-f]{64}) \|$", (DATA / "README.md").read_text(), re.M)
    return dict(rows)


def test_every_shipped_data_file_matches_its_readme_digest() -> None:
    digests = _readme_digests()
    assert set(digests) == {
        "mnist/t10k-images-idx3-ubyte.gz",
        "mnist/t10k-labels-idx1-ubyte.gz",
        "tinyshakespeare/input.txt",
        "tokenizers/shakespeare-bpe.json",
    }
    for name, digest in digests.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_no_tracked_file_refers_outside_the_repository_for_shared_material() -> None:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    needle = "../" + "shared"  # spelled in two parts so this file does not match itself
    offenders = []
    for name in out.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.suffix in {".gz"}:
            continue
        try:
            if needle in path.read_text(errors="ignore"):
                offenders.append(name)
        except OSError:
            continue
    assert offenders == []
