"""LoRA on tensor-parallel decoder layers (issue 30 item 6): a tiny llama, qwen2 and gpt2 split into pipeline
stages, one stage's layers split over 2-3 ranks with their adapters (``arceusd/worker/hf_tensor_parallel.py``:
``lora_B`` by output rows on column-parallel projections, ``lora_A`` by input columns on row-parallel ones), train
as one process with ``peft.get_peft_model`` on the same batches (fp32, CPU, 1e-4). The split checkpoint gathers
into the whole adapters (``arceusd/jobs/procs/reslice.py``), cuts back into each rank's slice, and exports in peft's
format. The ranks run in threads over the in-memory collective, as ``test_hf_tp_exact``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel, get_peft_model, set_peft_model_state_dict

from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.plans.planning import Offer, encode_start, make_plan, verify_start, worker_stages
from arceusd.jobs.procs.reslice import full_state, parse_shard, slice_state
from arceusd.jobs.spec.schema import load_spec
from arceusd.models.build import build_block, num_blocks
from arceusd.models.hf.blocks import HFDecoderBlock
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora import hold_base
from arceusd.models.hf.lora_export import write_lora_export
from arceusd.models.hf.lora_keys import lora_tensors, peft_key
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.worker.collective import InMemoryAllReduce, TimedCollective
from arceusd.worker.engine import StageEngine
from arceusd.worker.hf_tensor_parallel import shard_hf_block
from arceusd.worker.hf_tp_split import planner_tensor_parallel
from arceusd.worker.hf_tp_tensors import gather_hf_tensor, hf_is_sharded
from arceusd.worker.optim import LRSchedule
from arceusd.worker.protocol import MemberConfig, StageConfig
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tp_split import TPSplit
from partitioner import Link
from tests.unit import hf_cases
from tests.unit.test_engine import SEED, Case, build_engines, drive, prefixed
from tests.unit.test_hf_exact import BATCH, MICRO, batches
from tests.unit.test_hf_lora import OPTS, base_model, peft_config, reference_run
from tests.unit.test_hf_tensor_parallel import _run_ranks
from tests.unit.test_hf_tp_planning import ROOT, planned_layout
from tests.unit.test_hf_tp_reslice import Relayout, assert_equal, shards_of, training_state
from tests.unit.test_hf_tp_reslice import layout as stages_of

TOL = 1e-4
Layout = list[tuple[int, int, TPSplit | None]]
LLAMA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_cfg(name: str, targets: tuple[str, ...], **overrides: Any) -> HFModelConfig:
    return replace(hf_cases.config(name, **overrides), lora=LoraSpec(r=4, alpha=8, targets=tuple(sorted(targets))))


def _split_run(cfg: HFModelConfig, layout: Layout, opt_name: str) -> tuple[list[float], list[list[StageEngine]]]:
    opt = OPTS[opt_name]
    clip = 1.0 if opt_name == "adamw" else None
    engines = build_engines(
        Case(cfg, layout, micro_batches=MICRO, batch=BATCH),
        ScheduleKind.ONE_F_ONE_B,
        opt,
        LRSchedule(max_lr=opt.lr),
        clip,
    )
    return [r.loss for r in drive(engines, batches(cfg))], engines


def _shards(layout: Layout, engines: list[list[StageEngine]]) -> list[bytes]:
    """Every worker's checkpoint shard, as a worker writes it (metadata: stage, rank, its split)."""
    out = []
    for s, ((a, b, split), ranks) in enumerate(zip(layout, engines, strict=True)):
        for r, engine in enumerate(ranks):
            meta = {
                "stage": str(s),
                "rank": str(r),
                "start": str(a),
                "end": str(b),
                "tp_heads": ",".join(map(str, split.heads)) if split else "",
                "tp_columns": ",".join(map(str, split.columns)) if split else "",
            }
            out.append(save_bytes({k: v.detach().clone() for k, v in engine.state_tensors().items()}, meta))
    return out


CASES: list[tuple[str, dict[str, Any], tuple[str, ...], Layout, str]] = [
    # llama: 2 KV groups of 2 query heads, 48 MLP columns, uneven; every projection adapted
    ("llama", {}, LLAMA_ALL, [(0, 1, None), (1, 3, TPSplit((1, 1), (30, 18))), (3, 5, None)], "adamw"),
    # qwen2 with 4 KV heads over 3 ranks (k_proj's frozen bias split with it), the head replicated in the stage
    (
        "qwen2",
        {"num_key_value_heads": 4},
        ("k_proj", "o_proj", "up_proj", "down_proj"),
        [(0, 2, None), (2, 4, TPSplit((2, 1, 1), (10, 20, 10)))],
        "adamw",
    ),
    # gpt2: the fused c_attn's lora_B split by each rank's q, k and v heads; c_proj names attn's and mlp's
    ("gpt2", {}, ("c_attn", "c_fc", "c_proj"), [(0, 2, TPSplit((1, 2, 1), (40, 40, 48))), (2, 4, None)], "sgd"),
]


@pytest.mark.parametrize(("name", "overrides", "targets", "layout", "opt_name"), CASES)
def test_split_lora_layers_train_as_one_peft_process(
    name: str, overrides: dict[str, Any], targets: tuple[str, ...], layout: Layout, opt_name: str, tmp_path: Path
) -> None:
    cfg = lora_cfg(name, targets, **overrides)
    assert layout[-1][1] == num_blocks(cfg)
    ref_losses, ref_adapters = reference_run(cfg, OPTS[opt_name], 1.0 if opt_name == "adamw" else None)
    losses, engines = _split_run(cfg, layout, opt_name)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=TOL)

    # the checkpoint: every rank's shard gathers into the whole adapters, which equal peft's
    full = full_state(cfg, [parse_shard(d) for d in _shards(layout, engines)])
    got = {
        peft_key(cfg, int(k.split(".")[2]), k.split(".", 3)[3]): v for k, v in full.items() if k.startswith("param.")
    }
    assert set(got) == set(ref_adapters)
    for key, value in got.items():
        torch.testing.assert_close(value, ref_adapters[key], rtol=0, atol=TOL, msg=prefixed(key))
    assert any(".lora_B." in k and float(v.abs().max()) > 0 for k, v in got.items()), "the adapters did not train"

    for s, ((a, b, split), ranks) in enumerate(zip(layout, engines, strict=True)):
        members = tuple(
            MemberConfig(f"p{r}", *((split.heads[r], split.columns[r]) if split else (0, 0))) for r in range(len(ranks))
        )
        for r, engine in enumerate(ranks):  # and cuts back into exactly what each rank holds
            held = engine.state_tensors()
            sliced = slice_state(cfg, full, StageConfig(a, b, members), r)
            assert set(sliced) == set(held), s
            for key, value in held.items():
                assert torch.equal(sliced[key], value), key
        for key, block in ranks[0].module.blocks.items():  # replicated adapters stayed bit-identical over ranks
            sharded: frozenset[str] = getattr(block, "tp_sharded", frozenset())
            assert bool(sharded) == (split is not None and 0 < int(key) < num_blocks(cfg) - 1)
            for engine in ranks[1:]:
                other = dict(engine.module.blocks[key].named_parameters())
                for n, p in block.named_parameters():
                    if n not in sharded:
                        assert torch.equal(p, other[n]), n

    # the export from the gathered state loads with peft and computes what peft's own trained model computes
    state = {k.removeprefix("param.blocks."): v for k, v in full.items() if k.startswith("param.")}
    write_lora_export(tmp_path, cfg, state, None, SEED, None)
    x = batches(cfg)[0][0]
    exported = PeftModel.from_pretrained(base_model(cfg), str(tmp_path))
    reference = get_peft_model(base_model(cfg), peft_config(cfg))
    set_peft_model_state_dict(reference, ref_adapters)
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=x).logits, reference(input_ids=x).logits, rtol=0, atol=TOL)


def test_a_split_lora_layer_equals_the_unsplit_one_in_gradients_and_all_reduces() -> None:
    """One llama layer, every projection adapted, over 2 ranks: output, input gradient and every adapter's
    gradient (gathered) as the unsplit peft layer, with no all-reduce more than without adapters."""
    cfg = lora_cfg("llama", LLAMA_ALL)
    full = build_block(cfg, 1, SEED)
    assert isinstance(full, HFDecoderBlock)
    with torch.no_grad():  # lora_B starts at 0: give it values, so every gradient path is exercised
        gen = torch.Generator().manual_seed(4)
        for n, p in full.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    split = TPSplit((1, 1), (30, 18))
    group = InMemoryAllReduce(2, timeout_s=30)
    colls = [TimedCollective(group.rank_view(r)) for r in range(2)]
    shards = [shard_hf_block(full, cfg, split, r, colls[r]) for r in range(2)]
    assert {n for n, _ in shards[0].named_parameters()} == set(lora_tensors(cfg, 1))
    x = torch.randn(2, hf_cases.BLOCK, cfg.hidden, generator=gen)
    gy = torch.randn(2, hf_cases.BLOCK, cfg.hidden, generator=gen)
    xr = x.clone().requires_grad_(True)
    y_ref = full(xr)
    y_ref.backward(gy)
    outs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def work(r: int) -> None:
        xs = x.clone().requires_grad_(True)
        y = shards[r](xs)
        y.backward(gy)
        assert xs.grad is not None
        outs[r] = (y.detach(), xs.grad)

    _run_ranks(2, work)
    assert colls[0].calls == 2 + 2  # as without adapters: one per sub-layer forward, one backward
    for y, gx in outs.values():
        torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
        assert xr.grad is not None
        torch.testing.assert_close(gx, xr.grad, rtol=0, atol=TOL)
    per_rank = [dict(s.named_parameters()) for s in shards]
    for n, p in full.named_parameters():
        assert p.grad is not None
        grads = [d[n].grad for d in per_rank]
        assert all(g is not None for g in grads), n
        got = gather_hf_tensor(n, [g for g in grads if g is not None], cfg, split)
        torch.testing.assert_close(got, p.grad, rtol=0, atol=TOL, msg=prefixed(n))
        if not hf_is_sharded(n, cfg):
            assert torch.equal(per_rank[0][n].grad, per_rank[1][n].grad), n  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "targets"), [("llama", ("down_proj", "q_proj")), ("gpt2", ("c_attn", "c_proj"))])
def test_a_split_lora_layer_with_a_bf16_base_computes_what_autocast_computes_with_an_fp32_base(
    name: str, targets: tuple[str, ...]
) -> None:
    """``hold_base`` casts every frozen matmul weight of a rank's shard (adapted or not, row-parallel included):
    under bf16 autocast the split layer's output and the adapters' gradients are the fp32 base's, bit for bit."""
    cfg = lora_cfg(name, targets)
    split = TPSplit((1, 1), (30, 18)) if name == "llama" else TPSplit((2, 2), (64, 64))
    x = torch.randn(2, hf_cases.BLOCK, cfg.hidden, generator=torch.Generator().manual_seed(6))
    runs: list[dict[int, tuple[torch.Tensor, list[torch.Tensor]]]] = []
    for bf16 in (False, True):
        full = build_block(cfg, 1, SEED)
        assert isinstance(full, HFDecoderBlock)
        group = InMemoryAllReduce(2, timeout_s=30)
        shards = [shard_hf_block(full, cfg, split, r, group.rank_view(r)) for r in range(2)]
        if bf16:
            for shard in shards:
                assert hold_base(shard, torch.bfloat16) > 0
                matmuls = [b for n, b in shard.named_buffers() if n.endswith("weight") and b.dim() == 2]
                assert matmuls and all(b.dtype == torch.bfloat16 for b in matmuls)  # o_proj / mlp.c_fc too
        out: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}

        def work(r: int, shards: Sequence[HFDecoderBlock] = shards, out: dict[int, Any] = out) -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16):  # thread-local: inside each rank's thread
                y = shards[r](x)
            y.float().square().mean().backward()
            out[r] = (y.detach().float(), [p.grad for p in shards[r].parameters()])

        _run_ranks(2, work)
        runs.append(out)
    for r in range(2):
        torch.testing.assert_close(runs[1][r][0], runs[0][r][0], rtol=0, atol=0)
        for g_bf16, g_fp32 in zip(runs[1][r][1], runs[0][r][1], strict=True):
            torch.testing.assert_close(g_bf16, g_fp32, rtol=0, atol=0)


def test_the_planner_may_split_a_lora_job_without_dropout() -> None:
    cfg = lora_cfg("llama", ("q_proj",))
    assert planner_tensor_parallel(cfg) == 2  # the model's 2 KV heads, as without LoRA
    assert planner_tensor_parallel(lora_cfg("gpt2", ("c_attn",))) == 4
    assert cfg.lora is not None
    dropout = replace(cfg, lora=replace(cfg.lora, dropout=0.1))
    assert planner_tensor_parallel(dropout) == 1  # each rank would draw its own mask
    group = InMemoryAllReduce(2).rank_view(0)
    with pytest.raises(ValueError, match="dropout"):
        build_stage(dropout, 1, StageSpec(1, 3, TPSplit((1, 1), (24, 24)), 0), group)


def test_the_leader_plans_a_split_lora_stage_every_member_verifies_it_and_it_trains_as_peft() -> None:
    """``make_plan`` for the example Llama with adapters, over four unequal members linked fast: a stage split
    by its KV heads, which each member's check accepts; the planner's split of the tiny Llama trains as peft."""
    spec = load_spec(ROOT / "examples" / "llama-shakespeare.toml")
    assert isinstance(spec.model, HFModelConfig)
    spec = replace(spec, model=replace(spec.model, lora=LoraSpec(r=8, alpha=16, targets=("q_proj", "v_proj"))))
    offers = [Offer(c * 32, f"h:{i}", 1e8 * (1 + i), 1 << 30) for i, c in enumerate("abcd")]
    ids = [o.peer_id for o in offers]
    fast = {(a, b): Link(1e-6, 1e12, 0.0) for i, a in enumerate(ids) for b in ids[i + 1 :]}
    inputs, the_plan = make_plan(spec, offers, {}, measured=fast, include=ids[0])
    assert inputs.training.max_tensor_parallel == 2
    assert any(st.split() is not None for st in worker_stages(the_plan)), the_plan
    data = encode_start(inputs, the_plan)
    for own in offers:
        verify_start(spec, *data, own)

    cfg = lora_cfg("llama", ("down_proj", "q_proj", "up_proj"))
    layout = planned_layout(cfg, 4)
    assert any(split is not None for _, _, split in layout), layout
    ref_losses, ref_adapters = reference_run(cfg, OPTS["adamw"], 1.0)
    losses, engines = _split_run(cfg, layout, "adamw")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=TOL)
    full = full_state(cfg, [parse_shard(d) for d in _shards(layout, engines)])
    for key, value in full.items():
        if key.startswith("param."):
            _, _, index, local = key.split(".", 3)
            torch.testing.assert_close(value, ref_adapters[peft_key(cfg, int(index), local)], rtol=0, atol=TOL)


RELAYOUTS: list[tuple[str, tuple[str, ...], Relayout, Relayout]] = [
    ("llama", LLAMA_ALL, ([2], {}), ([1, 3], {1: [(1, 30), (1, 18)]})),  # whole -> split (uneven)
    ("gpt2", ("c_attn", "c_fc", "c_proj"), ([1, 3], {1: [(3, 100), (1, 28)]}), ([], {0: [(1, 40), (2, 40), (1, 48)]})),
]


@pytest.mark.parametrize(("name", "targets", "old", "new"), RELAYOUTS)
def test_lora_state_survives_relayouts_between_split_and_whole(
    name: str, targets: tuple[str, ...], old: Relayout, new: Relayout
) -> None:
    """The adapters and their optimizer buffers, cut for one layout and gathered, cut for another and gathered:
    the same tensors (``reslice`` by the adapters' names)."""
    cfg = lora_cfg(name, targets)
    full = training_state(cfg)
    assert full and all(".lora_" in k for k in full)
    gathered = full_state(cfg, [parse_shard(d) for d in shards_of(cfg, full, stages_of(cfg, *old))])
    assert_equal(gathered, full)
    stages = stages_of(cfg, *new)
    again = full_state(cfg, [parse_shard(d) for d in shards_of(cfg, gathered, stages)])
    assert_equal(again, full)
    split = next(st for st in stages if st.split() is not None)
    cut = slice_state(cfg, full, split, 0)
    assert any(".lora_A." in k and v.shape != full[k].shape for k, v in cut.items())  # row-parallel A
    assert any(".lora_B." in k and v.shape != full[k].shape for k, v in cut.items())  # column-parallel B
