"""Rebuilding a dropped replica on a spare member (``arceusd.jobs.leader.regrow``; a device left's side:
``arceusd.jobs.member.replica_changes``, issue 22): what the spare's start says and how it checks the plan, where the
replicas left hold, and how a device left takes the rebuilt replica in."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from arceusd.jobs.common.replica_change import dropped_plan, grown_plan
from arceusd.jobs.leader.replica_drop import hold_step
from arceusd.jobs.plans.grow_start import GrowStart
from arceusd.jobs.plans.planning import PlanRefused, encode_job_start, make_job_plan, verify_grown_start
from partitioner.replicas import cut_alike, replica_plan_bytes, with_devices
from protocol.job_wire import JobGrowReplica, PeerAddress
from tests.unit.test_job_lifecycle import JOB, ME, OTHER, FakePeers, manager
from tests.unit.test_planning_replicas import FAST, _links, _offers, _spec
from tests.unit.test_replica_drop_daemon import THIRD, FakeWorker, _header, member_job

SPARE = "9" * 32


def test_a_grow_description_is_bounded_and_checked() -> None:
    grow = GrowStart(1, (0, 1), 2, 2)
    assert GrowStart.from_wire(grow.to_wire()) == grow and grow.position == 1
    assert GrowStart.from_wire(b"") is None
    for bad in (
        b"{",
        b'{"slot": 1}',
        b'{"slot": 1, "slots": [0, 1], "shares": 2, "generation": 0}',
        b'{"slot": 2, "slots": [0, 1], "shares": 2, "generation": 1}',
        b'{"slot": 1, "slots": [1, 0], "shares": 2, "generation": 1}',
        b'{"slot": 1, "slots": [0, 1], "shares": 5000, "generation": 1}',
        b'{"slot": 1, "slots": [0, 1], "shares": 2, "generation": "1"}',
    ):
        with pytest.raises(ValueError):
            GrowStart.from_wire(bad)


def test_a_spare_checks_the_grown_plan_instead_of_recomputing_it() -> None:
    spec = _spec(replicas=2, sync="every_step")
    offers = _offers(3)
    inputs, plan = make_job_plan(spec, offers[:2], {}, _links(2, FAST))
    spare = offers[2]
    smaller = dropped_plan(plan, 2, 1)
    grown, position = grown_plan(smaller, (0,), 1, (spare.peer_id,))
    assert position == 1 and cut_alike(grown.replicas[0], grown.replicas[1])
    assert grown.replicas[1].peer_ids == (spare.peer_id,) and grown.replicas[0] == plan.replicas[0]
    inputs_data, plan_data = encode_job_start(spec, inputs, grown)
    got_inputs, got = verify_grown_start(spec, inputs_data, plan_data, spare, 1)
    assert got == grown and got_inputs == inputs
    with pytest.raises(PlanRefused, match="no place in replica 0"):
        verify_grown_start(spec, inputs_data, plan_data, spare, 0)
    small = dataclasses.replace(spare, memory_bytes=1)
    with pytest.raises(PlanRefused, match="more than it offered"):
        verify_grown_start(spec, inputs_data, plan_data, small, 1)
    other = dataclasses.replace(grown.replicas[1], micro_batches=grown.replicas[1].micro_batches + 1)
    skewed = dataclasses.replace(grown, replicas=(grown.replicas[0], other))
    with pytest.raises(PlanRefused, match="not cut alike"):
        verify_grown_start(spec, inputs_data, replica_plan_bytes(skewed), spare, 1)
    with pytest.raises(ValueError, match="in the plan already"):
        grown_plan(smaller, (0,), 1, (offers[0].peer_id,))
    with pytest.raises(ValueError, match="distinct devices"):
        with_devices(plan.replicas[0], ())


def test_the_hold_step_is_a_checkpoint_every_survivor_is_still_before() -> None:
    job = cast(Any, dataclasses.make_dataclass("J", ["spec", "replica_plan", "step", "total_steps"]))
    spec = _spec(replicas=2, sync="every_step")
    _, plan = make_job_plan(spec, _offers(2), {}, _links(2, FAST))
    checkpoint = dataclasses.make_dataclass("C", ["interval_steps"])
    spec_of = dataclasses.make_dataclass("S", ["checkpoint"])
    assert hold_step(job(spec_of(checkpoint(100)), plan, 105, 300)) == 200
    assert hold_step(job(spec_of(checkpoint(100)), plan, 98, 300)) == 100
    assert hold_step(job(spec_of(checkpoint(100)), plan, 99, 300)) == 200  # one step ahead may be there already
    assert hold_step(job(spec_of(checkpoint(100)), plan, 205, 300)) == 0  # the end comes first
    assert hold_step(job(spec_of(checkpoint(0)), plan, 5, 300)) == 0
    diloco = dataclasses.replace(plan, sync_mode=type(plan.sync_mode).DILOCO, diloco_h=50)
    assert hold_step(job(spec_of(checkpoint(100)), diloco, 60, 300)) == 200  # replicas may be h steps apart


def _survivor(tmp_path: Path) -> tuple[Any, FakeWorker]:
    """ME after the replica of THIRD (of three, one device each, OTHER leading) was dropped: ring generation 1,
    slots 0 and 1 of 3 shares (a real plan)."""
    job, worker = member_job(tmp_path)
    offers = [dataclasses.replace(o, peer_id=p) for o, p in zip(_offers(3), (OTHER, ME, THIRD), strict=True)]
    ids = [o.peer_id for o in offers]
    links = {(a, b): FAST for a in ids for b in ids if a < b}
    _, plan = make_job_plan(_spec(replicas=3, sync="every_step", batch_size=60), offers, {}, links, OTHER)
    assert len(plan.replicas) == 3
    index = next(i for i, r in enumerate(plan.replicas) if THIRD in r.peer_ids)
    job.replica_plan = dropped_plan(plan, 3, index)
    job.replica_slots = tuple(i for i in range(3) if i != index)
    job.data_shares, job.ring_generation = 3, 1
    return job, worker


def test_a_device_left_takes_the_rebuilt_replica_in_and_tells_its_worker(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    job, worker = _survivor(tmp_path)
    mgr.jobs[JOB] = job
    free = next(i for i in range(3) if i not in job.replica_slots)
    before = [r.peer_ids for r in job.replica_plan.replicas]
    grow = JobGrowReplica(JOB, 200, free, 2, (SPARE,), (PeerAddress(SPARE, "127.0.0.1:7"),))
    ack = trio.run(mgr.replicas.on_grow, _header(), grow)
    assert ack.ok, ack
    after = [r.peer_ids for r in job.replica_plan.replicas]
    assert sorted(after) == sorted([*before, (SPARE,)]) and after[sorted((*job.replica_slots,)).index(free)] == (SPARE,)
    assert (job.replica_slots, job.ring_generation) == ((0, 1, 2), 2)
    assert cut_alike(job.replica_plan.replicas[0], job.replica_plan.replicas[-1])
    assert worker.commands == [
        {
            "cmd": "grow_replica",
            "step": 200,
            "slot": free,
            "generation": 2,
            "stages": [[SPARE]],
            "addresses": {SPARE: "127.0.0.1:7"},
        }
    ]
    assert job.rebuilt_replicas == [(200, (SPARE,))]
    # the same rebuild again, a taken slot, a slot past the shares, a device of the plan: refused, no change
    taken = next(iter(set(job.replica_slots) - {free}))
    for bad, why in (
        (grow, "does not follow"),
        (dataclasses.replace(grow, generation=3, slot=taken), "taken"),
        (dataclasses.replace(grow, generation=3, slot=5), "does not follow"),
        (dataclasses.replace(grow, generation=3, devices=(ME,), addresses=(PeerAddress(ME, "127.0.0.1:8"),)), "taken"),
    ):
        answer = trio.run(mgr.replicas.on_grow, _header(), bad)
        assert not answer.ok and why in answer.reason, (bad, answer)
    assert len(worker.commands) == 1
    released = trio.run(mgr.replicas.on_grow, _header(), JobGrowReplica(JOB, 0, release=True))
    assert released.ok and worker.commands[-1] == {"cmd": "go_on"}
    stranger = trio.run(mgr.replicas.on_grow, _header(sender=THIRD), JobGrowReplica(JOB, 0, release=True))
    assert not stranger.ok and len(worker.commands) == 2
