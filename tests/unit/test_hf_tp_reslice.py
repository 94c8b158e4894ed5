"""Checkpoints of a stock LM with tensor-parallel stages: a worker's shard holds what ``slice_state`` cuts, and the
full state survives any re-layout (pipeline <-> tensor-parallel, uneven, other splits) exactly."""

from __future__ import annotations

import pytest
import torch

from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.procs.reslice import full_state, parse_shard, slice_state
from arceusd.models.build import build_blocks, num_blocks
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.collective import InMemoryAllReduce
from arceusd.worker.protocol import MemberConfig, StageConfig
from arceusd.worker.stage import StageSpec, build_stage
from tests.unit import hf_cases

SEED = 5
Relayout = tuple[list[int], dict[int, list[tuple[int, int]]]]  # cut points; per split stage (kv heads, columns)


def training_state(cfg: HFModelConfig) -> dict[str, torch.Tensor]:
    """Every parameter (as built from ``SEED``) and an AdamW-like buffer each, of distinct values."""
    gen = torch.Generator().manual_seed(9)
    out: dict[str, torch.Tensor] = {}
    for i, block in enumerate(build_blocks(cfg, SEED)):
        for name, p in block.named_parameters():
            out[f"param.blocks.{i}.{name}"] = p.detach().clone()
            out[f"optim.blocks.{i}.{name}.exp_avg"] = torch.randn(p.shape, generator=gen)
    return out


def layout(cfg: HFModelConfig, cuts: list[int], tp: dict[int, list[tuple[int, int]]]) -> list[StageConfig]:
    bounds = [0, *cuts, num_blocks(cfg)]
    return [
        StageConfig(
            bounds[s],
            bounds[s + 1],
            tuple(MemberConfig(f"p{s}-{r}", h, c) for r, (h, c) in enumerate(tp.get(s, [(0, 0)]))),
        )
        for s in range(len(bounds) - 1)
    ]


def shards_of(cfg: HFModelConfig, full: dict[str, torch.Tensor], stages: list[StageConfig]) -> list[bytes]:
    out = []
    for s, stage in enumerate(stages):
        split = stage.split()
        for r in range(len(stage.members)):
            meta = {
                "stage": str(s),
                "rank": str(r),
                "tp_heads": ",".join(map(str, split.heads)) if split else "",
                "tp_columns": ",".join(map(str, split.columns)) if split else "",
            }
            out.append(save_bytes(slice_state(cfg, full, stage, r), meta))
    return out


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


CASES: list[tuple[str, Relayout, Relayout]] = [
    ("llama", ([2], {}), ([1, 3], {1: [(1, 30), (1, 18)]})),  # pipeline -> pipeline + uneven TP (GQA)
    ("gpt2", ([1, 3], {1: [(3, 100), (1, 28)]}), ([], {0: [(1, 40), (2, 40), (1, 48)]})),  # TP -> other TP
    ("qwen2", ([], {0: [(2, 20), (2, 20)]}), ([2], {})),  # TP over everything -> pipeline
]


@pytest.mark.parametrize(("name", "old", "new"), CASES)
def test_hf_state_survives_any_relayout(name: str, old: Relayout, new: Relayout) -> None:
    cfg = hf_cases.config(name, **({"num_key_value_heads": 4} if name == "qwen2" else {}))
    full = training_state(cfg)
    gathered = full_state(cfg, [parse_shard(d) for d in shards_of(cfg, full, layout(cfg, *old))])
    assert_equal(gathered, full)
    again = full_state(cfg, [parse_shard(d) for d in shards_of(cfg, gathered, layout(cfg, *new))])
    assert_equal(again, full)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_a_split_stage_holds_exactly_its_checkpoint_slice(name: str) -> None:
    """What ``slice_state`` cuts for rank r is, name for name, the parameter rank r's built shard holds."""
    cfg = hf_cases.config(name)
    split = [(1, 30), (1, 18)] if name == "llama" else [(3, 100), (1, 28)]
    stage = layout(cfg, [1, 3], {1: split})[1]
    tp = stage.split()
    assert tp is not None
    full = training_state(cfg)
    group = InMemoryAllReduce(2)
    for r in range(2):
        module = build_stage(cfg, SEED, StageSpec(stage.start, stage.end, tp, r), group.rank_view(r))
        sliced = slice_state(cfg, full, stage, r)
        held = {f"param.{n}": p.detach() for n, p in module.named_parameters()}
        assert_equal({k: v for k, v in sliced.items() if k.startswith("param.")}, held)
        assert any(v.shape != full[k].shape for k, v in held.items())  # some tensors really are split
