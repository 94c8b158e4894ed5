"""The replica planner: never predicted slower than the best single device, replicas when they pay, DiLoCo or
fewer replicas over a slow link, deterministic under permutation."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partitioner.inputs import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams
from partitioner.plan import PlanError
from partitioner.replicas import ReplicaSyncMode, plan_replicas
from partitioner.search import plan
from partitioner.synthetic import gpt_like_blocks, random_inputs

GIB = 1 << 30
SMALL = gpt_like_blocks(2, 64, 4, 32, 65)  # ~0.2 M parameters


def _best_single_s(inputs: PlanInputs) -> float | None:
    best = None
    for d in inputs.devices:
        sub = dataclasses.replace(
            inputs,
            devices=(d,),
            links=LinkMatrix(()),
            training=dataclasses.replace(inputs.training, use_all_devices=False),
        )
        try:
            t = plan(sub).predicted_step_time_s
        except PlanError:
            continue
        best = t if best is None else min(best, t)
    return best


def _equal(n: int, link: Link, flops: float = 1e10, memory: int = 4 * GIB, batch: int = 64) -> PlanInputs:
    devices = tuple(DeviceProfile(f"dev{i}", flops, memory) for i in range(n))
    ids = [d.peer_id for d in devices]
    links = LinkMatrix.symmetric([(a, b, link) for a in ids for b in ids if a < b])
    return PlanInputs(SMALL, devices, links, TrainingParams(batch, (1, 2, 4)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(1, 5), st.sampled_from([8, 12, 16]), st.booleans())
def test_never_predicted_slower_than_the_best_single_device(seed: int, n: int, batch: int, fast: bool) -> None:
    """Random clusters (speeds 1-8x, tight memory); ``fast``: every link 0.1 ms, 10 Gbit/s (replicas then win
    about half the time, all-reduce or DiLoCo; with the random links mostly one device does)."""
    blocks = gpt_like_blocks(2, 128, 4, 64, 512)
    inputs = random_inputs(
        random.Random(seed), n, blocks, TrainingParams(batch, (1, 2, 4)), mem_range_gib=(0.005, 0.05)
    )
    if fast:
        ids = [d.peer_id for d in inputs.devices]
        links = LinkMatrix.symmetric([(a, b, Link(1e-4, 1.25e9)) for a in ids for b in ids if a < b])
        inputs = dataclasses.replace(inputs, links=links)
    single = _best_single_s(inputs)
    try:
        chosen = plan_replicas(inputs)
    except PlanError:
        assert single is None
        return
    if single is not None:
        assert chosen.predicted_step_time_s <= single * (1 + 1e-9)
    assert len(set(chosen.peer_ids)) == len(chosen.peer_ids)  # no device twice
    stages = [tuple((s.start, s.end) for s in r.stages) for r in chosen.replicas]
    assert all(s == stages[0] for s in stages)  # every replica cut alike
    assert sum(r.micro_batches * r.micro_batch_size for r in chosen.replicas) == batch


def test_many_equal_devices_on_fast_links_and_a_small_model_replicate() -> None:
    inputs = _equal(4, Link(1e-4, 1.25e8))  # 1 Gbit/s, 0.1 ms
    chosen = plan_replicas(inputs)
    assert len(chosen.replicas) >= 2
    assert chosen.sync_mode is ReplicaSyncMode.ALLREDUCE
    single = _best_single_s(inputs)
    assert single is not None and chosen.predicted_step_time_s < single / 1.5
    assert chosen.predicted_step_time_s < plan(inputs).predicted_step_time_s


def test_a_slow_link_between_replicas_gives_diloco_or_fewer_replicas() -> None:
    fast = plan_replicas(_equal(2, Link(1e-4, 1.25e8)))
    slow_inputs = _equal(2, Link(2e-2, 6.25e5))  # 5 Mbit/s, 20 ms
    slow = plan_replicas(slow_inputs)
    assert len(fast.replicas) == 2 and fast.sync_mode is ReplicaSyncMode.ALLREDUCE
    assert slow.sync_mode is ReplicaSyncMode.DILOCO or len(slow.replicas) < 2
    single = _best_single_s(slow_inputs)
    assert single is not None and slow.predicted_step_time_s <= single


def test_a_slow_device_is_left_out() -> None:
    inputs = _equal(3, Link(1e-4, 1.25e8))
    slow = dataclasses.replace(inputs.devices[2], flops_per_s=1e8)
    inputs = dataclasses.replace(inputs, devices=(*inputs.devices[:2], slow))
    chosen = plan_replicas(inputs)
    assert "dev2" not in chosen.peer_ids and len(chosen.replicas) == 2


def test_the_same_facts_in_any_order_give_the_same_plan() -> None:
    inputs = _equal(4, Link(1e-4, 1.25e8))
    shuffled = dataclasses.replace(inputs, devices=tuple(reversed(inputs.devices)))
    assert plan_replicas(inputs) == plan_replicas(shuffled)


def test_use_all_devices_keeps_every_device_busy() -> None:
    inputs = _equal(3, Link(1e-4, 1.25e8))
    slow = dataclasses.replace(inputs.devices[2], flops_per_s=1e8)
    inputs = dataclasses.replace(
        inputs, devices=(*inputs.devices[:2], slow), training=dataclasses.replace(inputs.training, use_all_devices=True)
    )
    assert sorted(plan_replicas(inputs).peer_ids) == ["dev0", "dev1", "dev2"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**31),
    st.integers(2, 5),
    st.sampled_from([2, 3]),
    st.sampled_from([None, ReplicaSyncMode.ALLREDUCE, ReplicaSyncMode.DILOCO]),
    st.booleans(),
)
def test_the_specs_fixed_replicas_and_sync_are_honoured(
    seed: int, n: int, r: int, sync: ReplicaSyncMode | None, fast: bool
) -> None:
    """``replicas = R`` gives exactly R pipelines cut alike (or a PlanError saying it does not fit; averaging every
    step, fewer replicas when R do not fit), ``sync`` that mode; ``replicas = 1`` is today's plan, unchanged."""
    blocks = gpt_like_blocks(2, 128, 4, 64, 512)
    inputs = random_inputs(random.Random(seed), n, blocks, TrainingParams(12, (1, 2)), mem_range_gib=(0.02, 0.05))
    if fast:
        ids = [d.peer_id for d in inputs.devices]
        links = LinkMatrix.symmetric([(a, b, Link(1e-4, 1.25e9)) for a in ids for b in ids if a < b])
        inputs = dataclasses.replace(inputs, links=links)
    try:
        one = plan_replicas(inputs, replicas=1)
    except PlanError:
        one = None
    if one is not None:
        assert one.replicas == (plan(inputs),) and one.sync_mode is ReplicaSyncMode.NONE
    try:
        chosen = plan_replicas(inputs, 10, replicas=r, sync=sync)
    except PlanError as exc:
        assert str(exc)  # says why
        return
    if sync is ReplicaSyncMode.ALLREDUCE and len(chosen.replicas) < r:  # fewer only when R replicas do not fit
        with pytest.raises(PlanError):
            plan_replicas(inputs, 10, replicas=r, sync=ReplicaSyncMode.DILOCO)
        assert len(chosen.replicas) >= 1 and (len(chosen.replicas) > 1 or chosen.sync_mode is ReplicaSyncMode.NONE)
        return
    assert len(chosen.replicas) == r
    assert chosen.sync_mode is (sync or chosen.sync_mode) and chosen.sync_mode is not ReplicaSyncMode.NONE
    stages = [tuple((s.start, s.end) for s in p.stages) for p in chosen.replicas]
    assert all(s == stages[0] for s in stages)
    assert sum(p.micro_batches * p.micro_batch_size for p in chosen.replicas) == 12


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**31), st.integers(1, 4), st.sampled_from([None, ReplicaSyncMode.ALLREDUCE, ReplicaSyncMode.DILOCO])
)
def test_auto_replicas_with_a_fixed_sync_still_never_lose_to_one_device(
    seed: int, n: int, sync: ReplicaSyncMode | None
) -> None:
    blocks = gpt_like_blocks(2, 128, 4, 64, 512)
    inputs = random_inputs(random.Random(seed), n, blocks, TrainingParams(8, (1, 2)), mem_range_gib=(0.005, 0.05))
    single = _best_single_s(inputs)
    try:
        chosen = plan_replicas(inputs, sync=sync)
    except PlanError:
        assert single is None
        return
    if single is not None:
        assert chosen.predicted_step_time_s <= single * (1 + 1e-9)
    if len(chosen.replicas) > 1 and sync is not None:
        assert chosen.sync_mode is sync


def test_fixed_replicas_that_cannot_fit_say_so() -> None:
    inputs = _equal(2, Link(1e-4, 1.25e8), batch=48)
    try:
        plan_replicas(inputs, replicas=3)
    except PlanError as exc:
        assert "3 replicas need at least 3 devices" in str(exc)
    else:
        raise AssertionError("3 replicas on 2 devices were planned")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(2, 5), st.sampled_from([None, 2]), st.integers(0, 4))
def test_a_device_that_must_be_included_always_is(seed: int, n: int, replicas: int | None, which: int) -> None:
    """The job's owner serves the data: every plan made with ``include`` holds it, or none is made; it is no slower
    than the unconstrained plan when that one holds the owner too."""
    blocks = gpt_like_blocks(2, 128, 4, 64, 512)
    inputs = random_inputs(random.Random(seed), n, blocks, TrainingParams(8, (1, 2, 4)), mem_range_gib=(0.02, 0.2))
    ids = [d.peer_id for d in inputs.devices]
    links = LinkMatrix.symmetric([(a, b, Link(1e-4, 1.25e9)) for a in ids for b in ids if a < b])
    inputs = dataclasses.replace(inputs, links=links)
    owner = ids[which % n]
    try:
        free = plan_replicas(inputs, replicas=replicas)
    except PlanError:
        free = None
    try:
        held = plan_replicas(inputs, replicas=replicas, include=owner)
    except PlanError:
        return
    assert owner in held.peer_ids
    if free is not None and owner in free.peer_ids:
        assert held.predicted_step_time_s <= free.predicted_step_time_s * (1 + 1e-9)  # free is one of its candidates
