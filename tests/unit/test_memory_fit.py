"""A job's training-state memory (``arceusd.jobs.plans.memory_fit``): a lower bound of every plan's memory, the refusal
line with its numbers, and the quote's memory lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arceusd.jobs.plans.memory_fit import (
    MIB,
    Lent,
    TrainingMemory,
    blocks_memory,
    devices_needed,
    fits,
    refusal,
    training_memory,
)
from arceusd.jobs.plans.planning import Offer, make_plan
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.jobs.spec.schema import parse_spec
from arceusd.market.estimate import estimate
from arceusd.models.config import GPTConfig
from arceusd.models.costs import gpt_block_costs
from partitioner import PlanError
from tests.unit.test_jobspec import ROOT, gpt_doc


def gpt_spec(n_layer: int, n_embd: int = 64, batch: int = 4, micro: int = 4) -> JobSpec:
    """The tiny GPT of the 4-daemon test (tests/integration/test_memory_fit_jobs.py), scaled in layers."""
    doc: dict[str, Any] = gpt_doc()
    doc["model"].update(n_layer=n_layer, n_embd=n_embd, n_head=4, block_size=16)
    doc["training"].update(batch_size=batch, micro_batches=micro, steps=20)
    return parse_spec(doc, base_dir=ROOT)


def offers(count: int, mib: int) -> list[Offer]:
    return [Offer(f"{i:032x}", "", 1e10, mib * MIB) for i in range(count)]


def test_the_training_state_is_the_planners_static_memory_plus_one_micro_batch_of_stash() -> None:
    blocks = gpt_block_costs(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65))
    need = blocks_memory(blocks, batch_size=8, micro_batches=4)
    assert need.state_bytes == sum(2 * b.param_bytes + b.optimizer_bytes for b in blocks)
    assert need.activation_bytes == sum(b.stash_bytes_per_sample for b in blocks) * 2
    assert need.mib == -(-need.total_bytes // MIB)
    with pytest.raises(ValueError, match="batch_size and micro_batches must be >= 1"):
        blocks_memory(blocks, 0)


@pytest.mark.parametrize(("layers", "devices", "mib"), [(2, 1, 64), (4, 2, 4), (10, 4, 4), (12, 4, 4), (8, 3, 4)])
def test_no_plan_holds_less_than_the_training_state(layers: int, devices: int, mib: int) -> None:
    """The bound submit refuses by: every plan the leader makes uses at least that much over its devices."""
    spec = gpt_spec(layers)
    _, plan = make_plan(spec, offers(devices, mib), {})
    assert sum(b for _, b in plan.memory_bytes) >= training_memory(spec).total_bytes


def test_the_four_daemon_model_needs_about_2_5_times_one_device_and_places_on_four() -> None:
    spec = gpt_spec(10)
    need = training_memory(spec)
    assert 2.4 <= need.total_bytes / (4 * MIB) <= 2.7
    assert refusal(need, Lent(4 * MIB)) is not None  # one device alone: refused at submit
    assert refusal(need, Lent(4 * MIB, (4 * MIB,) * 3)) is None  # four: submitted
    _, plan = make_plan(spec, offers(4, 4), {})  # and the planner places it on them
    assert len(plan.stages) == 4
    with pytest.raises(PlanError):
        make_plan(spec, offers(1, 4), {})


def test_the_refusal_says_needed_and_offered_and_what_to_do() -> None:
    need = TrainingMemory(10 * MIB, MIB // 2)
    line = refusal(need, Lent(4 * MIB, (2 * MIB,), 0))
    assert line is not None and "\n" not in line
    assert line.startswith(
        "the model's training state needs 11 MiB (weights, gradients and optimizer state 10 MiB, "
        "activations 1 MiB); this device lends 4 MiB and the 1 other device(s) it sees lend 2 MiB, "
        "6 MiB in all: it cannot be trained on them."
    ), line
    assert "trained on them. Add devices that lend 5 MiB more (about 2 more like this one)" in line
    assert "smaller model or a smaller batch" in line and "--lend-memory-mib" in line


def test_peers_that_did_not_answer_are_not_counted_as_lending_nothing() -> None:
    need = TrainingMemory(100 * MIB, 0)
    assert not fits(need, Lent(4 * MIB))
    assert fits(need, Lent(4 * MIB, (), unanswered=1)) and refusal(need, Lent(4 * MIB, (), 1)) is None
    assert fits(need, Lent(100 * MIB))


def test_devices_needed() -> None:
    assert devices_needed(TrainingMemory(10 * MIB, 0), 4 * MIB) == 3
    assert devices_needed(TrainingMemory(1, 0), 4 * MIB) == 1
    assert devices_needed(TrainingMemory(1, 0), 0) == 0


def test_the_quote_without_a_daemon_shows_needed_against_this_devices_profile(tmp_path: Path) -> None:
    spec = gpt_spec(10)
    profile = {"devices": [{"flops_per_s": 1e10, "block_efficiency": 1.0, "memory_bytes": 4 * MIB}]}
    (tmp_path / "device_profile.json").write_text(json.dumps(profile))
    quoted = estimate(tmp_path, spec, 1)
    text = "\n".join(quoted.lines())
    assert not quoted.fits and quoted.devices == 3, text  # the time assumes enough devices to hold it
    assert "memory    the model's training state needs 11 MiB" in text and "this device lends 4 MiB" in text, text
    assert "warning   it cannot be trained on the devices this daemon sees: submit would refuse it" in text, text
    (tmp_path / "device_profile.json").unlink()
    text = "\n".join(estimate(tmp_path, spec, 1).lines())
    assert "needs 11 MiB (what the devices lend is unknown: start the daemon)" in text, text
