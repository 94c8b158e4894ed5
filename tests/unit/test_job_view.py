"""A job's measured stage timing (from its worker's step events) and how ``arceusd status JOB`` shows it."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from arceusd.jobs.core import JobCore
from arceusd.jobs.core import events as e
from arceusd.jobs.judging.claims import StageTime
from arceusd.jobs.member.reports import report_of_event
from arceusd.jobs.record.job import STAGE_WINDOW, Job
from arceusd.jobs.record.report_fields import SHOWN_REPORT_FIELDS, Form
from arceusd.jobs.record.view import render_job
from protocol import codec
from protocol.job_wire import JobReport, ReportKind


def _claims(**seconds: Any) -> JobReport:
    """A checkpoint report carrying only these step-time claims."""
    return replace(JobReport("ab" * 16, 0, ReportKind.CHECKPOINT), **seconds)


def _job(tmp_path: Path) -> Job:
    spec = SimpleNamespace(name="tiny", model=SimpleNamespace(), data=SimpleNamespace(kind="shakespeare"))
    return Job("ab" * 16, cast(Any, spec), b"", "h", "owner", "127.0.0.1:1", tmp_path, JobCore.owned("owner", 100))


def test_no_steps_no_timing(tmp_path: Path) -> None:
    job = _job(tmp_path)
    assert job.stage_timing() is None
    assert "ms/step on this device" not in render_job(job.summary(full=True))


def test_timing_is_the_median_step_and_the_share_spent_waiting(tmp_path: Path) -> None:
    job = _job(tmp_path)
    for seconds, waited in [(0.5, 0.05), (0.4, 0.0), (3.0, 2.0), (0.6, 0.15)]:
        job.stage_times.append(StageTime(seconds, waited, 0.0, waited))
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
        job.stage_times.append(StageTime(5.0, 4.0, 4.0, 0.0))  # a slow start (compile, warm caches)
    for _ in range(STAGE_WINDOW):
        job.stage_times.append(StageTime(0.5, 0.1, 0.05, 0.05))
    timing = job.stage_timing()
    assert timing is not None and timing["steps"] == STAGE_WINDOW
    assert timing["step_time_s"] == 0.5 and timing["wait_fraction"] == pytest.approx(0.2)


def test_status_shows_the_tail_and_the_dashboard_gets_the_whole_curve(tmp_path: Path) -> None:
    """``status JOB --json`` carries the last HISTORY_TAIL points; ``whole_history`` (the control method's
    ``history: "all"``, which the dashboard asks for) carries every one, so a 1,000-step curve is drawn whole."""
    from arceusd.jobs.record.job import HISTORY_TAIL

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
    from arceusd.jobs.record import job as job_module

    monkeypatch.setattr(job_module, "MAX_HISTORY", 100)
    job = _job(tmp_path)
    for step in range(1, 1001):
        job.record_loss(step, 1.0)
    steps = [s for s, _ in job.history]
    assert len(steps) <= 100 and steps[-1] == 1000 and steps[0] <= 16  # bounded; still from the start to now
    assert steps == sorted(set(steps))


def test_the_leader_keeps_its_committed_checkpoints_bounded_newest_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeline's checkpoints come from the job's record (``checkpoints`` in ``status JOB --json``): each
    commit once, with its wall-clock time, the newest MAX_CHECKPOINTS kept."""
    from arceusd.jobs.record import leader_record

    job = _job(tmp_path)
    job.leading.commits.record_checkpoint(100, at=1000.0)
    job.leading.commits.record_checkpoint(100, at=1001.0)  # the same commit seen twice: once in the record
    job.leading.commits.record_checkpoint(50, at=1002.0)  # an older step after a newer one: not recorded
    job.leading.commits.record_checkpoint(200)
    shown = job.summary(full=True)["checkpoints"]
    assert [c["step"] for c in shown] == [100, 200] and shown[0]["at"] == 1000.0
    assert abs(shown[1]["at"] - time.time()) < 60
    monkeypatch.setattr(leader_record, "MAX_CHECKPOINTS", 10)
    for step in range(300, 5300, 100):
        job.leading.commits.record_checkpoint(step, at=float(step))
    assert [s for s, _ in job.leading.commits.checkpoints] == list(
        range(4300, 5300, 100)
    )  # the newest 10, oldest first
    assert job.leading.commits.checkpoints[-1] == (5200, 5200.0)
    assert "checkpoints" not in job.summary()  # the short view (status, jobs) stays short


def test_a_reports_wait_is_kept_only_when_finite_and_within_bounds() -> None:
    from arceusd.jobs.judging import claims

    waits: dict[str, float] = {}
    claims.record_wait_time(waits, "a", _claims(wait_s=0.25))
    claims.record_wait_time(waits, "b", _claims(wait_s=0.0))
    assert waits == {"a": 0.25, "b": 0.0}
    for bad in (float("nan"), float("inf"), float("-inf"), -0.1, 1e6, None):
        claims.record_wait_time(waits, "a", _claims(wait_s=bad))
        assert "a" not in waits, bad  # a bad (or missing) wait is not kept, nor the previous one shown beside it
        claims.record_wait_time(waits, "a", _claims(wait_s=0.25))
    claims.record_wait_time(waits, "b", _claims(step_s=0.1, predicted_s=0.1))  # a report without it
    assert waits == {"a": 0.25}
    times: dict[str, tuple[float, float]] = {}
    claims.record_step_time(times, "b", _claims(step_s=0.1, predicted_s=0.2))  # ... still counts as a report
    assert times == {"b": (0.1, 0.2)}


def test_stage_times_cover_every_measured_device_and_this_device_from_its_own_steps(tmp_path: Path) -> None:
    from arceusd.jobs.judging import claims

    me, other, third = "aa" * 16, "bb" * 16, "cc" * 16
    job = _job(tmp_path)
    stages = [
        SimpleNamespace(
            index=i,
            start=i,
            end=i + 1,
            compute_s=0.01,
            optimizer_s=0.002,
            shares=(SimpleNamespace(peer_id=p, heads=(), mlp_columns=()),),
        )
        for i, p in enumerate((me, other, third))
    ]
    cast(Any, job).plan = SimpleNamespace(
        stages=stages,
        micro_batches=4,
        schedule="1f1b",
        predicted_step_time_s=0.1,
        bubble_fraction=0.2,
        in_flight_cap=0,
        peer_ids=(me, other, third),
    )
    for peer, report in (
        (me, _claims(step_s=9.0, wait_s=9.0, predicted_s=1.0)),
        (other, _claims(step_s=0.03, wait_s=0.012, predicted_s=0.042)),
        (third, _claims(step_s=0.05, predicted_s=0.042, wait_s=-1.0)),
    ):
        claims.record_step_time(job.leading.speed.measured, peer, report)
        claims.record_wait_time(job.leading.speed.waits, peer, report)
    for seconds, waited in [(0.05, 0.01), (0.5, 0.0), (0.06, 0.02)]:
        job.stage_times.append(StageTime(seconds, waited, 0.0, waited))
    job.leading.speed.seen = {other: 0.25}  # what its neighbours saw (claims.seen_by_neighbours)
    shown = job.summary(full=True, me=me)
    assert shown["stage_times"] == {
        me: {"compute_s": 0.04, "wait_s": 0.01, "predicted_s": pytest.approx(0.042), "seen_s": None},  # not 9 s
        other: {"compute_s": 0.03, "wait_s": 0.012, "predicted_s": 0.042, "seen_s": 0.25},
        third: {"compute_s": 0.05, "wait_s": None, "predicted_s": 0.042, "seen_s": None},
    }
    assert shown["measured_step_s"][other] == [0.03, 0.042]  # the older key still answers
    text = render_job({**shown, "model": "mlp", "data": "mnist"})
    assert (
        f"{other[:12]} (stage 1): 30.0 ms compute, 12.0 ms waiting per step (plan: 42.0 ms compute; seen by "
        "its neighbours: 250.0 ms)"
    ) in text
    assert f"{third[:12]} (stage 2): 50.0 ms compute, - waiting" in text


def test_a_replicated_plan_shows_every_replica_its_sync_and_the_ring_bytes(tmp_path: Path) -> None:
    from arceusd.jobs.plans.planning import make_job_plan
    from tests.unit.test_planning_replicas import FAST, _links, _offers, _spec

    job = _job(tmp_path)
    cast(Any, job.spec).training = SimpleNamespace(batch_size=64)
    for sync, expected in (("every_step", "gradients averaged every step"), ("diloco", "DiLoCo every 200 steps")):
        job.inputs, job.replica_plan = make_job_plan(_spec(replicas=2, sync=sync), _offers(2), {}, _links(2, FAST))
        job.plan, job.ring_bytes = job.replica_plan.replicas[0], 3_500_000
        shown = job.summary(full=True)
        plan = shown["plan"]
        assert len(plan["replicas"]) == 2 and plan["sync"] == job.replica_plan.sync_mode.value
        assert plan["predicted_step_time_s"] == job.replica_plan.predicted_step_time_s
        assert set(job.planned_peers()) == {o.peer_id for o in _offers(2)}  # (the objects; the core holds none)
        text = render_job({**shown, "model": "mlp", "data": "mnist"})
        assert f"2 data-parallel replicas, {expected}; this device sent 3.5 MB to its ring" in text
        for r, replica in enumerate(job.replica_plan.replicas):
            assert f"replica {r} stage 0: blocks 0-" in text and replica.peer_ids[0][:12] in text
    # a dropped replica: the plan without it, and the drop named in status
    from arceusd.jobs.common.replica_change import dropped_plan
    from arceusd.jobs.record.job import ReplicaDrop

    assert job.replica_plan is not None
    lost = job.replica_plan.replicas[1].peer_ids
    job.replica_plan = dropped_plan(job.replica_plan, 2, 1)
    job.replica_drops.append(ReplicaDrop(f"member {lost[0][:12]} is dead", 41, lost, 1))
    shown = job.summary(full=True)
    assert "replicas" not in shown["plan"] and shown["dropped_replicas"][0]["devices"] == list(lost)
    text = render_job({**shown, "model": "mlp", "data": "mnist"})
    assert f"dropped  a replica at step 41 ({lost[0][:12]}): member {lost[0][:12]} is dead; 1 replica(s)" in text
    job.rebuilt_replicas.append((60, lost))
    text = render_job({**job.summary(full=True), "model": "mlp", "data": "mnist"})
    assert f"rebuilt  a replica at step 60 on {lost[0][:12]}" in text


def test_status_shows_what_the_leader_measured_of_its_members_claims(tmp_path: Path) -> None:
    from arceusd.jobs.judging.challenges import Timed

    job = _job(tmp_path)
    honest, liar, forger = "a" * 32, "b" * 32, "c" * 32
    job.leading.speed.timed = {
        honest: Timed(1e11, 1.5e10, 0.3),
        liar: Timed(1e13, 1.5e12, 10.0),
        forger: Timed(1e13, 1.5e12, 0.01, "block 3 is not the one its root committed to"),
    }
    job.leading.speed.discounts = {liar: 33.3, forger: 1000.0}
    job.leading.checks.excluded = {"d" * 32: "its shard has non-finite values"}
    job.leading.probation.member, job.leading.probation.cleared = "e" * 32, {"f" * 32}
    shown = render_job(job.summary(full=True))
    assert f"timed    {honest[:12]}  offered 100.0 GFLOP/s, measured 50.0 in 0.30 s (2.0x slower than offered)" in shown
    assert f"timed    {liar[:12]}  offered 10000.0 GFLOP/s, measured 150.0 in 10.00 s (66.7x slower" in shown
    assert f"timed    {forger[:12]}  offered 10000.0 GFLOP/s, measured 0.0 in 0.01 s (failed: block 3 is not" in shown
    assert f"slower   {liar[:12]}  planned at its offer / 33.3" in shown
    assert f"slower   {forger[:12]}  planned at its offer / 1000" in shown
    assert f"excluded {'d' * 12}  its shard has non-finite values" in shown
    assert f"probation {'e' * 12}  planned alone beside the leader" in shown
    assert f"cleared  {'f' * 12}  kept to its offer beside the leader" in shown


def test_each_loss_point_keeps_the_time_it_was_seen_through_halving_and_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``history_at`` (the dashboard's wall-clock axis and CSV) stays beside ``history``, point for point."""
    from arceusd.jobs.record import job as job_module

    monkeypatch.setattr(job_module, "MAX_HISTORY", 100)
    job = _job(tmp_path)
    for step in range(1, 1001):
        job.record_loss(step, 1.0, at=1000.0 + step)
    assert len(job.history_at) == len(job.history)
    assert all(at == 1000.0 + step for (step, _), at in zip(job.history, job.history_at, strict=True))
    job.cut_history(500)
    assert job.history[-1][0] <= 500 and len(job.history_at) == len(job.history)
    assert all(at == 1000.0 + step for (step, _), at in zip(job.history, job.history_at, strict=True))
    shown = job.summary(full=True)
    assert len(shown["history_at"]) == len(shown["history"])
    before = time.time()
    job.record_loss(501, 0.5)
    assert before - 1 <= job.history_at[-1] <= time.time() + 1


def test_a_member_shows_the_members_its_leader_told_it(tmp_path: Path) -> None:
    """The leader shows the peers whose offers it holds; a member (no offers) the ids its leader told it (issue 31:
    members said ``members 0`` while the owner said 3)."""
    spec = SimpleNamespace(name="tiny", model=SimpleNamespace(), data=SimpleNamespace(kind="shakespeare"))
    member = Job("ab" * 16, cast(Any, spec), b"", "h", "owner", "127.0.0.1:1", tmp_path, JobCore("me", "owner", 100))
    assert member.summary()["members"] == []
    member.told_members = ("owner", "me", "other")
    assert member.summary()["members"] == ["me", "other", "owner"]
    leader = _job(tmp_path)
    leader.offers.update(cast(Any, {"owner": None, "m1": None}))
    leader.core.handle(e.MemberJoined("m1", memory_ok=False), 0.0)
    leader.told_members = ("stale",)  # (it led before, or was told before it took over): its offers count
    assert leader.summary()["members"] == ["m1", "owner"]


def test_the_leader_names_the_members_its_plan_leaves_out_as_spares(tmp_path: Path) -> None:
    """Issue 31: a plan uses a device only where the step gets faster with it; the members left out are spares,
    and ``status JOB`` says so (none before a plan, none on a device that does not lead)."""
    job = _job(tmp_path)
    for peer in ("owner", "a" * 32, "b" * 32):
        job.offers[peer] = cast(Any, object())
        job.core.handle(e.MemberJoined(peer, memory_ok=False), 0.0)
    assert job.spares() == [] and "spares" not in render_job(job.summary(full=True))  # no plan yet
    before_the_plan = job.summary(full=True)
    job.core.handle(e.Tick(), 0.0)  # enough members: the core plans
    job.core.handle(e.PlanFound(("owner", "a" * 32), "a" * 32, ()), 0.0)  # the plan leaves b out
    assert job.spares() == ["b" * 32]
    shown = render_job({**before_the_plan, "spares": job.spares()})
    assert f"spares   {'b' * 12}: not in the plan" in shown
    job.core.follow("a" * 32)
    assert job.spares() == []  # a member does not know the leader's members


def test_a_recovery_reason_is_shown_in_full(tmp_path: Path) -> None:
    """Issue 31: the reason of a recovery names the device that died and the link that broke first; the view cut it
    at 80 characters (the dead device's id fell off). It is wrapped, never cut."""
    dead, neighbour = "d" * 32, "e" * 32
    reason = (
        f"member {dead} declared dead (first seen as: the worker of {neighbour} failed: LinkError: peer "
        f"{dead} closed the activation stream at step 41)"
    )
    job = _job(tmp_path)
    summary = {
        **job.summary(full=True),
        "recoveries": [
            {"epoch": 2, "reason": reason, "resumed_step": 40, "recomputed_steps": 1, "first_step_after_s": 1.3}
        ],
        "excluded": {dead: reason},
    }
    shown = render_job(summary)
    flat = " ".join(line.strip() for line in shown.splitlines())
    assert reason in flat and flat.count(dead) >= 4, shown
    assert all(len(line) <= 120 for line in shown.splitlines()), shown


def test_a_members_checkpoint_report_reaches_status_through_the_one_table_of_shown_fields(tmp_path: Path) -> None:
    """The walk-through of docs/ARCHITECTURE.md ("one more figure in a member's checkpoint report"): a worker's
    event becomes a report (member/reports.report_of_event), crosses the wire (the codec), is kept as it came by
    the leader (job.leading.commits.latest, as ReportIntake.take keeps it) and every row of SHOWN_REPORT_FIELDS
    reaches both the JSON (member_reports) and the text of status, under its label (issue 32)."""
    job = _job(tmp_path)
    peer = "a" * 32
    event = {
        "event": "checkpoint",
        "step": 40,
        "shard": {"name": "stage0.safetensors", "sha256": "ab" * 32, "size": 10},
        "step_s": 0.0123,
        "predicted_s": 0.01,
        "wait_s": 0.002,
        "wait_up_s": 0.001,
        "wait_down_s": 0.001,
        "group_wait_s": 0.0005,
    }
    sent = report_of_event(job.job_id, job.epoch, event)
    came = codec.decode_as(JobReport, codec.encode(sent))
    assert came == sent
    job.leading.commits.latest[peer] = came
    shown = job.summary(full=True)
    figures = shown["member_reports"][peer]
    assert set(figures) == {f.name for f in SHOWN_REPORT_FIELDS}  # every row of the table, none other
    assert all(figures[f.name] == getattr(came, f.name) for f in SHOWN_REPORT_FIELDS)
    text = render_job(shown)
    line = next(x for x in text.splitlines() if x.startswith(f"  reported {peer[:12]}"))
    assert all(f.label in line for f in SHOWN_REPORT_FIELDS)
    assert "at step 40" in line and "step 12.3 ms" in line and "group wait 0.5 ms" in line
    assert all(isinstance(f.form, Form) for f in SHOWN_REPORT_FIELDS)
    job.leading.commits.latest[peer] = replace(came, step_s=float("nan"), wait_s=None, predicted_s=-1.0)
    # not finite, unset, or out of its bound: not shown
    again = job.summary(full=True)["member_reports"][peer]
    assert not {"step_s", "wait_s", "predicted_s"} & set(again) and again["step"] == 40
