"""bench/recovery.py picks a victim that is never the owner (plans follow measured links and can put the owner on
the middle stage: the bench then killed the owner and crashed), and reads its data from the repository."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_recovery", ROOT / "bench" / "recovery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plan(*stages: list[str]) -> dict[str, object]:
    return {"stages": [{"devices": [{"peer_id": p} for p in stage]} for stage in stages]}


def test_victim_is_the_middle_stage_unless_the_owner_holds_it() -> None:
    pick = _bench().pick_victim
    assert pick(_plan(["own"], ["mid"], ["last"]), "own", "last") == "mid"
    assert pick(_plan(["a"], ["own"], ["b"]), "own", "b") == "a"  # the owner on the middle stage: not killed
    assert pick(_plan(["b"], ["own"], ["a"]), "own", "b") == "a"  # the standby is spared when another exists
    assert pick(_plan(["own", "x"], ["own"]), "own", None) == "x"  # tensor-parallel groups too
    with pytest.raises(ValueError, match="--victim leader"):
        pick(_plan(["own"], ["own"]), "own", None)


def test_every_bench_reads_data_from_the_repository() -> None:
    for path in sorted((ROOT / "bench").glob("*.py")):
        text = path.read_text()
        assert "../" + "shared" not in text and "parents[2]" not in text, path
        if '"data"' in text or "mnist" in text.lower():
            assert "data" in text
    assert _bench().DATA == ROOT / "data" and (ROOT / "data" / "mnist").is_dir()
