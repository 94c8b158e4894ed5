"""Re-slicing a tied stock LM's checkpoint: the weight is stored once (the embedding's), and a stage holding the
head without the embedding gets it back, with its optimizer buffers, under the head's names."""

from __future__ import annotations

import itertools

import torch

from arceusd.jobs.procs.reslice import Shard, full_state, slice_state
from arceusd.models.build import num_blocks
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.optim import AdamWConfig
from arceusd.worker.protocol import MemberConfig, StageConfig
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tied import InMemoryTiedPair
from tests.unit import hf_cases
from tests.unit.test_engine import SEED, Case, build_engines, drive
from tests.unit.test_hf_exact import BATCH, MICRO, batches

OPT = AdamWConfig(lr=3e-3, weight_decay=0.1)


def trained_shards(cfg: HFModelConfig, layout: list[tuple[int, int]]) -> list[Shard]:
    case = Case(cfg, [(a, b, None) for a, b in layout], micro_batches=MICRO, batch=BATCH)
    engines = build_engines(case, ScheduleKind.GPIPE, OPT, None, 1.0)
    drive(engines, batches(cfg))
    return [({"stage": str(s), "rank": "0"}, ranks[0].state_tensors()) for s, ranks in enumerate(engines)]


def stages(cfg: HFModelConfig, cuts: list[int]) -> list[StageConfig]:
    bounds = [0, *cuts, num_blocks(cfg)]
    return [StageConfig(a, b, (MemberConfig(f"peer-{a}", 0, 0),)) for a, b in itertools.pairwise(bounds)]


def load(cfg: HFModelConfig, stage: StageConfig, index: int, count: int, state: dict[str, torch.Tensor]) -> StageEngine:
    module = build_stage(cfg, SEED, StageSpec(stage.start, stage.end))
    link = InMemoryTiedPair().end(module.tied.copy) if module.tied is not None else None
    config = EngineConfig(stage=index, num_stages=count, num_micro_batches=1, optimizer=OPT)
    engine = StageEngine(module, object(), config, tied=link)  # type: ignore[arg-type]  # no step is run
    engine.load_state_tensors(state, step=3)  # refuses a tensor that is not this stage's, and a missing one
    return engine


def test_a_split_tied_checkpoint_reslices_to_one_stage_and_to_three() -> None:
    cfg = hf_cases.config("gpt2", tie_word_embeddings=True)
    shards = trained_shards(cfg, [(0, 2), (2, 4)])
    head_state = dict(shards[1][1])
    assert "param.blocks.3.lm_head.weight" in head_state and "optim.blocks.3.lm_head.weight.exp_avg" in head_state
    full = full_state(cfg, shards)
    assert not [k for k in full if "lm_head" in k]  # stored once: the embedding's
    for key in (
        "param.blocks.0.wte.weight",
        "optim.blocks.0.wte.weight.exp_avg",
        "optim.blocks.0.wte.weight.exp_avg_sq",
    ):
        copy = key.replace("blocks.0.wte", "blocks.3.lm_head")
        assert torch.equal(full[key], head_state[copy]), key  # the two copies were bit-identical

    (one,) = stages(cfg, [])
    whole = load(cfg, one, 0, 1, slice_state(cfg, full, one, 0))
    assert not [n for n, _ in whole.module.named_parameters() if "lm_head" in n]  # one shared parameter

    three = stages(cfg, [1, 3])
    last = slice_state(cfg, full, three[2], 0)
    assert torch.equal(last["param.blocks.3.lm_head.weight"], full["param.blocks.0.wte.weight"])
    assert torch.equal(last["optim.blocks.3.lm_head.weight.exp_avg_sq"], full["optim.blocks.0.wte.weight.exp_avg_sq"])
    for s, stage in enumerate(three):
        load(cfg, stage, s, 3, slice_state(cfg, full, stage, 0))


def test_the_shapes_of_a_split_tied_plan_include_the_heads_copy() -> None:
    """What the leader checks shards against (``filework._shapes``: the reference model sliced per place)."""
    cfg = hf_cases.config("llama", tie_word_embeddings=True)
    from arceusd.models.build import build_reference_model

    model = build_reference_model(cfg, SEED)
    full = {f"param.blocks.{k}": v.detach() for k, v in model.named_parameters()}
    first, last = stages(cfg, [2])
    assert "param.blocks.0.embed_tokens.weight" in slice_state(cfg, full, first, 0)
    head = slice_state(cfg, full, last, 0)
    assert {k for k in head if k.startswith("param.blocks.4.")} == {
        "param.blocks.4.norm.weight",
        "param.blocks.4.lm_head.weight",
    }
    assert torch.equal(head["param.blocks.4.lm_head.weight"], full["param.blocks.0.embed_tokens.weight"])
