"""Job reports travel as typed messages (issue #18): a worker event becomes a :class:`JobReport` once
(:func:`arceusd.jobs.member.reports.report_of_event`), every kind round-trips through the codec, the codec refuses a
report outside its types and bounds, and a leader drops and counts what it refuses and goes on serving."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import msgpack
import pytest
import trio
import trio.testing

from arceusd.base.identity import Identity
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.leader.shard_checks import ReportProblem
from arceusd.jobs.member.reports import KINDS, report_of_event
from arceusd.jobs.record.job import Job
from arceusd.membership.config import local
from arceusd.network.peers import PeerService, UnaryTransport, wall_ms
from arceusd.transport import Stream
from arceusd.transport.memory import MemoryNetwork
from protocol import codec
from protocol.envelope import Header, seal
from protocol.errors import RemoteProtocolError
from protocol.job_wire import (
    REPORT_MESSAGE_MAX,
    SHARD_NAME_MAX,
    JobAck,
    JobReport,
    ReportCursor,
    ReportKind,
    ReportShard,
)
from protocol.messages import type_id_of
from tests.unit.test_job_lifecycle import JOB, OTHER, FakePeers, leading_job, manager

SHARD: dict[str, Any] = {"name": "stage0-rank0.safetensors", "sha256": "ab" * 32, "size": 4096}
CLAIMS = {
    "step_s": 0.04,
    "predicted_s": 0.042,
    "wait_s": 0.01,
    "wait_up_s": 0.005,
    "wait_down_s": 0.005,
    "group_wait_s": 0.0,
}
EVENTS: dict[ReportKind, dict[str, Any]] = {  # one worker event of each kind, as its JSON line reads
    ReportKind.CHECKPOINT: {
        "event": "checkpoint",
        "step": 20,
        "shard": SHARD,
        "cursor": {"epoch": 1, "step": 4},
        "param_bytes": 1000,
        "optimizer_bytes": 2000,
        **CLAIMS,
    },
    ReportKind.WITNESS: {"event": "witness", "step": 20, "digest": "cd" * 32},
    ReportKind.DONE: {"event": "done", "step": 100},
    ReportKind.ERROR: {"event": "error", "message": "RuntimeError: out of memory \u00e9"},
    ReportKind.LOST: {"event": "lost", "message": "the worker exited with code -9: killed"},
    ReportKind.LEAVE: {"event": "leave"},
}


def test_every_kind_round_trips_through_the_codec() -> None:
    assert set(EVENTS) == set(ReportKind) == set(KINDS.values())
    for kind, event in EVENTS.items():
        report = report_of_event(JOB, 3, event)
        assert (report.job_id, report.epoch, report.kind) == (JOB, 3, kind)
        data = codec.encode(report)
        assert codec.decode(type_id_of(JobReport), data) == report
        assert codec.encode(codec.decode_as(JobReport, data)) == data  # deterministic: can be signed
        assert report.step == event.get("step") and report.digest == event.get("digest", "")
        assert report.message == event.get("message", "")
    checkpoint = report_of_event(JOB, 3, EVENTS[ReportKind.CHECKPOINT])
    assert checkpoint.shard == ReportShard(**SHARD)
    assert checkpoint.cursor == ReportCursor(**EVENTS[ReportKind.CHECKPOINT]["cursor"])
    assert {key: getattr(checkpoint, key) for key in CLAIMS} == CLAIMS
    assert report_of_event(JOB, 3, EVENTS[ReportKind.DONE]).shard is None  # a kind without the part: absent


def test_a_worker_event_becomes_a_report_within_the_wire_bounds() -> None:
    long = report_of_event(JOB, 0, {"event": "error", "message": "\u00e9" * REPORT_MESSAGE_MAX + "\ud800"})
    assert len(long.message.encode()) <= REPORT_MESSAGE_MAX and long.message.strip("\u00e9") == ""
    codec.encode(long)
    ints = report_of_event(JOB, 0, {**EVENTS[ReportKind.CHECKPOINT], "wait_s": 0, "step_s": 1})
    assert type(ints.wait_s) is float and type(ints.step_s) is float  # a JSON integer is a float on the wire
    odd = report_of_event(
        JOB,
        0,
        {
            "event": "checkpoint",
            "step": True,
            "shard": {**SHARD, "size": "12"},
            "cursor": {"epoch": 1, "step": 4, "extra": 0},
            "wait_s": "0.1",
        },
    )
    assert (odd.step, odd.shard, odd.cursor, odd.wait_s) == (None, None, None, None)  # left out; the leader refuses
    for event in (
        {**EVENTS[ReportKind.CHECKPOINT], "shard": {**SHARD, "name": "x" * (SHARD_NAME_MAX + 1)}},
        {**EVENTS[ReportKind.DONE], "step": 2**70},
        {"event": "step", "step": 1},
        {"event": None},
        {},
    ):
        with pytest.raises(ValueError):
            report_of_event(JOB, 0, event)


def _tampered(report: JobReport, **fields: Any) -> bytes:
    wire = msgpack.unpackb(codec.encode(report), raw=False)
    for key, value in fields.items():
        if key.startswith("shard_"):
            wire["shard"] = {**wire["shard"], key.removeprefix("shard_"): value}
        elif value is _GONE:
            del wire[key]
        else:
            wire[key] = value
    return cast(bytes, msgpack.packb(wire, use_bin_type=True))


_GONE = object()
BAD_WIRE: list[tuple[dict[str, Any], str]] = [
    ({"kind": 99}, "bad_enum"),  # no such kind
    ({"kind": "checkpoint"}, "wrong_type"),
    ({"shard_name": "x" * (SHARD_NAME_MAX + 1)}, "too_long"),
    ({"shard_sha256": "a" * 65}, "too_long"),
    ({"shard_size": True}, "wrong_type"),
    ({"shard_size": "12"}, "wrong_type"),
    ({"digest": "a" * 65}, "too_long"),
    ({"message": "m" * (REPORT_MESSAGE_MAX + 1)}, "too_long"),
    ({"wait_s": 1}, "wrong_type"),  # an int is not a float
    ({"step_s": "0.1"}, "wrong_type"),
    ({"step": 1.0}, "wrong_type"),
    ({"cursor": {"epoch": 1}}, "missing_field"),
    ({"event": '{"event": "checkpoint"}'}, "unknown_field"),  # the old JSON form
    ({"kind": _GONE}, "missing_field"),
]


def test_the_codec_refuses_reports_outside_their_types_and_bounds() -> None:
    report = report_of_event(JOB, 3, EVENTS[ReportKind.CHECKPOINT])
    assert codec.decode_as(JobReport, _tampered(report)) == report
    for fields, reason in BAD_WIRE:
        with pytest.raises(RemoteProtocolError) as info:
            codec.decode(type_id_of(JobReport), _tampered(report, **fields))
        assert info.value.reason == reason, fields


# ------------------------------------------------------------------------------------------------ a leader
async def _service(nursery: trio.Nursery, net: MemoryNetwork, i: int) -> PeerService:
    identity = Identity.generate()
    holder: dict[str, PeerService] = {}

    async def on_call(request: bytes) -> bytes:
        return await holder["p"].handle_call(request)

    async def refuse(_stream: Stream) -> None:
        return None

    async def serve(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with net.open_transport(
            identity, f"10.0.0.{i}", 7000, unary_handler=on_call, stream_handler=refuse
        ) as transport:
            task_status.started(transport)
            await trio.sleep_forever()

    transport: Any = await nursery.start(serve)
    holder["p"] = PeerService(identity, cast(UnaryTransport, transport), local(), transport.address, 1)
    return holder["p"]


def test_a_leader_drops_and_counts_refused_reports_and_keeps_serving(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    seen: dict[str, Any] = {}
    restarts: list[str] = []
    mgr.intake.ports = replace(mgr.intake.ports, request_restart=lambda job, reason: restarts.append(reason))

    async def main() -> None:
        net = MemoryNetwork()
        async with trio.open_nursery() as nursery:
            leader, member = await _service(nursery, net, 0), await _service(nursery, net, 1)
            me = member.identity.peer_id
            # two stages (the member's first), so that no step is complete and nothing is committed
            job.offers[me] = cast(Any, SimpleNamespace(address=member.address))
            job.core.handle(e.MemberJoined(me, memory_ok=False), 0.0)
            cast(Any, job).plan = SimpleNamespace(
                peer_ids=(me, OTHER),
                stages=tuple(
                    SimpleNamespace(start=i, end=i + 1, shares=(SimpleNamespace(peer_id=p),))
                    for i, p in enumerate((me, OTHER))
                ),
            )
            assert job.core.lead is not None
            job.core.lead.plan = (me, OTHER)  # the plan's devices: the core's
            block = SimpleNamespace(param_bytes=4096, optimizer_bytes=4096)
            cast(Any, job).inputs = SimpleNamespace(blocks=(block,) * 2)
            mgr.jobs[JOB] = job
            leader.register(JobReport, mgr.intake.on_report)

            async def send(report: JobReport) -> Any:
                return await member.request(
                    leader.address,
                    leader.identity.peer_id,
                    report,
                    timeout=5,
                    job_id=JOB,
                    term=job.term,
                    epoch=job.epoch,
                )

            async def send_raw(payload: bytes) -> bytes:
                frame = seal(
                    member.identity,
                    msg_type=type_id_of(JobReport),
                    payload=payload,
                    boot_id=member.boot_id,
                    seq=next(member._seq),
                    timestamp_ms=wall_ms(),
                    recipient=leader.identity.peer_id,
                    job_id=JOB,
                    term=job.term,
                    epoch=job.epoch,
                )
                return await member.transport.call(leader.address, b"E" + frame, 5)

            good = report_of_event(JOB, job.epoch, EVENTS[ReportKind.CHECKPOINT])
            # non-finite claims: the shard is taken, the claims are not kept
            nan = replace(good, step_s=math.nan, wait_s=math.inf, wait_up_s=-math.inf, predicted_s=math.nan)
            ack = await send(nan)
            assert isinstance(ack, JobAck) and ack.ok, ack
            assert good.step is not None and me in job.leading.commits.reports[good.step]
            assert (
                me not in job.leading.speed.measured
                and me not in job.leading.speed.waits
                and me not in job.leading.speed.link_waits
            )
            # outside the codec's types and bounds: no answer, counted by the peer service, the job untouched
            for fields, reason in BAD_WIRE:
                before = leader.rejected[reason]
                assert await send_raw(_tampered(good, **fields)) == b"", fields
                assert leader.rejected[reason] == before + 1, fields
            book = job.leading
            assert (
                book.checks.refused_reports == {}
                and book.checks.stale_reports == 0
                and me not in book.checks.excluded
                and not restarts
            )
            # another plan epoch: stale, as ever
            stale = await send(replace(good, epoch=job.epoch + 1))
            assert isinstance(stale, JobAck) and not stale.ok and job.leading.checks.stale_reports == 1
            # still serving: the next good report is taken with its claims
            ack = await send(replace(good, step=40))
            assert isinstance(ack, JobAck) and ack.ok
            assert me in job.leading.commits.reports[40] and job.leading.speed.measured[me] == (
                good.step_s,
                good.predicted_s,
            )
            assert job.leading.commits.cursors[40] == EVENTS[ReportKind.CHECKPOINT]["cursor"]
            # a negative size decodes, and the leader's check refuses it: counted, the sender excluded
            assert good.shard is not None
            await send(replace(good, step=60, shard=replace(good.shard, size=-1)))
            seen.update(
                refused=dict(book.checks.refused_reports), excluded=me in book.checks.excluded, restarts=list(restarts)
            )
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())
    assert seen["refused"] == {ReportProblem.SIZE.value: 1} and seen["excluded"]
    assert len(seen["restarts"]) == 1 and "size" in seen["restarts"][0]  # the job replans without the sender


def test_a_failure_and_a_leave_reach_the_leader_as_typed_reports(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    mgr.jobs[JOB] = job
    restarts: list[str] = []
    fed: list[e.Event] = []

    def feed(job: Job, event: e.Event) -> list[a.Action]:
        fed.append(event)
        return []

    # the intake's port: what it calls of the manager (issue 32)
    mgr.intake.ports = replace(mgr.intake.ports, request_restart=lambda job, reason: restarts.append(reason), feed=feed)
    header = cast(Header, SimpleNamespace(sender=OTHER))
    error = report_of_event(JOB, job.epoch, {"event": "error", "message": "x" * 1000})
    ack = trio.run(mgr.intake.on_report, header, error)
    # the core decides what a failed worker means (its replica dropped, or a repartition)
    assert ack.ok and fed == [e.WorkerFailed(job.core.stamp, OTHER, "x" * 300)]  # a bounded part of the message
    leave = JobReport(JOB, job.epoch, ReportKind.LEAVE)  # what control_methods.m_leave sends
    assert trio.run(mgr.intake.on_report, header, leave).ok
    assert OTHER not in job.members and OTHER not in job.core.members and "left" in restarts[-1]
    assert job.core.lead is not None and OTHER in job.core.lead.announced  # not invited straight back


def test_a_witness_carries_its_devices_claims_to_the_leader(tmp_path: Path) -> None:
    """Every replica's device says how fast it ran with its witness (the first replica's say it with their shard
    too), so the leader judges the devices of every replica, not only the first's (issues #19, #22)."""
    mgr, _ = manager(tmp_path, FakePeers())
    job = leading_job(tmp_path)
    cast(Any, job.spec.checkpoint).interval_steps = 20
    second = "d" * 32
    first_plan = SimpleNamespace(peer_ids=(OTHER,), stages=(SimpleNamespace(shares=(SimpleNamespace(peer_id=OTHER),)),))
    cast(Any, job).plan = first_plan
    cast(Any, job).replica_plan = SimpleNamespace(
        replicas=(first_plan, SimpleNamespace(peer_ids=(second,))),
        peer_ids=(OTHER, second),
        replica_of=lambda p: {OTHER: 0, second: 1}.get(p),
    )
    event = {
        **EVENTS[ReportKind.WITNESS],
        "step_s": 0.3,
        "predicted_s": 0.1,
        "wait_s": 0.02,
        "wait_up_s": 0.01,
        "wait_down_s": 0.01,
    }
    report = report_of_event(JOB, job.epoch, event)
    trio.run(mgr.intake.take, job, second, report)
    assert job.leading.commits.witnesses[20] == {second: "cd" * 32}
    assert job.leading.commits.latest[second] is report  # kept as it came: status shows its figures
    book = job.leading
    assert (
        book.speed.measured[second] == (0.3, 0.1)
        and second in book.speed.link_waits
        and book.speed.waits[second] == 0.02
    )
    stranger = "e" * 32  # no place in the replicas: refused before anything of it is kept
    mgr.intake.ports = replace(mgr.intake.ports, request_restart=lambda job, reason: None)
    trio.run(mgr.intake.take, job, stranger, report)
    assert stranger not in job.leading.speed.measured and stranger not in job.leading.commits.witnesses[20]
