"""The job layer's replica planning: the spec's replica keys reach the planner, and its answer becomes the
workers' replica layout and sync settings."""

from __future__ import annotations

from typing import Any

import pytest

from arceusd.jobs.plans.planning import Offer, make_replica_plan, replica_sync_config, worker_replicas
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.jobs.spec.schema import parse_spec
from arceusd.worker.protocol import MemberConfig, ReplicaSyncConfig, WorkerConfig
from partitioner import Link, PlanError, ReplicaSyncMode
from tests.unit.test_jobspec import ROOT, mnist_doc

GIB = 1 << 30


def _spec(**training: Any) -> JobSpec:
    d = mnist_doc()
    d["training"] = {"steps": 200, "batch_size": 64, "micro_batches": 2, "optimizer": "sgd", "lr": 0.1, **training}
    return parse_spec(d, base_dir=ROOT, check_files=False)


def _offers(n: int) -> list[Offer]:
    return [Offer(f"{i:032x}", f"127.0.0.1:{9000 + i}", 1e10, 4 * GIB) for i in range(n)]


def _links(n: int, link: Link) -> dict[tuple[str, str], Link]:
    ids = [f"{i:032x}" for i in range(n)]
    return {(a, b): link for a in ids for b in ids if a < b}


FAST = Link(1e-4, 1.25e8)
SLOW = Link(2e-2, 6.25e5)


def test_one_replica_is_todays_plan_and_needs_no_layout() -> None:
    _, plan = make_replica_plan(_spec(), _offers(4), {}, _links(4, FAST))
    assert len(plan.replicas) == 1 and plan.sync_mode is ReplicaSyncMode.NONE
    assert worker_replicas(plan) == () and replica_sync_config(_spec(), plan) is None


def test_auto_replicas_on_fast_links_become_the_workers_layout() -> None:
    spec = _spec(replicas="auto")
    _, plan = make_replica_plan(spec, _offers(4), {}, _links(4, FAST))
    assert len(plan.replicas) >= 2  # (a tiny MLP: the planner picks DiLoCo, its sync outweighs 0.2 ms steps)
    layout = worker_replicas(plan)
    sync = replica_sync_config(spec, plan)
    mode = "diloco" if plan.sync_mode is ReplicaSyncMode.DILOCO else "allreduce"
    assert sync == ReplicaSyncConfig(mode=mode, diloco_h=200, outer_lr=0.7, outer_momentum=0.9, codec="int8")
    first = layout[0][0].members[0].peer_id
    config = WorkerConfig(
        job_id="j",
        term=1,
        epoch=1,
        spec={},
        stages=layout[0],
        micro_batches=2,
        schedule="1f1b",
        peer_id=first,
        state_dir="/x",
        listen_host="127.0.0.1",
        owner=first,
        checkpoint_dir="/x",
        checkpoint_interval=0,
        total_steps=1,
        replicas=layout,
        replica_sync=sync,
    )
    assert config.replica_count() == len(plan.replicas)
    assert all(isinstance(m, MemberConfig) for rep in layout for st in rep for m in st.members)


@pytest.mark.parametrize("sync", ["every_step", "diloco"])
def test_fixed_replicas_and_sync_are_what_the_spec_says(sync: str) -> None:
    spec = (
        _spec(replicas=2, sync=sync, diloco={"inner_steps": 20, "compression": "none"})
        if sync == "diloco"
        else _spec(replicas=2, sync=sync)
    )
    _, plan = make_replica_plan(spec, _offers(3), {}, _links(3, SLOW))
    assert len(plan.replicas) == 2
    config = replica_sync_config(spec, plan)
    assert config is not None
    assert config.mode == ("diloco" if sync == "diloco" else "allreduce")
    if sync == "diloco":
        assert (config.diloco_h, config.codec) == (20, "raw")


def test_auto_on_a_slow_link_never_predicts_slower_than_one_device() -> None:
    spec = _spec(replicas="auto", diloco={"inner_steps": 50})
    _, plan = make_replica_plan(spec, _offers(2), {}, _links(2, SLOW))
    _, alone = make_replica_plan(spec, _offers(1), {}, {})
    assert plan.predicted_step_time_s <= alone.predicted_step_time_s * (1 + 1e-9)
    assert plan.sync_mode is not ReplicaSyncMode.ALLREDUCE  # all-reduce over 5 Mbit/s never pays here


def test_the_jobs_compression_compresses_the_gradient_allreduce() -> None:
    spec = _spec(replicas=2, sync="every_step", compression="int8")
    _, plan = make_replica_plan(spec, _offers(2), {}, _links(2, FAST))
    config = replica_sync_config(spec, plan)
    assert config is not None and (config.mode, config.grad_codec) == ("allreduce", "int8")
    plain = replica_sync_config(_spec(replicas=2, sync="every_step"), plan)
    assert plain is not None and plain.grad_codec == "raw"


def test_members_recompute_the_replica_plan_and_refuse_a_changed_one() -> None:
    import dataclasses

    from arceusd.jobs.plans.planning import (
        PlanRefused,
        encode_job_start,
        make_job_plan,
        replica_flops_shares,
        verify_job_start,
    )
    from partitioner import plan_bytes, replica_plan_bytes

    spec = _spec(replicas=2, sync="every_step")
    offers = _offers(4)
    inputs, plan = make_job_plan(spec, offers, {}, _links(4, FAST))
    assert len(plan.replicas) == 2
    inputs_data, plan_data = encode_job_start(spec, inputs, plan)
    assert plan_data == replica_plan_bytes(plan)
    _, verified = verify_job_start(spec, inputs_data, plan_data, offers[0])
    assert verified == plan
    shares = replica_flops_shares(plan, inputs)
    assert set(shares) == set(plan.peer_ids) and abs(sum(shares.values()) - 1.0) < 1e-9
    # a leader that swaps the replicas' devices, or the sync mode, or sends garbage, is refused
    swapped = dataclasses.replace(plan, replicas=plan.replicas[::-1])
    diloco = dataclasses.replace(plan, sync_mode=ReplicaSyncMode.DILOCO)
    for bad in (
        replica_plan_bytes(swapped),
        replica_plan_bytes(diloco),
        b'{"replica_plan": 1, "replicas": 7}',
        plan_bytes(plan.replicas[0]),
    ):
        with pytest.raises(PlanRefused):
            verify_job_start(spec, inputs_data, bad, offers[0])
    # a spec that keeps one pipeline sends today's plan bytes
    one = _spec()
    inputs1, plan1 = make_job_plan(one, offers, {}, _links(4, FAST))
    _, data1 = encode_job_start(one, inputs1, plan1)
    assert len(plan1.replicas) == 1 and data1 == plan_bytes(plan1.replicas[0])
    assert verify_job_start(one, *encode_job_start(one, inputs1, plan1), offers[0])[1] == plan1


def test_the_leader_who_serves_the_data_is_in_every_replica_plan_and_members_check_it() -> None:
    from arceusd.jobs.plans.planning import PlanRefused, encode_job_start, make_job_plan, verify_job_start

    offers = [Offer(f"{i:032x}", f"127.0.0.1:{9000 + i}", 1e10 / (1 + i), 4 * GIB) for i in range(3)]
    slowest = offers[-1].peer_id
    for replicas in (2, "auto"):
        spec = _spec(replicas=replicas, sync="every_step")
        _, free = make_job_plan(spec, offers, {}, _links(3, FAST))
        assert slowest not in free.peer_ids  # left to itself, the planner takes the fastest devices
        inputs, plan = make_job_plan(spec, offers, {}, _links(3, FAST), leader=slowest)
        assert slowest in plan.peer_ids
        inputs_data, plan_data = encode_job_start(spec, inputs, plan)
        assert verify_job_start(spec, inputs_data, plan_data, offers[0], slowest)[1] == plan
        with pytest.raises(PlanRefused):  # a plan made without the sender (the leader) in it is refused
            verify_job_start(spec, *encode_job_start(spec, inputs, free), offers[0], slowest)


MIB = 1 << 20


def _wide_spec(sync: str) -> JobSpec:
    """Two replicas of an MLP whose first layer's training state (3.8 MiB) fills a 4 MiB device: 4.3 MiB in all."""
    d = mnist_doc()
    d["model"]["layer_sizes"] = [784, 256, 256, 10]
    d["training"] = {"steps": 200, "batch_size": 64, "micro_batches": 2, "optimizer": "sgd", "lr": 0.1}
    d["training"] |= {"replicas": 2, "sync": sync}
    return parse_spec(d, base_dir=ROOT, check_files=False)


def test_replicas_are_dealt_so_each_can_hold_the_model_when_memory_differs() -> None:
    """Two 4 MiB and two 3 MiB devices, the small ones the fastest: dealt by speed alone, both small ones land in
    one replica, which cannot hold the model; dealt by memory each replica gets a large one."""
    sizes = [(1e10, 4 * MIB), (1e10, 4 * MIB), (3e10, 3 * MIB), (2.9e10, 3 * MIB)]
    offers = [Offer(f"{i:032x}", f"127.0.0.1:{9000 + i}", f, m) for i, (f, m) in enumerate(sizes)]
    _, plan = make_replica_plan(_wide_spec("every_step"), offers, {}, _links(4, FAST))
    assert len(plan.replicas) == 2
    for replica in plan.replicas:
        assert {p[-1] for p in replica.peer_ids} & {"0", "1"}, replica.peer_ids  # a large device in each


def test_a_fixed_replica_count_that_no_longer_fits_plans_fewer_when_gradients_are_averaged_every_step() -> None:
    """Three devices left of four (one excluded) cannot hold two replicas cut alike: averaging every step, the job
    trains on as one pipeline (the same weights) instead of pausing; DiLoCo keeps its count or none."""
    sizes = [4 * MIB, 4 * MIB, 3 * MIB]
    offers = [Offer(f"{i:032x}", f"127.0.0.1:{9000 + i}", 1e10, m) for i, m in enumerate(sizes)]
    _, plan = make_replica_plan(_wide_spec("every_step"), offers, {}, _links(3, FAST))
    assert len(plan.replicas) == 1 and plan.sync_mode is ReplicaSyncMode.NONE
    with pytest.raises(PlanError, match="no plan of 2 replicas"):
        make_replica_plan(_wide_spec("diloco"), offers, {}, _links(3, FAST))
