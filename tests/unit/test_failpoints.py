"""Failpoints: off by default, sleep where asked, kill only once per marker, and reject unknown actions."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from arceusd.base import failpoints
from arceusd.jobs.service.manager import worker_device


def test_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.hit("checkpoint.before-rename")  # nothing happens


def test_sleep_pauses_only_at_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "worker.step=sleep:0.2; other=sleep:5")
    began = time.monotonic()
    failpoints.hit("worker.step")
    failpoints.hit("not.configured")
    assert 0.2 <= time.monotonic() - began < 2.0


def test_kill_once_does_nothing_when_its_marker_exists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "fired"
    marker.touch()
    monkeypatch.setenv(failpoints.ENV, f"checkpoint.before-rename=kill-once:{marker}")
    failpoints.hit("checkpoint.before-rename")  # still alive: it already fired once


def test_unknown_action_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(failpoints.ENV, "worker.step=explode")
    with pytest.raises(ValueError, match="unknown action"):
        failpoints.hit("worker.step")


@pytest.mark.parametrize(("kind", "device"), [("cpu", "cpu"), ("cuda", "cuda"), ("mps", "mps"), ("tpu", "cpu")])
def test_workers_train_on_the_measured_device_kind(kind: str, device: str) -> None:
    assert worker_device(kind) == device
