"""The Python API's job handle (``arceus.Job``) over a scripted control channel: typed status, progress snapshots
that end with the job (or a bounded wait that runs out), wait's verdict, the export folder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import arceus
from arceus.connection import Connection
from arceus.status import JobStatus


def summary(state: str, step: int, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": "ab" * 16,
        "name": "tiny",
        "owner": "me",
        "role": "owner",
        "state": state,
        "step": step,
        "total_steps": 8,
        "loss": 2.5 if step else None,
        "val_loss": None,
        "members": ["me"],
        "error": "",
        "model_path": "",
        "leader": "me",
        "tokens_per_s": 100.0,
        "committed_step": 0,
        **extra,
    }


class Scripted(Connection):
    """Answers ``job`` with the next summary of a script (the last one for ever after)."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        super().__init__("/nonexistent-state")
        self.script: Iterator[dict[str, Any]] = iter(script)
        self.last = script[0]
        self.calls: list[str] = []

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        self.calls.append(method)
        if method == "cancel":
            return {"job_id": self.last["job_id"], "state": "cancelled"}
        assert method == "job" and params == {"job_id": "ab" * 16}
        self.last = next(self.script, self.last)
        return self.last


def test_status_is_typed_with_the_daemons_job_states() -> None:
    status = JobStatus.from_summary(summary("running", 2, lr=0.001))
    assert status.state is arceus.JobState.RUNNING and status.state.value == "running" and not status.ended
    assert (status.step, status.total_steps, status.loss, status.fraction) == (2, 8, 2.5, 0.25)
    assert status.members == ("me",) and status.model_path is None and status.lr == 0.001
    listed = JobStatus.from_summary({"job_id": "x", "state": "announced", "step": 0, "total_steps": 0})
    assert listed.tokens_per_s is None and listed.committed_step is None and listed.fraction == 0.0


def test_progress_yields_each_change_until_the_job_ends() -> None:
    script = [
        summary("waiting", 0),
        summary("waiting", 0),
        summary("running", 3),
        summary("running", 3),
        summary("running", 8),
        summary("done", 8, model_path="/jobs/j/export/model.safetensors"),
    ]
    job = arceus.Job(Scripted(script), "ab" * 16)
    seen = [(p.state.value, p.step) for p in job.progress(poll_s=0.001, timeout_s=5)]
    assert seen == [("waiting", 0), ("running", 3), ("running", 8), ("done", 8)]
    assert job.wait(timeout_s=1, poll_s=0.001).state is arceus.JobState.DONE
    assert job.export_path() == Path("/jobs/j/export")


def test_progress_is_bounded_and_the_job_goes_on() -> None:
    job = arceus.Job(Scripted([summary("running", 1)]), "ab" * 16)
    seen = []
    with pytest.raises(arceus.JobTimeoutError, match=r"did not end within 0\.05 s .*running at step 1 of 8"):
        for p in job.progress(poll_s=0.01, timeout_s=0.05):
            seen.append(p.step)
    assert seen == [1]
    with pytest.raises(TimeoutError):
        job.wait(timeout_s=0.02, poll_s=0.01)


def test_wait_reports_a_failed_job_and_there_is_no_export() -> None:
    failed = summary("failed", 4, error="stopped at step 4 of 8: the budget is spent")
    job = arceus.Job(Scripted([failed]), "ab" * 16)
    with pytest.raises(arceus.JobEndedError, match="ended failed at step 4 of 8: stopped at step 4") as err:
        job.wait(poll_s=0.001)
    assert err.value.status.state is arceus.JobState.FAILED
    assert job.wait(poll_s=0.001, check=False).error.startswith("stopped")
    with pytest.raises(arceus.NotExportedError, match=r"no exported model: it is failed at step 4 of 8$"):
        job.export_path()
    running = arceus.Job(Scripted([summary("running", 2)]), "ab" * 16)
    with pytest.raises(arceus.NotExportedError, match=r"job\.wait\(\) first"):
        running.load()
    assert running.cancel() is arceus.JobState.CANCELLED


def test_load_gives_the_folder_of_an_export_that_is_not_a_transformers_model(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    done = summary("done", 8, model_path=str(tmp_path / "model.safetensors"))
    assert arceus.Job(Scripted([done]), "ab" * 16).load() == tmp_path


class Submits(Connection):
    """Answers ``status`` and records ``submit``'s parameters."""

    def __init__(self) -> None:
        super().__init__("/nonexistent-state")
        self.params: dict[str, Any] = {}

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        if method == "status":
            return {}
        assert method == "submit" and params is not None
        self.params = params
        return {"job_id": "ab" * 16}


def test_submit_sends_when_it_was_asked_as_the_cli_does() -> None:
    """The quote times a job from the command (the CLI's submit sends ``asked_at``); the Python client's submit
    sent none, so its jobs were timed from the daemon's answer (issue 31)."""
    client = arceus.Client("/nonexistent-state")
    client.connection = sent = Submits()
    spec = Path(__file__).resolve().parents[2] / "examples" / "mnist-mlp.toml"
    before = time.time()
    job = client.submit(spec)
    assert job.job_id == "ab" * 16
    assert before <= sent.params["asked_at"] <= time.time(), sent.params
