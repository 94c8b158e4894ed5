"""LoRA on a stock causal LM split into pipeline stages trains exactly as one process with peft (fp32, CPU), and
exports a folder ``PeftModel.from_pretrained`` loads (issue 30 items 3 and 6).

The reference is ``get_peft_model`` on ``AutoModelForCausalLM`` of the same base tensors, its adapters set to the
Arceus blocks' initial ones, trained on the same batches with ``torch.optim`` over its trainable parameters.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import AutoModelForCausalLM, PreTrainedModel

from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.procs.reslice import full_state, parse_shard, slice_state
from arceusd.models.build import build_blocks, num_blocks
from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import hf_key, param_count
from arceusd.models.hf.lora import hold_base
from arceusd.models.hf.lora_export import MERGED, write_lora_export
from arceusd.models.hf.lora_keys import lora_tensors, peft_key
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.worker.engine import StageEngine
from arceusd.worker.optim import AdamWConfig, LRSchedule, OptimizerConfig, SGDConfig
from arceusd.worker.protocol import MemberConfig, StageConfig
from arceusd.worker.replicas import ReplicaConfig
from arceusd.worker.schedule import ScheduleKind
from tests.unit import hf_cases
from tests.unit.test_engine import SEED, Case, build_engines, drive, prefixed
from tests.unit.test_hf_exact import BATCH, MICRO, TOL, batches, initial_state, train_plain
from tests.unit.test_replicas import build_replicas, drive_replicas

TARGETS = {"llama": ("q_proj", "v_proj"), "qwen2": ("o_proj", "up_proj"), "gpt2": ("c_attn", "c_proj")}
OPTS: dict[str, OptimizerConfig] = {"adamw": AdamWConfig(lr=3e-3, weight_decay=0.1), "sgd": SGDConfig(lr=0.5)}


def lora_config(name: str, merge: bool = False) -> HFModelConfig:
    return replace(hf_cases.config(name), lora=LoraSpec(r=4, alpha=8, targets=TARGETS[name], merge=merge))


def peft_config(cfg: HFModelConfig) -> LoraConfig:
    assert cfg.lora is not None
    return LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=0.0,
        target_modules=list(cfg.lora.targets),
        fan_in_fan_out=cfg.is_gpt2,
    )


def base_model(cfg: HFModelConfig) -> PreTrainedModel:
    """The base of ``cfg`` as ``AutoModelForCausalLM`` holding the Arceus blocks' base tensors."""
    base = replace(cfg, lora=None)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(transformers_config(base))  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(initial_state(base), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model


def adapters_of(cfg: HFModelConfig, blocks: dict[int, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Every block's trainable tensors under peft's keys."""
    return {peft_key(cfg, i, local): p.detach().clone() for i, b in blocks.items() for local, p in b.named_parameters()}


def reference_run(
    cfg: HFModelConfig, opt: OptimizerConfig, clip: float | None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = get_peft_model(base_model(cfg), peft_config(cfg))
    start = adapters_of(cfg, dict(enumerate(build_blocks(cfg, SEED))))
    result = set_peft_model_state_dict(model, start)
    assert not result.unexpected_keys  # type: ignore[attr-defined]
    params = [p for p in model.parameters() if p.requires_grad]
    assert len(params) == len(start)
    losses = train_plain(model, params, cfg, opt, clip)
    return losses, {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def pipeline(
    cfg: HFModelConfig, layout: list[tuple[int, int]], opt: OptimizerConfig, schedule: ScheduleKind, clip: float | None
) -> tuple[list[float], list[StageEngine]]:
    case = Case(cfg, [(a, b, None) for a, b in layout], micro_batches=MICRO, batch=BATCH)
    engines = build_engines(case, schedule, opt, LRSchedule(max_lr=opt.lr), clip)
    results = drive(engines, batches(cfg))
    return [r.loss for r in results], [ranks[0] for ranks in engines]


def blocks_of(engines: list[StageEngine]) -> dict[int, torch.nn.Module]:
    return {int(k): b for e in engines for k, b in e.module.blocks.items()}


CASES = [
    ("llama", [(0, 2), (2, 5)], "adamw", ScheduleKind.ONE_F_ONE_B),
    ("llama", [(0, 1), (1, 3), (3, 5)], "sgd", ScheduleKind.GPIPE),  # a first stage with nothing to train
    ("qwen2", [(0, 2), (2, 4)], "adamw", ScheduleKind.GPIPE),
    ("gpt2", [(0, 2), (2, 4)], "adamw", ScheduleKind.ONE_F_ONE_B),  # Conv1D: fan_in_fan_out
]


@pytest.mark.parametrize(("name", "layout", "opt_name", "schedule"), CASES)
def test_lora_pipeline_equals_single_process_peft(
    name: str, layout: list[tuple[int, int]], opt_name: str, schedule: ScheduleKind
) -> None:
    cfg = lora_config(name)
    assert layout[-1][1] == num_blocks(cfg)
    clip = 1.0 if opt_name == "adamw" else None
    ref_losses, ref_adapters = reference_run(cfg, OPTS[opt_name], clip)
    losses, engines = pipeline(cfg, layout, OPTS[opt_name], schedule, clip)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=TOL)
    got = adapters_of(cfg, blocks_of(engines))
    assert set(got) == set(ref_adapters)
    for key, value in got.items():
        torch.testing.assert_close(value, ref_adapters[key], rtol=0, atol=TOL, msg=prefixed(key))
    moved = [k for k, v in got.items() if ".lora_B." in k and float(v.abs().max()) > 0]
    assert moved, "the adapters did not train"


def test_only_the_adapters_are_trained_and_checkpointed() -> None:
    cfg = lora_config("llama")
    _, engines = pipeline(cfg, [(0, 1), (1, 3), (3, 5)], OPTS["adamw"], ScheduleKind.ONE_F_ONE_B, 1.0)
    base = initial_state(replace(cfg, lora=None))
    for engine in engines:
        adapters = {f"blocks.{k}.{n}" for k, b in engine.module.blocks.items() for n in lora_tensors(cfg, int(k))}
        params = {k.removeprefix("param.") for k in engine.state_tensors() if k.startswith("param.")}
        assert params == adapters  # shards hold the adapters and their optimizer state, nothing of the base
        assert set(engine.optimizer.params) == adapters
        for key, block in engine.module.blocks.items():
            for local, buffer in block.named_buffers():
                if local.endswith("inv_freq"):
                    continue
                plain = local.replace(".base_layer.", ".")
                torch.testing.assert_close(buffer, base[hf_key(cfg, int(key), plain)], rtol=0, atol=0)  # frozen
    assert engines[0].state_tensors() == {}  # the embeddings: nothing to train


def _logits(blocks: dict[int, torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        for i in sorted(blocks):
            x = blocks[i](x)
    return x


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_export_loads_with_peft_and_merged_with_transformers(name: str, tmp_path: Path) -> None:
    cfg = lora_config(name, merge=True)
    _, engines = pipeline(cfg, [(0, 2), (2, num_blocks(cfg))], OPTS["adamw"], ScheduleKind.ONE_F_ONE_B, 1.0)
    blocks = blocks_of(engines)
    state = {f"{i}.{local}": p.detach() for i, b in blocks.items() for local, p in b.named_parameters()}
    write_lora_export(tmp_path, cfg, state, None, SEED, None)
    x = batches(cfg)[0][0]
    want = _logits(blocks, x)
    peft_model = PeftModel.from_pretrained(base_model(cfg), str(tmp_path))
    with torch.no_grad():
        got = peft_model(input_ids=x).logits
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / MERGED))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=x).logits, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_bf16_base_computes_what_autocast_computes_with_an_fp32_base(name: str) -> None:
    cfg = lora_config(name)
    x = batches(cfg)[0][0]
    outs, grads = [], []
    for bf16 in (False, True):
        blocks = dict(enumerate(build_blocks(cfg, SEED)))
        if bf16:
            saved = sum(hold_base(b, torch.bfloat16) for b in blocks.values())
            assert saved > 0
            assert all(p.dtype == torch.float32 for b in blocks.values() for p in b.parameters())  # the adapters
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x
            for i in sorted(blocks):
                h = blocks[i](h)
        h.float().square().mean().backward()  # type: ignore[no-untyped-call]
        outs.append(h.detach().float())
        grads.append([p.grad for b in blocks.values() for p in b.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    for g_bf16, g_fp32 in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_bf16, g_fp32, rtol=0, atol=0)


def _second_batches(cfg: HFModelConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(8)
    return [
        (
            torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=gen),
            torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=gen),
        )
        for _ in range(3)
    ]


def test_a_lora_checkpoint_resumes_in_another_layout_as_if_never_stopped() -> None:
    cfg, opt = lora_config("llama"), OPTS["adamw"]
    old, new = [(0, 1), (1, 3), (3, 5)], [(0, 2), (2, 5)]  # the old first stage holds nothing to train
    ref = build_engines(
        Case(cfg, [(a, b, None) for a, b in new], MICRO, BATCH),
        ScheduleKind.ONE_F_ONE_B,
        opt,
        LRSchedule(max_lr=opt.lr),
        1.0,
    )
    drive(ref, batches(cfg))
    ref_losses = [r.loss for r in drive(ref, _second_batches(cfg))]
    _, first = pipeline(cfg, old, opt, ScheduleKind.GPIPE, 1.0)
    shards = []
    for s, (engine, (a, b)) in enumerate(zip(first, old, strict=True)):
        meta = {"stage": str(s), "rank": "0", "start": str(a), "end": str(b), "tp_heads": "", "tp_columns": ""}
        shards.append(parse_shard(save_bytes({k: v.clone() for k, v in engine.state_tensors().items()}, meta)))
    full = full_state(cfg, shards)
    assert full and all(".lora_" in k for k in full)
    resumed = build_engines(
        Case(cfg, [(a, b, None) for a, b in new], MICRO, BATCH),
        ScheduleKind.ONE_F_ONE_B,
        opt,
        LRSchedule(max_lr=opt.lr),
        1.0,
    )
    for (a, b), ranks in zip(new, resumed, strict=True):
        ranks[0].load_state_tensors(slice_state(cfg, full, StageConfig(a, b, (MemberConfig("p", 0, 0),)), 0), 3)
    losses = [r.loss for r in drive(resumed, _second_batches(cfg))]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=TOL)
    want = adapters_of(cfg, blocks_of([r[0] for r in ref]))
    for key, value in adapters_of(cfg, blocks_of([r[0] for r in resumed])).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=TOL, msg=prefixed(key))


@pytest.mark.parametrize("layout", [[(0, 1), (1, 5)], [(0, 3), (3, 5)]])
def test_two_replicas_all_reduce_only_the_adapters_and_equal_one_peft_process(layout: list[tuple[int, int]]) -> None:
    cfg = lora_config("llama")
    ref_losses, ref_adapters = reference_run(cfg, OPTS["adamw"], 1.0)
    case = Case(cfg, [(a, b, None) for a, b in layout], micro_batches=MICRO, batch=BATCH)
    pipelines, rings = build_replicas(
        case,
        2,
        ScheduleKind.ONE_F_ONE_B,
        ReplicaConfig(replicas=2, bucket_bytes=1000),
        "adamw",
        LRSchedule(max_lr=OPTS["adamw"].lr),
        1.0,
    )
    per_replica = drive_replicas(pipelines, batches(cfg))
    for rep, results in enumerate(per_replica):
        torch.testing.assert_close(torch.tensor([r.loss for r in results]), torch.tensor(ref_losses), rtol=0, atol=TOL)
        got = adapters_of(cfg, blocks_of([stage[0] for stage in pipelines[rep]]))
        for key, value in got.items():
            torch.testing.assert_close(value, ref_adapters[key], rtol=0, atol=TOL, msg=prefixed(f"replica {rep} {key}"))
    base = sum(param_count(replace(cfg, lora=None), i) for i in range(num_blocks(cfg)))
    assert 0 < sum(ring.bytes_sent for ring in rings) < base * 4  # 3 steps of adapter gradients: not one base's
