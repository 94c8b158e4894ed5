"""The planner splits a stock LM's decoder layers over a tensor-parallel group: its cost model gives the layers
key/value heads and MLP columns as split units, every split it makes is one the workers build, and the planned
pipeline trains as a plain transformers loop (fp32, 1e-4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from arceusd.jobs.plans.planning import Offer, encode_start, make_plan, plan_inputs, verify_start, worker_stages
from arceusd.jobs.spec.schema import load_spec
from arceusd.models.costs import block_costs
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.worker.hf_tp_split import hf_split, planner_tensor_parallel
from arceusd.worker.schedule import ScheduleKind
from partitioner import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams, plan
from tests.unit import hf_cases
from tests.unit.test_hf_exact import BATCH, MICRO, OPTS, reference_run
from tests.unit.test_hf_tp_exact import Layout, assert_same, tp_pipeline_run

ROOT = Path(__file__).resolve().parents[2]


def planned_layout(cfg: HFModelConfig, devices: int) -> Layout:
    """The stages the planner picks for ``cfg`` on ``devices`` unequal devices linked fast (compute-bound: a
    tensor-parallel group pays off), in the workers' terms."""
    blocks = tuple(block_costs(cfg))
    devs = tuple(DeviceProfile(f"d{i}", 1e8 * (1 + i), 1 << 30, "cpu") for i in range(devices))
    links = LinkMatrix.symmetric(
        [(f"d{i}", f"d{j}", Link(1e-6, 1e12)) for i in range(devices) for j in range(i + 1, devices)]
    )
    training = TrainingParams(BATCH, (MICRO,), max_tensor_parallel=planner_tensor_parallel(cfg))
    return [(st.start, st.end, st.split()) for st in worker_stages(plan(PlanInputs(blocks, devs, links, training)))]


def test_the_daemons_plan_inputs_let_a_stock_lm_split_by_its_kv_heads() -> None:
    spec = load_spec(ROOT / "examples" / "llama-shakespeare.toml")
    offers = [Offer(c * 32, f"h:{i}", 1e8 * (1 + i), 1 << 30) for i, c in enumerate("abcd")]
    caps = {}
    for name, overrides in [("llama", {}), ("gpt2", {}), ("qwen2", {}), ("llama", {"tie_word_embeddings": True})]:
        model = hf_cases.config(name, **overrides)
        caps[(name, bool(overrides))] = plan_inputs(replace(spec, model=model), offers, {}).training.max_tensor_parallel
    assert caps == {("llama", False): 2, ("gpt2", False): 4, ("qwen2", False): 1, ("llama", True): 1}


def test_the_leader_plans_a_split_stock_lm_stage_and_every_member_verifies_it() -> None:
    """``make_plan`` over four unequal members linked fast (measured): the example Llama's middle stage split by
    its two KV heads (uneven columns, by speed), a split the workers build, and each member's check passes."""
    spec = load_spec(ROOT / "examples" / "llama-shakespeare.toml")
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    offers = [Offer(c * 32, f"h:{i}", 1e8 * (1 + i), 1 << 30) for i, c in enumerate("abcd")]
    ids = [o.peer_id for o in offers]
    fast = {(a, b): Link(1e-6, 1e12, 0.0) for i, a in enumerate(ids) for b in ids[i + 1 :]}
    inputs, the_plan = make_plan(spec, offers, {}, measured=fast, include=ids[0])
    splits = [st.split() for st in worker_stages(the_plan) if st.split() is not None]
    assert splits
    for split in splits:
        assert split is not None and split.world_size == 2
        assert hf_split(split, cfg).heads == (2, 2) and len(set(split.columns)) == 2  # uneven: by speed
    data = encode_start(inputs, the_plan)
    for own in offers:
        verify_start(spec, *data, own)


def test_decoder_layers_split_by_kv_heads_and_columns() -> None:
    cfg = hf_cases.config("llama")  # 4 heads sharing 2 KV heads, 48 columns
    costs = block_costs(cfg)
    assert [(c.heads, c.mlp_columns) for c in costs] == [(0, 0)] + [(2, 48)] * cfg.n_layer + [(0, 0)]
    assert planner_tensor_parallel(cfg) == 2
    assert planner_tensor_parallel(hf_cases.config("gpt2")) == 4  # 4 heads: up to the planner's 4
    assert planner_tensor_parallel(hf_cases.config("qwen2")) == 1  # one KV head: no split
    assert planner_tensor_parallel(hf_cases.config("llama", tie_word_embeddings=True)) == 1
    lora = HFModelConfig(cfg.model_type, cfg.fields, cfg.block_size, lora=LoraSpec(r=2, alpha=4, targets=("q_proj",)))
    assert planner_tensor_parallel(lora) == 2  # adapters split with their layers (test_hf_tp_lora.py)


PLANNED: list[tuple[str, dict[str, Any], str]] = [
    ("llama", {}, "adamw"),
    ("gpt2", {}, "sgd"),
    ("qwen2", {"num_key_value_heads": 4}, "sgd"),
]


@pytest.mark.parametrize(("name", "overrides", "opt_name"), PLANNED)
def test_a_planned_tensor_parallel_stage_trains_as_plain_transformers(
    name: str, overrides: dict[str, Any], opt_name: str
) -> None:
    cfg = hf_cases.config(name, **overrides)
    layout = planned_layout(cfg, 4)
    splits = [split for _, _, split in layout if split is not None]
    assert splits, layout  # the planner did split a stage
    for split in splits:
        hs = hf_split(split, cfg)  # a split the workers build: whole KV groups, every column
        assert sum(hs.heads) == cfg.n_head and sum(split.columns) == cfg.intermediate
    clip = 1.0 if opt_name == "adamw" else 0.5
    ref = reference_run(cfg, OPTS[opt_name], clip)
    got = tp_pipeline_run(cfg, layout, opt_name, ScheduleKind.ONE_F_ONE_B, clip)
    assert_same(cfg, ref, got)
