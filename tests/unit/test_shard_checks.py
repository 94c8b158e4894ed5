"""Issue #19 job items, unit level: a checkpoint report's name is the plan's and its size within the plan's bound
(arceusd/jobs/leader/shard_checks.py), a download is bounded by what this device knows (transfers), offers within
physical bounds and a JobStop sets known states only (arceusd/jobs/judging/claims.py), and the shapes a plan implies
(filework ``shapes``, a child process) with the daemon's scan (shard_scan) find a NaN shard and a misshapen one."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.files.checkpoint import CheckpointError, Manifest, ShardRecord, commit_manifest, shard_file_name
from arceusd.jobs.common.transfers import Transfers
from arceusd.jobs.core import JobCore
from arceusd.jobs.core import events as e
from arceusd.jobs.judging import claims
from arceusd.jobs.judging.challenges import Timed
from arceusd.jobs.leader import shard_checks
from arceusd.jobs.member.reports import report_of_event
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.leader_record import LeaderRecord
from protocol.job_wire import JobReport, ReportKind, ReportShard, ShardData

PEERS = ("a" * 32, "b" * 32, "c" * 32)


def block(param_bytes: int) -> Any:
    return SimpleNamespace(param_bytes=param_bytes, optimizer_bytes=param_bytes)


def fake_job() -> Job:
    stages = tuple(
        SimpleNamespace(start=i, end=i + 1, shares=(SimpleNamespace(peer_id=p),)) for i, p in enumerate(PEERS)
    )
    core = JobCore.owned(PEERS[0], 100)
    job = Job("j" * 32, cast(Any, SimpleNamespace()), b"", "h", PEERS[0], "127.0.0.1:1", Path("j"), core)
    job.total_steps = 100
    for p in PEERS:  # the members: their offers, and the core takes them in
        job.offers[p] = cast(Any, object())
        core.handle(e.MemberJoined(p, memory_ok=False), 0.0)
    cast(Any, job).plan = SimpleNamespace(stages=stages)
    job.inputs = cast(Any, SimpleNamespace(blocks=(block(1000), block(4000), block(10))))
    return job


def report(name: str, size: int = 500, step: int = 20, sha: str = "0" * 64) -> JobReport:
    return JobReport("j" * 32, 0, ReportKind.CHECKPOINT, step=step, shard=ReportShard(name, sha, size))


def test_the_shard_name_comes_from_the_plan() -> None:
    job = fake_job()
    assert (
        shard_checks.expected_shard_name(cast(Any, job.plan), PEERS[1])
        == shard_file_name(1, 0)
        == "stage1-rank0.safetensors"
    )
    step, shard = shard_checks.check_checkpoint_report(job, PEERS[1], report("stage1-rank0.safetensors"))
    assert (step, shard["name"], shard["size"]) == (20, "stage1-rank0.safetensors", 500)
    for bad in ("/root/.ssh/authorized_keys", "../../x.safetensors", "stage0-rank0.safetensors", ""):
        with pytest.raises(shard_checks.ReportRefused) as info:
            shard_checks.check_checkpoint_report(job, PEERS[1], report(bad))
        assert info.value.problem is shard_checks.ReportProblem.NAME


def test_sizes_are_bounded_by_the_plans_share_and_a_16_gib_claim_is_refused() -> None:
    job = fake_job()
    bound = shard_checks.shard_size_bound(cast(Any, job.plan), job.inputs, PEERS[0])
    assert bound == 2 * 2000 + shard_checks.HEADER_ALLOWANCE
    shard_checks.check_checkpoint_report(job, PEERS[0], report("stage0-rank0.safetensors", size=bound))
    for size in (bound + 1, 16 << 30, 0, -1, -(2**63)):  # a bool or a str is no size: the codec refuses it
        with pytest.raises(shard_checks.ReportRefused) as info:
            shard_checks.check_checkpoint_report(job, PEERS[0], report("stage0-rank0.safetensors", size))
        assert info.value.problem is shard_checks.ReportProblem.SIZE


def test_other_bad_reports_are_refused_and_exclusion_counts_and_names() -> None:
    job = fake_job()
    name = "stage2-rank0.safetensors"
    cases = [
        (report(name, sha="Z" * 64), "shard_digest"),
        (report(name, sha="0" * 63), "shard_digest"),
        (report(name, sha="A" * 64), "shard_digest"),
        (report(name, step=0), "step"),
        (report(name, step=101), "step"),
        (replace(report(name), step=None), "step"),
        (JobReport("j" * 32, 0, ReportKind.CHECKPOINT, step=20), "malformed"),
    ]
    for bad, problem in cases:
        with pytest.raises(shard_checks.ReportRefused) as info:
            shard_checks.check_checkpoint_report(job, PEERS[2], bad)
        assert info.value.problem.value == problem
    with pytest.raises(shard_checks.ReportRefused) as info:
        shard_checks.check_checkpoint_report(job, "d" * 32, report(name))
    why = shard_checks.exclude(job, PEERS[2], info.value)
    assert PEERS[2] in why and PEERS[2] in job.leading.checks.excluded and PEERS[2] not in job.members
    assert job.core.lead is not None and PEERS[2] in job.core.lead.announced  # never invited back
    assert job.leading.checks.refused_reports == {"not_in_plan": 1}


def test_a_download_is_bounded_by_the_known_size_not_the_senders_total() -> None:
    calls = []

    class Peers:
        async def request(self, *args: Any, **kwargs: Any) -> ShardData:
            calls.append(args)
            return ShardData(16 << 30, b"\0" * 1024)

    job = cast(Job, SimpleNamespace(job_id="j" * 32, members={PEERS[0]: SimpleNamespace(address="x:1")}))
    transfers = Transfers(cast(Any, Peers()), {}, PEERS[1], cast(Any, None))
    record = ShardRecord("stage0-rank0.safetensors", "0" * 64, 4096)
    assert trio.run(transfers.fetch_shard, job, PEERS[0], 20, record) is None
    assert len(calls) == 1, "refused at the first answer, before asking for more"


def test_commit_manifest_refuses_a_path_as_a_shard_name(tmp_path: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(b"x")
    record = ShardRecord(str(outside), hashlib.sha256(b"x").hexdigest(), 1)
    with pytest.raises(CheckpointError, match="must match"):
        commit_manifest(tmp_path / "ckpt", Manifest("j", 1, 1, 20, (record,)), Identity.generate())
    assert not (tmp_path / "ckpt" / "step-0000000020" / "manifest.json").exists()


def test_offers_within_physical_bounds_and_stop_states() -> None:
    assert claims.check_offer_bounds(8 << 30, 1e12) is None
    assert "memory" in str(claims.check_offer_bounds(1 << 50, 1e12))
    assert "speed" in str(claims.check_offer_bounds(8 << 30, 1e20))
    assert "speed" in str(claims.check_offer_bounds(8 << 30, float("nan")))
    assert [claims.stop_state(r) for r in ("done", "replanning", "\x1b[2Jpwned", "", "failed")] == [
        "done",
        "replanning",
        "stopped",
        "stopped",
        "failed",
    ]


def test_the_plans_shapes_and_the_scan_find_a_nan_shard_and_a_misshapen_one(tmp_path: Path) -> None:
    from arceusd.files.checkpoint import write_shard
    from arceusd.jobs.judging.shard_scan import ShardScanError, scan_shard
    from arceusd.jobs.plans.planning import Offer, encode_start, make_plan
    from arceusd.jobs.procs import filework
    from arceusd.jobs.spec.schema import load_spec, to_dict
    from arceusd.models.build import build_reference_model
    from tests.adversarial.hostile_job import poison
    from tests.integration.test_recovery import write_spec

    spec = load_spec(str(write_spec(tmp_path, steps=10, interval=5)))
    offers = [Offer(p, "127.0.0.1:1", 1e10, 1 << 30) for p in PEERS[:2]]
    inputs, the_plan = make_plan(spec, offers, {})
    _, plan_data = encode_start(inputs, the_plan)
    spec_bytes = json.dumps(to_dict(spec), sort_keys=True).encode()
    reference = {f"param.blocks.{k}": v for k, v in build_reference_model(spec.model, 0).state_dict().items()}
    paths = []
    for s, stage in enumerate(the_plan.stages):
        tensors = {k: v for k, v in reference.items() if stage.start <= int(k.split(".")[2]) < stage.end}
        paths.append((stage.shares[0].peer_id, tmp_path / "ckpt" / f"s{s}.safetensors"))
        write_shard(tmp_path, 0, "x.safetensors", tensors)  # the writer's format
        paths[-1][1].parent.mkdir(exist_ok=True)
        (tmp_path / "step-0000000000" / "x.safetensors").rename(paths[-1][1])
    shapes, initial = trio.run(filework.plan_shapes, spec_bytes, plan_data)
    assert sorted(shapes) == sorted(p for p, _ in paths)
    seeded = {f"param.blocks.{k}": v for k, v in build_reference_model(spec.model, spec.seed).state_dict().items()}
    assert initial == {k: float(v.abs().max()) for k, v in seeded.items()}  # the job's own initial values
    for peer, path in paths:
        scan_shard(path, shapes[peer])  # the workers' format passes
    poison(paths[0][1])
    with pytest.raises(ShardScanError, match="non-finite"):
        scan_shard(paths[0][1], shapes[paths[0][0]])
    paths[1][1].write_bytes(paths[0][1].read_bytes())  # another stage's tensors
    with pytest.raises(ShardScanError, match="names or shapes"):
        scan_shard(paths[1][1], shapes[paths[1][0]])


def test_step_times_are_reported_kept_and_the_standby_is_chosen_among_measured_members() -> None:
    from collections import deque

    from arceusd.jobs.leader.standby_sync import choose_standby

    stage = SimpleNamespace(shares=(SimpleNamespace(peer_id=PEERS[1]),), compute_s=0.01, optimizer_s=0.002)
    plan = SimpleNamespace(stages=(stage,), micro_batches=4, peer_ids=PEERS)
    job = SimpleNamespace(
        plan=plan,
        replica_plan=None,
        stage_times=deque(
            [
                claims.StageTime(0.05, 0.01, 0.01, 0.0),
                claims.StageTime(0.5, 0.0, 0.0, 0.0),
                claims.StageTime(0.06, 0.02, 0.005, 0.015),
            ]
        ),
    )
    own = claims.own_step_times(job, PEERS[1])
    assert own == {
        "step_s": 0.04,
        "wait_s": 0.01,
        "wait_up_s": 0.005,
        "wait_down_s": 0.0,
        "group_wait_s": 0.0,
        "predicted_s": pytest.approx(0.042),
    }
    job.stage_times.append(claims.StageTime(0.07, 0.01, 0.01, 0.0, 0.02))  # a tensor-parallel rank's step
    assert claims.own_step_times(job, PEERS[1])["step_s"] == pytest.approx(0.04)  # less its wait in the group
    assert claims.own_step_total(job) == 0.07  # the median of 0.05, 0.5, 0.06, 0.07 (the upper middle)
    times: dict[str, tuple[float, float]] = {}
    claims.record_step_time(times, PEERS[1], report_of_event("j" * 32, 0, {"event": "checkpoint", **own}))
    base = JobReport("j" * 32, 0, ReportKind.CHECKPOINT)
    for bad in (
        replace(base, step_s=float("nan"), predicted_s=1.0),
        replace(base, step_s=1.0, predicted_s=-1.0),
        replace(base, step_s=float("inf"), predicted_s=1.0),
        replace(base, predicted_s=1.0),
        base,
    ):
        claims.record_step_time(times, PEERS[2], bad)
    assert set(times) == {PEERS[1]}
    big = SimpleNamespace(memory_bytes=1 << 40)
    members = {PEERS[0]: big, PEERS[1]: SimpleNamespace(memory_bytes=1 << 30), PEERS[2]: big}
    used = SimpleNamespace(memory_bytes=((PEERS[0], 1 << 20), (PEERS[1], 1 << 20), (PEERS[2], 1 << 20)))
    standby_job = cast(
        Job,
        SimpleNamespace(
            planned_peers=lambda: PEERS, members=members, leading=LeaderRecord(), plan=used, replica_plan=None
        ),
    )
    assert choose_standby(standby_job, PEERS[0]) == PEERS[1]  # the plan uses as much of each: the smaller claim
    standby_job.plan = cast(Any, SimpleNamespace(memory_bytes=((PEERS[1], 1 << 20), (PEERS[2], 1 << 21))))
    assert choose_standby(standby_job, PEERS[0]) == PEERS[2]  # nobody measured yet: the plan uses more of it
    standby_job.leading.speed.measured = times
    assert choose_standby(standby_job, PEERS[0]) == PEERS[1]  # the measured member, not the larger claim
    standby_job.leading.speed.measured = {}
    standby_job.leading.speed.timed = {PEERS[1]: Timed(1e9, 1e8, 0.2)}
    assert choose_standby(standby_job, PEERS[0]) == PEERS[1]  # its speed challenge passed: measured too
    standby_job.leading.speed.timed = {PEERS[1]: Timed(1e9, 1e8, 0.2), PEERS[2]: Timed(1e9, 1e8, 10.0, "forged")}
    standby_job.leading.speed.measured = {PEERS[2]: (0.1, 0.1)}
    assert choose_standby(standby_job, PEERS[0]) == PEERS[1]  # a failed challenge never stands by
    standby_job.leading.speed.timed = {}
    standby_job.leading.speed.discounts = {PEERS[2]: 50.0}
    assert choose_standby(standby_job, PEERS[0]) == PEERS[1]  # nor a discounted member


def test_an_offer_of_8_tib_does_not_make_a_member_the_standby() -> None:
    """Issue #29 item 7: the standby (who receives the owner's data set) is ranked by the memory the plan uses on
    it, what its worker shows by running, never by its offer: 8 TiB offered beside 16 GiB changes nothing."""
    from arceusd.jobs.leader.standby_sync import choose_standby

    members = {
        PEERS[0]: SimpleNamespace(memory_bytes=16 << 30),
        PEERS[1]: SimpleNamespace(memory_bytes=16 << 30),
        PEERS[2]: SimpleNamespace(memory_bytes=8 << 40),
    }
    the_plan = SimpleNamespace(memory_bytes=((PEERS[0], 5 << 20), (PEERS[1], 3 << 20), (PEERS[2], 2 << 20)))
    job = cast(
        Job,
        SimpleNamespace(
            planned_peers=lambda: PEERS, members=members, leading=LeaderRecord(), plan=the_plan, replica_plan=None
        ),
    )
    assert choose_standby(job, PEERS[0]) == PEERS[1]
    job.leading.speed.measured = {PEERS[1]: (0.1, 0.1), PEERS[2]: (0.1, 0.1)}
    assert choose_standby(job, PEERS[0]) == PEERS[1]


def test_shapes_computed_for_a_plan_a_replica_drop_replaced_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica drop (or rebuild) changes the plan in the same epoch and clears the shapes; the shapes a child was
    computing for the plan before it must not be kept for the new one (they named the dropped replica's devices,
    and the next commit excluded every device left as "holding no place in the plan")."""
    from arceusd.jobs.procs import filework

    job = fake_job()
    before = job.plan
    after = cast(Any, SimpleNamespace(stages=()))

    async def shapes_of(_spec: bytes, plan_data: object) -> tuple[dict[str, Any], dict[str, float]]:
        if plan_data is before:  # the drop lands while the child computes the old plan's shapes
            job.plan, job.leading.checks.shard_shapes = after, {}
            return {PEERS[0]: {}}, {}
        return {PEERS[1]: {}}, {}

    monkeypatch.setattr(shard_checks, "encode_start", lambda _inputs, plan: (None, plan))
    monkeypatch.setattr(filework, "plan_shapes", shapes_of)
    assert trio.run(shard_checks.plan_shapes, job) == {PEERS[0]: {}}, "the caller gets what it asked for"
    assert job.leading.checks.shard_shapes == {}, "the old plan's shapes are not kept for the new plan"
    assert trio.run(shard_checks.plan_shapes, job) == {PEERS[1]: {}}
    assert job.leading.checks.shard_shapes == {job.epoch: {PEERS[1]: {}}}, "the new plan's are"
