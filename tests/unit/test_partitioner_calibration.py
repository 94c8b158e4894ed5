"""The cost model's calibration terms: each one is charged where the worker pays it, enters the canonical
inputs (so every peer plans the same) and can be left out by an old profile.

Each test computes its expected figure from the blocks and the calibration directly, not from the cost model,
so dropping or misplacing a term (efficiency, dispatch, optimizer, per-message cost) fails here.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from partitioner import (
    DeviceProfile,
    Link,
    LinkMatrix,
    PlanInputs,
    PlanMismatch,
    TrainingParams,
    inputs_from_dict,
    inputs_hash,
    inputs_to_dict,
    plan,
    plan_bytes,
    plan_from_bytes,
    verify,
)
from partitioner.blocks import BlockCost
from partitioner.cost import CostModel
from partitioner.synthetic import gpt_like_blocks, random_inputs
from tests.unit._partitioner_cases import calibrated, small_instance

BIG = 1 << 40
M, BATCH = 4, 8  # micro-batches, samples per step: micro-batch size 2
BLOCKS = gpt_like_blocks(3, 64, 4, 32, 65)


def _flops(blocks: tuple[BlockCost, ...]) -> float:
    return sum(b.forward_flops_per_sample + b.backward_flops_per_sample for b in blocks)


def _params(blocks: tuple[BlockCost, ...]) -> float:
    return sum(b.param_bytes for b in blocks) / 4  # fp32


def _inputs(
    blocks: tuple[BlockCost, ...], devices: tuple[DeviceProfile, ...], link: Link | None = None, max_tp: int = 1
) -> PlanInputs:
    ids = [d.peer_id for d in devices]
    links = LinkMatrix.symmetric((a, b, link) for a in ids for b in ids if a < b) if link else LinkMatrix(())
    return PlanInputs(blocks, devices, links, TrainingParams(BATCH, (M,), max_tensor_parallel=max_tp))


def _one(
    blocks: tuple[BlockCost, ...] = BLOCKS,
    block_efficiency: float = 1.0,
    dispatch_s: float = 0.0,
    optimizer_s_per_param: float = 0.0,
) -> float:
    """Predicted step time of the whole model on one device of 1e10 FLOP/s with this calibration."""
    dev = DeviceProfile(
        "a",
        1e10,
        BIG,
        block_efficiency=block_efficiency,
        dispatch_s=dispatch_s,
        optimizer_s_per_param=optimizer_s_per_param,
    )
    p = plan(_inputs(blocks, (dev,)))
    assert len(p.stages) == 1 and p.micro_batches == M
    return p.predicted_step_time_s


def test_uncalibrated_is_the_benchmarks_flops_alone() -> None:
    assert _one() == pytest.approx(_flops(BLOCKS) * BATCH / 1e10, rel=1e-12)


def test_block_efficiency_divides_the_benchmarks_speed() -> None:
    for eff in (0.25, 0.7, 1.5):
        assert _one(block_efficiency=eff) == pytest.approx(_flops(BLOCKS) * BATCH / (1e10 * eff), rel=1e-12)


def test_dispatch_is_charged_per_block_per_micro_batch() -> None:
    d = 3e-4
    extra = _one(dispatch_s=d) - _one()
    assert extra == pytest.approx(M * len(BLOCKS) * d, rel=1e-9)
    bigger = gpt_like_blocks(7, 64, 4, 32, 65)
    assert _one(bigger, dispatch_s=d) - _one(bigger) == pytest.approx(M * len(bigger) * d, rel=1e-9)


def test_optimizer_cost_scales_with_parameters_once_per_step() -> None:
    o = 2e-9
    for blocks in (BLOCKS, gpt_like_blocks(7, 128, 4, 32, 65)):
        extra = _one(blocks, optimizer_s_per_param=o) - _one(blocks)
        assert extra == pytest.approx(_params(blocks) * o, rel=1e-9)  # not per micro-batch


def test_stages_step_their_optimizers_at_once_so_the_slowest_counts() -> None:
    devices = (
        DeviceProfile("a", 1e10, BIG, optimizer_s_per_param=1e-8),
        DeviceProfile("b", 1e10, BIG, optimizer_s_per_param=3e-9),
    )
    cm = CostModel(_inputs(BLOCKS, devices, Link(0.0, 1e30)))
    bare = CostModel(
        _inputs(BLOCKS, tuple(dataclasses.replace(d, optimizer_s_per_param=0.0) for d in devices), Link(0.0, 1e30))
    )
    for cut in range(1, len(BLOCKS)):
        stages = [((0,), 0, cut), ((1,), cut, len(BLOCKS))]
        p, q = cm.evaluate(stages, M), bare.evaluate(stages, M)
        assert p is not None and q is not None
        own = (_params(BLOCKS[:cut]) * 1e-8, _params(BLOCKS[cut:]) * 3e-9)
        assert [s.optimizer_s for s in p.stages] == pytest.approx(own, rel=1e-9)
        assert p.predicted_step_time_s - q.predicted_step_time_s == pytest.approx(max(own), rel=1e-9)


def test_message_cost_is_charged_per_boundary_message_per_micro_batch() -> None:
    msg = 1e-3
    devices = (DeviceProfile("a", 1e10, BIG), DeviceProfile("b", 1e10, BIG))
    with_msg = CostModel(_inputs(BLOCKS, devices, Link(1e-4, 1e8, msg)))
    without = CostModel(_inputs(BLOCKS, devices, Link(1e-4, 1e8)))
    stages = [((0,), 0, len(BLOCKS) - 1), ((1,), len(BLOCKS) - 1, len(BLOCKS))]  # stage 0 is the bottleneck
    p, q = with_msg.evaluate(stages, M), without.evaluate(stages, M)
    assert p is not None and q is not None
    # one activation forward and one gradient back per micro-batch over the boundary
    assert p.stages[0].transfer_s - q.stages[0].transfer_s == pytest.approx(2 * msg, rel=1e-9)
    assert p.stages[1].transfer_s == q.stages[1].transfer_s == 0.0  # the last stage sends nothing onward
    assert p.stages[0].time_s > p.stages[1].time_s
    # ... and the step's scalar exchange (a message to the root and one back)
    assert p.sync_s - q.sync_s == pytest.approx(2 * msg, rel=1e-9)
    assert p.predicted_step_time_s - q.predicted_step_time_s == pytest.approx(M * 2 * msg + 2 * msg, rel=1e-9)


def test_the_steps_scalar_exchange_is_a_star_over_the_first_stages_head() -> None:
    rtt, msg = 2e-3, 5e-4
    devices = tuple(DeviceProfile(x, 1e10, BIG) for x in "abc")
    far = Link(40e-3, 1e8, msg)  # a <-> c
    near = Link(rtt, 1e8, msg)
    links = LinkMatrix.symmetric([("a", "b", near), ("b", "c", near), ("a", "c", far)])
    cm = CostModel(PlanInputs(BLOCKS, devices, links, TrainingParams(BATCH, (M,), max_tensor_parallel=1)))
    n = len(BLOCKS)
    one = cm.evaluate([((1,), 0, n)], M)
    assert one is not None and one.sync_s == 0.0  # a single worker does not exchange
    two = cm.evaluate([((0,), 0, 3), ((1,), 3, n)], M)
    assert two is not None and two.sync_s == pytest.approx(rtt + 2 * msg, rel=1e-12)
    # three stages rooted at a: the worst worker (c, over the far link) paces the exchange
    three = cm.evaluate([((0,), 0, 2), ((1,), 2, 4), ((2,), 4, n)], M)
    assert three is not None and three.sync_s == pytest.approx(40e-3 + 2 * msg, rel=1e-12)
    times = [s.time_s for s in three.stages]
    assert three.predicted_step_time_s == pytest.approx((M - 1) * max(times) + sum(times) + three.sync_s)
    # without a link between the root and a worker the worker cannot exchange: infeasible
    cut = CostModel(
        PlanInputs(
            BLOCKS,
            devices,
            LinkMatrix.symmetric([("a", "b", near), ("b", "c", near)]),
            TrainingParams(BATCH, (M,), max_tensor_parallel=1),
        )
    )
    assert cut.evaluate([((0,), 0, 2), ((1,), 2, 4), ((2,), 4, n)], M) is None
    assert cut.evaluate([((1,), 0, 2), ((0,), 2, n)], M) is not None


def test_tensor_parallel_all_reduces_pay_the_message_cost() -> None:
    msg = 1e-3
    layers = BLOCKS[1:-1]  # transformer blocks only: every one splits over 2 devices
    devices = (DeviceProfile("a", 1e10, BIG), DeviceProfile("b", 1e10, BIG))
    p = CostModel(_inputs(layers, devices, Link(1e-4, 1e8, msg), max_tp=2)).evaluate([((0, 1), 0, len(layers))], M)
    q = CostModel(_inputs(layers, devices, Link(1e-4, 1e8), max_tp=2)).evaluate([((0, 1), 0, len(layers))], M)
    assert p is not None and q is not None
    # per block: 2 sub-layers x (forward + backward) all-reduce, each a star over rank 0: 2 (g - 1) messages
    per_block = 2 * 2 * 2 * (2 - 1)
    assert p.stages[0].allreduce_s - q.stages[0].allreduce_s == pytest.approx(per_block * len(layers) * msg)


def test_uncalibrated_inputs_keep_their_old_canonical_form() -> None:
    inputs = small_instance(3, 3, 4)
    d = inputs_to_dict(inputs)
    assert all(set(x) == {"peer_id", "flops_per_s", "memory_bytes", "kind"} for x in d["devices"])
    assert all(len(x) == 4 for x in d["links"])
    assert inputs_from_dict(d) == inputs.canonical()  # what a peer without calibration sends loads as before


def test_every_calibration_field_enters_the_hash_and_round_trips() -> None:
    base = small_instance(3, 3, 4)
    cal = calibrated(base, 5)
    assert inputs_from_dict(inputs_to_dict(cal)) == cal.canonical()
    assert inputs_hash(inputs_from_dict(inputs_to_dict(cal))) == inputs_hash(cal)
    seen = {inputs_hash(base), inputs_hash(cal)}
    first = base.devices[0]
    for dev in (
        dataclasses.replace(first, block_efficiency=0.5),
        dataclasses.replace(first, dispatch_s=1e-4),
        dataclasses.replace(first, optimizer_s_per_param=1e-9),
    ):
        seen.add(inputs_hash(dataclasses.replace(base, devices=(dev, *base.devices[1:]))))
    a, b, lk = base.links.links[0]
    links = LinkMatrix(((a, b, dataclasses.replace(lk, message_s=1e-3)), *base.links.links[1:]))
    seen.add(inputs_hash(dataclasses.replace(base, links=links)))
    assert len(seen) == 6


def test_a_plan_from_other_calibration_is_refused() -> None:
    base = small_instance(3, 4, 6, mem_gib=(0.03, 0.1))
    cal = calibrated(base, 2)
    p = plan(cal)
    verify(p, cal)
    verify(plan_from_bytes(plan_bytes(p)), cal)
    assert plan_from_bytes(plan_bytes(p)) == p
    with pytest.raises(PlanMismatch):
        verify(p, base)
    with pytest.raises(PlanMismatch):
        verify(plan(base), cal)


def test_malformed_calibration_is_refused_with_the_field_named() -> None:
    d = inputs_to_dict(small_instance(3, 3, 4))
    d["links"][0] = [*d["links"][0], 1e-3, 7.0]
    with pytest.raises(ValueError, match="message_s"):
        inputs_from_dict(d)
    d = inputs_to_dict(small_instance(3, 3, 4))
    d["devices"][0]["block_efficiency"] = 0.0
    with pytest.raises(ValueError, match="block_efficiency"):
        inputs_from_dict(d)
    d["devices"][0]["block_efficiency"] = 1.0
    d["devices"][0]["dispatch_s"] = -1.0
    with pytest.raises(ValueError, match="dispatch_s"):
        inputs_from_dict(d)
    d["devices"][0]["dispatch_s"] = 0.0
    d["devices"][0]["warp_factor"] = 9.0  # a field from a newer peer: refused, not ignored
    with pytest.raises(TypeError, match="warp_factor"):
        inputs_from_dict(d)
    with pytest.raises(ValueError, match="message_s"):
        Link(1e-3, 1e9, float("nan"))


def test_calibrated_16_devices_48_blocks_is_fast() -> None:
    blocks = gpt_like_blocks(46, 2048, 16, 1024, 50257)
    training = TrainingParams(64, (1, 2, 4, 8, 16, 32, 64))
    inputs = calibrated(random_inputs(random.Random(7), 16, blocks, training), 7)
    start = time.process_time()
    p = plan(inputs)
    elapsed = time.process_time() - start
    assert max(s.optimizer_s for s in p.stages) > 0
    # a wide margin (see test_partitioner's twin: about 0.9 s of CPU on the oversubscribed 2-core machine)
    assert elapsed < 3.0, f"planning 16 calibrated devices x 48 blocks took {elapsed:.2f} s of CPU"
