"""Issue 31: a spare the old leader accepted stays usable by the standby that takes the job over.

A spare is in no stage, so it is in no election (the job's election is its plan's devices'). Before, the leader
synced its standby only the plan's offers (the standby took over without the spare) and the spare, asked by the
new leader at a newer term, found no election naming it and refused ("this device follows <the dead leader>").
Now the sync carries every member's offer (checked: plausible; kept if a member the leader's start named), the
standby leads the spares alive in its view that the spec admits, and a spare follows the standby its leader named
once that leader is gone from its own view, never another peer. Over fakes of the manager's context (the plan,
the spec and the job are real)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from arceusd.files.checkpoint import MANIFEST_NAME, step_dir
from arceusd.jobs.common.manager_base import JobContext
from arceusd.jobs.core import Stamp, events, leadership
from arceusd.jobs.leader.standby_sync import StandbySyncing
from arceusd.jobs.plans.standby import offers_from_wire, takeover_offers
from protocol.envelope import Header
from protocol.job_wire import JobAck, StandbySync
from tests.unit.test_spare_start import JOB_ID, LEADER, SLOW, SLOWER, planned_job

STRANGER = "e" * 32


def test_the_standby_is_synced_the_spares_offers_and_keeps_those_its_leader_named(tmp_path: Path) -> None:
    job = planned_job(tmp_path, LEADER)  # the plan is the leader's alone: SLOW and SLOWER are spares
    job.core.standby = SLOW  # (as a plan would name it)
    job.spec_bytes = b'{"data": {"kind": "mnist", "dir": "mnist", "images": "i", "labels": "l"}}'
    manifest = step_dir(job.paths.checkpoints, 4) / MANIFEST_NAME
    manifest.parent.mkdir(parents=True)
    manifest.write_bytes(b"signed manifest")
    sent: list[StandbySync] = []

    async def request(_address: str, peer: str, msg: StandbySync, **_kw: Any) -> JobAck:
        assert peer == SLOW
        sent.append(msg)
        return JobAck(True)

    ports = SimpleNamespace(peers=SimpleNamespace(request=request))  # what sync_standby calls of its port
    trio.run(StandbySyncing(cast(Any, ports)).sync_standby, job, 4, ())
    assert len(sent) == 1
    # the standby knows the plan it was started with and the members that start named (JobStart.members)
    kept = offers_from_wire(sent[0].offers, job.plan_peers(), tuple(sorted(job.members)))
    assert set(kept) == {LEADER, SLOW, SLOWER}, "the spares' offers travel with the plan's"
    assert kept[SLOWER] == job.members[SLOWER]
    # a member no start named yet (it joined the leader since): left out, and the rest of the sync still holds
    # (refusing the whole sync left the standby without the checkpoint, seen in the killed-leader take-over)
    assert set(offers_from_wire(sent[0].offers, job.plan_peers(), (LEADER, SLOW))) == {LEADER, SLOW}


def test_the_new_leader_leads_the_spares_alive_and_admitted_at_their_address_now(tmp_path: Path) -> None:
    job = planned_job(tmp_path, LEADER)
    offers = {p: job.members[p] for p in (LEADER, SLOW, SLOWER)}
    alive = {LEADER: "h:1", SLOW: "h:2", SLOWER: "h:3"}
    led = takeover_offers(offers, alive, LEADER, SLOW, lambda p: True)
    assert set(led) == {SLOWER}, "the spare, not the old leader, not the new one (its own offer is fresh)"
    assert led[SLOWER] == dataclasses.replace(offers[SLOWER], address="h:3")
    assert takeover_offers(offers, {SLOW: "h:2"}, LEADER, SLOW, lambda p: True) == {}, "a spare gone is left"
    assert takeover_offers(offers, alive, LEADER, SLOW, lambda p: p != SLOWER) == {}, "admission still holds"


def test_a_spare_follows_only_the_standby_its_gone_leader_named() -> None:
    assert leadership.spare_may_follow(SLOW, SLOW, spare=True, leader_gone=True)
    assert not leadership.spare_may_follow(STRANGER, SLOW, spare=True, leader_gone=True), "not any peer"
    assert not leadership.spare_may_follow(SLOW, SLOW, spare=True, leader_gone=False), "not while its leader lives"
    assert not leadership.spare_may_follow(SLOW, SLOW, spare=False, leader_gone=True), "a plan member asks its election"
    assert not leadership.spare_may_follow(SLOW, "", spare=True, leader_gone=True), "no standby named: nobody"


def _context(job: Any, me: str, answering: list[str]) -> JobContext:
    node = SimpleNamespace(
        identity=SimpleNamespace(peer_id=me), paths=SimpleNamespace(jobs_dir=Path("/nonexistent")), elections=None
    )
    peers = SimpleNamespace(
        answering_peers=lambda: list(answering),
        membership=SimpleNamespace(members={p: SimpleNamespace(address=f"h:{p[0]}") for p in answering}),
    )
    ctx = JobContext(cast(Any, node), cast(Any, peers))
    ctx.jobs[JOB_ID] = job
    return ctx


def test_a_spare_takes_the_new_leaders_start_once_its_leader_is_gone(tmp_path: Path) -> None:
    """On main the spare refused: no election names the standby on a device that is in none."""
    job = planned_job(tmp_path, SLOWER)
    job.mark_spare(1, 2, (LEADER, SLOW, SLOWER))
    job.core.handle(events.StartReceived(Stamp(1, 2), SLOW), 0.0)  # the leader's start named SLOW its standby
    assert job.is_spare() and job.standby == SLOW and job.leader == LEADER
    new_term = cast(Header, SimpleNamespace(sender=SLOW, term=2, epoch=1))
    stranger = cast(Header, SimpleNamespace(sender=STRANGER, term=2, epoch=1))

    alive = _context(job, SLOWER, [LEADER, SLOW, SLOWER])  # the old leader still in the view: no
    refused = trio.run(alive.check_leader, new_term, job)
    assert refused is not None and refused.follows == LEADER and job.leader == LEADER

    gone = _context(job, SLOWER, [SLOW, SLOWER])
    refused = trio.run(gone.check_leader, stranger, job)
    assert refused is not None and job.leader == LEADER, "another peer is not taken on its word"
    assert trio.run(gone.check_leader, new_term, job) is None
    assert job.leader == SLOW and job.term == 2 and job.leader_address == "h:b"
