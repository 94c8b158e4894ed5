"""Capped 1F1B (``partitioner/cost.py``): a model whose training state fits the devices' memory only with fewer
micro-batches in flight than the pipeline's warm-up keeps is planned with ``in_flight_cap`` (and slower), where it
was refused; a model that fits otherwise is planned as before; members verify a capped plan like any other."""

from __future__ import annotations

import dataclasses
import json

import pytest

from arceusd.models.config import GPTConfig
from arceusd.models.costs import block_costs
from partitioner import (
    DeviceProfile,
    Link,
    LinkMatrix,
    PlanError,
    PlanInputs,
    PlanMismatch,
    TrainingParams,
    plan,
    plan_bytes,
    plan_from_bytes,
    verify,
)
from partitioner.cost import CostModel, in_flight_1f1b

MIB = 1 << 20


def inputs(layers: int, devices: int = 4, lend_mib: int = 32) -> PlanInputs:
    """A small GPT of ``layers`` layers over ``devices`` equal devices lending ``lend_mib`` each (4
    micro-batches of 8 samples)."""
    config = GPTConfig(n_layer=layers, n_head=4, n_embd=128, block_size=64, vocab_size=256)
    ids = [f"{i:032x}" for i in range(devices)]
    return PlanInputs(
        tuple(block_costs(config)),
        tuple(DeviceProfile(p, 1e11, lend_mib * MIB) for p in ids),
        LinkMatrix.symmetric((a, b, Link(1e-3, 100e6)) for i, a in enumerate(ids) for b in ids[i + 1 :]),
        TrainingParams(32, (4,), max_tensor_parallel=1),
    )


def test_a_model_that_fits_uncapped_is_planned_as_before() -> None:
    p = plan(inputs(5))
    assert p.in_flight_cap == 0 and len(p.stages) == 4
    assert [s.stash_micro_batches for s in p.stages] == [in_flight_1f1b(4 - s, 4) for s in range(4)]
    assert "in_flight_cap" not in json.loads(plan_bytes(p))  # an uncapped plan's bytes are what they were


@pytest.mark.parametrize(("layers", "cap"), [(8, 2), (12, 1)])
def test_a_model_too_big_for_the_warm_up_is_planned_with_fewer_micro_batches_in_flight(layers: int, cap: int) -> None:
    """Four devices of 32 MiB held 5 layers with the warm-up's stashes: 8 and 12 are planned now (2.4x), each with
    the most micro-batches in flight that fit, inside every device's memory, slower by the trips it forces."""
    these = inputs(layers)
    p = plan(these)
    assert p.in_flight_cap == cap and p.schedule == "1f1b"
    assert all(s.stash_micro_batches <= cap for s in p.stages)
    budgets = {d.peer_id: d.memory_bytes for d in these.devices}
    assert all(need <= budgets[peer] for peer, need in p.memory_bytes)
    stages = [(tuple(sorted(budgets).index(d) for d in s.devices), s.start, s.end) for s in p.stages]
    model = CostModel(these)
    assert model.evaluate(stages, p.micro_batches) is None  # the same placement with the warm-up's stashes: no
    if cap > 1:  # a smaller cap fits too, and is slower: the planner took the largest
        smaller = model.evaluate(stages, p.micro_batches, cap - 1)
        assert smaller is not None and smaller.predicted_step_time_s > p.predicted_step_time_s
    times = [s.time_s for s in p.stages]
    trips = -(-p.micro_batches // cap)
    assert p.predicted_step_time_s >= trips * sum(times)
    verify(p, these)  # every member recomputes the same capped plan
    assert plan_from_bytes(plan_bytes(p)) == p


def test_a_model_too_big_even_one_micro_batch_at_a_time_is_refused_with_the_numbers() -> None:
    with pytest.raises(PlanError, match="no plan fits"):
        plan(inputs(13))


def test_a_capped_plan_out_of_bounds_or_not_the_recomputed_one_is_refused() -> None:
    these = inputs(8)
    p = plan(these)
    raw = json.loads(plan_bytes(p))
    raw["in_flight_cap"] = raw["micro_batches"] + 1
    with pytest.raises(ValueError, match="in_flight_cap"):
        plan_from_bytes(json.dumps(raw).encode())
    with pytest.raises(PlanMismatch):
        verify(dataclasses.replace(p, in_flight_cap=1), these)
