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
