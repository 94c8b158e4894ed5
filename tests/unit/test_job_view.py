"""A job's measured stage timing (from its worker's step events) and how ``arceusd status JOB`` shows it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from arceusd.jobs.job import STAGE_WINDOW, Job
from arceusd.jobs.view import render_job


def _job(tmp_path: Path) -> Job:
    spec = SimpleNamespace(name="tiny", model=SimpleNamespace(), data=SimpleNamespace(kind="shakespeare"))
    return Job("ab" * 16, spec, b"", "h", "owner", "127.0.0.1:1", "owner", tmp_path)


def test_no_steps_no_timing(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert job.stage_timing() is None
    assert "ms/step on this device" not in render_job(job.summary(full=True))


def test_timing_is_the_median_step_and_the_share_spent_waiting(tmp_path: Path) -> None:
    job = _job(tmp_path)
    for seconds, waited in [(0.5, 0.05), (0.4, 0.0), (3.0, 2.0), (0.6, 0.15)]:
        job.stage_times.append((seconds, waited))
    timing = job.stage_timing()
    assert timing is not None
    assert timing["steps"] == 4
    assert timing["step_time_s"] == 0.6  # the median (upper of the middle two): one slow step does not move it
    assert timing["wait_fraction"] == pytest.approx(2.2 / 4.5)
    shown = render_job(job.summary(full=True))
    assert "measured 600.0 ms/step on this device (median of the last 4), 49% of it waiting on links" in shown


def test_only_the_last_steps_count(tmp_path: Path) -> None:
    job = _job(tmp_path)
    for _ in range(STAGE_WINDOW):
        job.stage_times.append((5.0, 4.0))  # a slow start (compile, warm caches)
    for _ in range(STAGE_WINDOW):
        job.stage_times.append((0.5, 0.1))
    timing = job.stage_timing()
    assert timing is not None and timing["steps"] == STAGE_WINDOW
    assert timing["step_time_s"] == 0.5 and timing["wait_fraction"] == pytest.approx(0.2)


def test_status_shows_the_tail_and_the_dashboard_gets_the_whole_curve(tmp_path: Path) -> None:
    """``status JOB --json`` carries the last HISTORY_TAIL points; ``whole_history`` (the control method's
    ``history: "all"``, which the dashboard asks for) carries every one, so a 1,000-step curve is drawn whole."""
    from arceusd.jobs.job import HISTORY_TAIL

    job = _job(tmp_path)
    for step in range(1, 1001):
        job.record_loss(step, 5.0 - step / 1000)
    tail = job.summary(full=True)["history"]
    assert len(tail) == HISTORY_TAIL and tail[0][0] == 1001 - HISTORY_TAIL and tail[-1] == (1000, 4.0)
    whole = job.summary(full=True, whole_history=True)["history"]
    assert [s for s, _ in whole] == list(range(1, 1001))


def test_a_long_history_keeps_the_whole_curve_at_a_bounded_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from arceusd.jobs import job as job_module

    monkeypatch.setattr(job_module, "MAX_HISTORY", 100)
    job = _job(tmp_path)
    for step in range(1, 1001):
        job.record_loss(step, 1.0)
    steps = [s for s, _ in job.history]
    assert len(steps) <= 100 and steps[-1] == 1000 and steps[0] <= 16  # bounded; still from the start to now
    assert steps == sorted(set(steps))
