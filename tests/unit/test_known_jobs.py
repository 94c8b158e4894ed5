"""A restarted daemon lists every job it holds receipts for (issue 31): members' records of their jobs, read back
bounded and checked, and the rows ``arceusd jobs`` shows for jobs the daemon no longer holds."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from arceusd.jobs.core import JobCore, JobState, Role
from arceusd.jobs.plans.job_paths import MEMBER_FILE
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.known import KnownJob, known_jobs, member_record, parse_record, read_records
from arceusd.jobs.record.view import job_line
from arceusd.market.ledger import JobReceipts, job_receipts
from arceusd.market.receipts import countersign, sign_leader
from tests.unit.test_market_receipts import DEV_A, DEV_B, JOB, LEADER, filled, receipt

ME, OWNER, OTHER = "a" * 32, "b" * 32, "c" * 32
JOB2 = "e" * 32


def member_job(tmp_path: Path, state: JobState = JobState.DONE) -> Job:
    spec = SimpleNamespace(name="shakespeare", model=SimpleNamespace(), data=SimpleNamespace(kind="text"))
    core = JobCore(ME, OWNER, 300, role=Role.MEMBER, state=state)
    job = Job(JOB, cast(Any, spec), b"", "h", OWNER, "127.0.0.1:1", tmp_path / JOB, core, total_steps=300, step=300)
    job.told_members = (OWNER, ME, OTHER)
    return job


def test_a_members_record_reads_back_as_the_job_it_names(tmp_path: Path) -> None:
    record = member_record(member_job(tmp_path))
    known = parse_record(json.loads(json.dumps(record)), JOB, Role.MEMBER)
    assert known == KnownJob(
        JOB,
        OWNER,
        Role.MEMBER,
        JobState.DONE,
        "shakespeare",
        300,
        300,
        tuple(sorted((OWNER, ME, OTHER))),
        known.created if known else 0.0,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"job_id": JOB2},  # another job's record
        {"owner": "../../etc"},
        {"state": "exploded"},
        {"state": ["done"]},
        {"step": -1},
        {"step": 1.5},
        {"total_steps": True},
        {"name": "x" * 201},
        {"members": ["not a peer id"]},
        {"members": [ME] * 1025},
        {"created": float("nan")},
        {"model_path": 7},
    ],
)
def test_a_record_out_of_bounds_is_not_listed(tmp_path: Path, change: dict[str, Any]) -> None:
    record = {**member_record(member_job(tmp_path)), **change}
    assert parse_record(record, JOB, Role.MEMBER) is None
    assert parse_record([record], JOB, Role.MEMBER) is None


def test_records_are_read_from_the_jobs_directory_and_a_bad_one_is_skipped(tmp_path: Path) -> None:
    (tmp_path / JOB).mkdir()
    (tmp_path / JOB / MEMBER_FILE).write_text(json.dumps(member_record(member_job(tmp_path))))
    (tmp_path / JOB2).mkdir()
    (tmp_path / JOB2 / MEMBER_FILE).write_text("{not json")
    (tmp_path / ("f" * 32)).mkdir()
    (tmp_path / ("f" * 32) / MEMBER_FILE).write_text(" " * (64 * 1024 + 1))
    assert list(read_records(tmp_path)) == [JOB]
    assert read_records(tmp_path / "none") == {}


def test_jobs_held_are_not_listed_twice_and_the_rest_show_what_they_paid(tmp_path: Path) -> None:
    done = parse_record(member_record(member_job(tmp_path)), JOB, Role.MEMBER)
    running = parse_record(member_record(member_job(tmp_path, JobState.RUNNING)), JOB, Role.MEMBER)
    assert done is not None and running is not None
    paid = {JOB: JobReceipts(OWNER, 3, 0.0021, 300), JOB2: JobReceipts(OWNER, 1, 0.0005, 40)}
    rows = known_jobs({JOB: done}, paid, ME, held=())
    assert [(k.job_id, k.state, k.earned_usd, k.receipts) for k in rows] == [
        (JOB2, JobState.LEFT, 0.0005, 1),
        (JOB, JobState.DONE, 0.0021, 3),
    ]
    assert rows[0].role == Role.MEMBER and rows[0].step == 40 and "ledger only" in rows[0].note
    assert known_jobs({JOB: done}, paid, ME, held=(JOB, JOB2)) == []  # held again: the live job's row only
    # a job that had not ended when this device last wrote its record: not running here any more
    (row,) = known_jobs({JOB: running}, {}, ME, held=())
    assert row.state == JobState.LEFT and "restarted while the job was running" in row.note
    # the owner's own job, known from its ledger only
    assert known_jobs({}, {JOB2: JobReceipts(ME, 0, 0.0, 20)}, ME, held=())[0].role == Role.OWNER
    summary = known_jobs({JOB: done}, paid, ME, held=(JOB2,))[0].summary()
    assert summary["restored"] and summary["members"] == sorted((OWNER, ME, OTHER))
    assert "earned $0.0021 (3 receipt(s))" in job_line(summary) and "done" in job_line(summary)


def test_the_ledger_names_the_jobs_a_device_worked_in_or_owns(tmp_path: Path) -> None:
    ledger = filled(tmp_path)  # A: two countersigned receipts; B: one countersigned, one not
    assert set(ledger.job_receipts(DEV_B.peer_id)) == {JOB}  # (kept by the ledger until an entry is appended)
    other = sign_leader(LEADER, receipt(job_id=JOB2, device=DEV_B.peer_id, step_from=0, step_to=5))
    ledger.append(countersign(DEV_B, other))
    assert ledger.job_receipts(DEV_B.peer_id) == job_receipts(ledger.entries, DEV_B.peer_id)  # the new one counts
    assert ledger.job_receipts(DEV_A.peer_id) == job_receipts(ledger.entries, DEV_A.peer_id)
    a = job_receipts(ledger.entries, DEV_A.peer_id)
    assert set(a) == {JOB} and a[JOB].receipts == 2 and a[JOB].last_step == 30 and a[JOB].owner == LEADER.peer_id
    b = job_receipts(ledger.entries, DEV_B.peer_id)
    assert b[JOB].receipts == 1 and b[JOB].last_step == 40 and b[JOB2].receipts == 1  # unsigned: not earned
    assert b[JOB].earned_usd == pytest.approx(receipt().usd)
    assert set(job_receipts(ledger.entries, LEADER.peer_id)) == {JOB, JOB2}  # the owner: every job it paid
    assert job_receipts(ledger.entries, "9" * 32) == {}
