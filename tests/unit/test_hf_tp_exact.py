"""Stock transformers causal LMs with a tensor-parallel stage train as a plain transformers loop (fp32, CPU, 1e-4).

Pipelines of 1-3 stages run Arceus' ``StageEngine`` in threads (as ``test_hf_exact``), one stage's decoder layers
split over 2-3 ranks (``arceusd/worker/hf_tensor_parallel.py``; uneven where the config allows), the reference
``AutoModelForCausalLM`` trained on the same batches. qwen2 and gpt2 train with SGD: AdamW divides a gradient by
its own magnitude, and their key biases' true gradient is 0 (softmax ignores a shift), so AdamW turns rounding
noise, which differs between a split and an unsplit attention, into whole steps of the learning rate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from arceusd.models.build import num_blocks
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import hf_key
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.worker.collective import InMemoryAllReduce
from arceusd.worker.hf_tp_tensors import gather_hf_tensor
from arceusd.worker.optim import LRSchedule
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tp_split import TPSplit
from tests.unit import hf_cases
from tests.unit.test_engine import Case, build_engines, drive, prefixed
from tests.unit.test_hf_exact import BATCH, MICRO, OPTS, batches, initial_state, reference_run

TOL = 1e-4
Layout = list[tuple[int, int, TPSplit | None]]


def tp_pipeline_run(
    cfg: HFModelConfig, layout: Layout, opt_name: str, schedule: ScheduleKind, clip: float | None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and the whole model's weights (split layers gathered over their ranks) under the checkpoint keys."""
    opt = OPTS[opt_name]
    engines = build_engines(
        Case(cfg, layout, micro_batches=MICRO, batch=BATCH), schedule, opt, LRSchedule(max_lr=opt.lr), clip
    )
    results = drive(engines, batches(cfg))
    state: dict[str, torch.Tensor] = {}
    for (_, _, split), ranks in zip(layout, engines, strict=True):
        modules = [e.module for e in ranks]
        for key, block in modules[0].blocks.items():
            per_rank = [dict(m.blocks[key].named_parameters()) for m in modules]
            for local, p in block.named_parameters():
                value = p.detach()
                if split is not None:
                    value = gather_hf_tensor(local, [d[local].detach() for d in per_rank], cfg, split)
                state[hf_key(cfg, int(key), local)] = value
        for key, block in modules[0].blocks.items():  # replicated parameters stayed bit-identical across ranks
            sharded: frozenset[str] = getattr(block, "tp_sharded", frozenset())
            assert (split is not None and 0 < int(key) < num_blocks(cfg) - 1) == bool(sharded)
            for m in modules[1:]:
                for n, p in m.blocks[key].named_parameters():
                    if n not in sharded:
                        assert torch.equal(p, dict(block.named_parameters())[n]), n
    return [r.loss for r in results], state


def assert_same(
    cfg: HFModelConfig,
    ref: tuple[list[float], dict[str, torch.Tensor]],
    got: tuple[list[float], dict[str, torch.Tensor]],
) -> None:
    """Losses and every weight within ``TOL``, and the training moved the weights (not a trivial equality)."""
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(ref[0]), rtol=0, atol=TOL)
    assert set(got[1]) == set(ref[1])
    for key, value in got[1].items():
        torch.testing.assert_close(value, ref[1][key], rtol=0, atol=TOL, msg=prefixed(key))
    moved = max(float((ref[1][k] - v).abs().max()) for k, v in initial_state(cfg).items())
    assert moved > 1e-3


CASES: list[tuple[str, dict[str, Any], Layout, str]] = [
    # llama: 4 heads sharing 2 KV heads (GQA), 48 MLP columns, 3 layers (blocks 1-3)
    ("llama", {}, [(0, 1, None), (1, 3, TPSplit((1, 1), (30, 18))), (3, 5, None)], "adamw"),
    ("llama", {}, [(0, 2, TPSplit((1, 1), (24, 24))), (2, 5, None)], "sgd"),
    ("mistral", {}, [(0, 2, None), (2, 4, TPSplit((1, 1), (25, 15)))], "adamw"),
    # qwen2 with 4 KV heads: split over 3 ranks, the head replicated in the split stage
    ("qwen2", {"num_key_value_heads": 4}, [(0, 2, None), (2, 4, TPSplit((2, 1, 1), (10, 20, 10)))], "sgd"),
    ("gpt2", {}, [(0, 1, None), (1, 3, TPSplit((3, 1), (100, 28))), (3, 4, None)], "sgd"),
    ("gpt2", {}, [(0, 2, TPSplit((1, 2, 1), (40, 40, 48))), (2, 4, None)], "sgd"),
]


@pytest.mark.parametrize(("name", "overrides", "layout", "opt_name"), CASES)
def test_a_tensor_parallel_stage_trains_as_plain_transformers(
    name: str, overrides: dict[str, Any], layout: Layout, opt_name: str
) -> None:
    cfg = hf_cases.config(name, **overrides)
    assert layout[-1][1] == num_blocks(cfg)
    clip = 1.0 if opt_name == "adamw" else 0.5
    ref = reference_run(cfg, OPTS[opt_name], clip)
    got = tp_pipeline_run(cfg, layout, opt_name, ScheduleKind.ONE_F_ONE_B, clip)
    assert_same(cfg, ref, got)


@pytest.mark.parametrize(
    ("name", "split", "opt_name"),
    [("llama", TPSplit((1, 1), (30, 18)), "adamw"), ("gpt2", TPSplit((2, 2), (64, 64)), "sgd")],
)
def test_a_tied_model_in_one_tensor_parallel_stage_trains_as_plain_transformers(
    name: str, split: TPSplit, opt_name: str
) -> None:
    """The embedding and the head (one shared weight, replicated on both ranks) with the split layers."""
    cfg = hf_cases.config(name, tie_word_embeddings=True)
    ref = reference_run(cfg, OPTS[opt_name], 1.0)
    got = tp_pipeline_run(cfg, [(0, num_blocks(cfg), split)], opt_name, ScheduleKind.GPIPE, 1.0)
    assert_same(cfg, ref, got)


def test_a_split_that_does_not_fit_the_model_is_refused() -> None:
    group = InMemoryAllReduce(2).rank_view(0)
    with pytest.raises(ValueError, match="KV heads"):
        build_stage(hf_cases.config("llama"), 1, StageSpec(1, 3, TPSplit((2, 2), (24, 24)), 0), group)
    tied = hf_cases.config("llama", tie_word_embeddings=True)
    with pytest.raises(ValueError, match="tied weight"):
        build_stage(tied, 1, StageSpec(3, 5, TPSplit((1, 1), (24, 24)), 0), group)
    with pytest.raises(ValueError, match="LoRA layers with dropout"):  # each rank would draw its own mask
        plain = hf_cases.config("llama")
        lora = HFModelConfig(plain.model_type, plain.fields, plain.block_size, lora=_lora())
        build_stage(lora, 1, StageSpec(1, 3, TPSplit((1, 1), (24, 24)), 0), group)


def _lora() -> LoraSpec:
    return LoraSpec(r=2, alpha=4, targets=("q_proj",), dropout=0.1)
