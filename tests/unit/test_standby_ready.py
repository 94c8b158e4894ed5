"""Issue 31: the leader's own views said its standby was "(syncing)" for good: only the standby's daemon knew it
held its copies. Now the standby confirms each committed checkpoint it holds (``StandbyHeld``, once its copies are
checked) and the leader's ``status``, ``--watch`` and dashboard say "ready at step S" from that; "syncing" before.

The note is one pure rule (:func:`arceusd.jobs.record.view.standby_note`); the leader's intake takes the word of
its standby only, of a step it committed (over a real job record and plan; the wire is faked)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from arceusd.dashboard.data import Timeline, job_view
from arceusd.jobs.leader.standby_sync import StandbySyncing
from arceusd.jobs.record.view import render_job, standby_note, standby_text
from protocol.envelope import Header
from protocol.job_wire import JobAck, StandbyHeld
from tests.unit.test_spare_start import JOB_ID, LEADER, SLOW, SLOWER, planned_job

STANDBY = "b" * 32


def test_the_standby_note_says_ready_at_the_step_the_standby_holds() -> None:
    running = {"job_id": JOB_ID, "state": "running", "standby": STANDBY, "standby_ready": False}
    assert standby_note(running) == "syncing"
    assert standby_note({**running, "standby_step": 40}) == "syncing", "a step without readiness is not ready"
    assert standby_note({**running, "standby_ready": True}) == "ready"
    assert standby_note({**running, "standby_ready": True, "standby_step": 40}) == "ready at step 40"
    assert standby_note({**running, "standby_ready": True, "standby_step": True}) == "ready", "a bool is no step"
    assert standby_note({**running, "standby_ready": "yes"}) == "syncing", "only true is ready"
    assert standby_note({**running, "standby_ready": None}) == "", "a device that is not told says nothing"
    assert standby_text({**running, "standby_ready": None}) == "b" * 12
    for ended in ("done", "failed", "cancelled"):
        assert standby_note({**running, "state": ended, "standby_ready": True, "standby_step": 40}) == ""
    assert standby_note({**running, "standby": ""}) == "" and standby_text({**running, "standby": ""}) == "-"
    assert standby_text({**running, "standby_ready": True, "standby_step": 40}) == f"{'b' * 12} (ready at step 40)"
    # the dashboard writes the same note
    assert job_view({**running, "standby_ready": True, "standby_step": 40}, Timeline())["standby_note"] == (
        "ready at step 40"
    )


def _held(job: Any, sender: str, step: int) -> JobAck:
    ports = SimpleNamespace(jobs={JOB_ID: job}, leads=lambda j: j.leader == LEADER)
    header = cast(Header, SimpleNamespace(sender=sender, term=job.term, epoch=job.epoch))
    return trio.run(StandbySyncing(cast(Any, ports)).on_standby_held, header, StandbyHeld(JOB_ID, step))


def test_the_leader_says_ready_once_its_standby_confirmed_a_commit(tmp_path: Path) -> None:
    job = planned_job(tmp_path, LEADER)
    job.core.standby = SLOW
    view = job.summary(full=True, me=LEADER)
    assert view["standby_ready"] is False and view["standby_step"] is None, "nothing confirmed: syncing"
    assert "standby  bbbbbbbbbbbb (syncing)" in render_job({**view, "state": "running"})
    assert _held(job, SLOW, 40) == JobAck(False, "step 40 is not a checkpoint this leader committed (the last is 0)")
    job.core.committed_step = 40
    assert _held(job, SLOWER, 40) == JobAck(False, "that device is not the job's standby")
    assert _held(job, SLOW, 41).ok is False, "a step past the leader's commit"
    assert job.summary(full=True, me=LEADER)["standby_ready"] is False, "no refused word counts"
    assert _held(job, SLOW, 40) == JobAck(True)
    view = job.summary(full=True, me=LEADER)
    assert view["standby_ready"] is True and view["standby_step"] == 40
    assert "standby  bbbbbbbbbbbb (ready at step 40)" in render_job({**view, "state": "running"})
    job.core.committed_step = 60
    assert _held(job, SLOW, 20).ok and job.standby_step() == 40, "an older step never takes a newer one back"
    assert _held(job, SLOW, 60).ok and job.standby_step() == 60
    # a new standby starts over: the old one's word is not its own
    job.core.standby = SLOWER
    assert job.standby_step() is None and not job.standby_ready()
    # a device that leads no more answers nothing of it, and is not told: its views say nothing of the standby
    job.core.standby = SLOW
    assert _held(job, SLOW, 60) == JobAck(True)
    job.core.leader = SLOW
    assert _held(job, SLOW, 60) == JobAck(False, "not the leader of that job")
    assert job.standby_ready() is None and job.standby_step() is None
    assert "standby  bbbbbbbbbbbb\n" in render_job({**job.summary(full=True), "state": "running"}) + "\n"


def test_the_standby_says_what_it_holds_itself(tmp_path: Path) -> None:
    job = planned_job(tmp_path, SLOW)  # the standby's own record
    job.core.standby = SLOW
    assert job.standby_ready() is False and job.standby_step() is None, "no copies yet: syncing"
    job.standby_data = cast(Any, object())  # (its checked copy of the data)
    job.core.committed_step = 40
    assert job.standby_ready() is True and job.standby_step() == 40
    job.core.standby = SLOWER  # a later plan named another: this device is not told of that one
    assert job.standby_ready() is None and job.standby_step() is None
