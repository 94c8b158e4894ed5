"""A tied embedding split across stages over the wire links: the ``tie`` streams carry the gradient sum.

Tiny tied GPT-2 and Llama configs in 2 and 3 stages, each stage a ``StageEngine`` over a real ``WireFabric`` on
the in-memory transport twin (the worker process's links, handshake and per-frame MAC, no sockets), against a
plain single-process ``transformers`` loop on the same batches (``test_hf_exact.reference_run``), to 1e-5 in
fp32; the two copies of the tied weight end bit-identical. The real worker processes: ``tests/integration/
test_worker_tied.py``.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import trio

from arceusd.models.hf.keys import hf_key, tied_names
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import LinkError
from arceusd.worker.optim import SGDConfig
from arceusd.worker.pending_step import StepResult
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.wire_links import WireFabric
from tests.unit import hf_cases
from tests.unit.test_engine import SEED
from tests.unit.test_hf_exact import BATCH, MICRO, OPTS, assert_same, batches, reference_run
from tests.unit.test_wire_links_async import with_fabrics


@pytest.mark.parametrize(
    ("name", "layout", "opt_name"),
    [
        ("gpt2", [(0, 2), (2, 4)], "sgd"),
        ("llama", [(0, 1), (1, 3), (3, 5)], "adamw"),
    ],
)
def test_tied_weight_over_the_wire_trains_as_one_process(
    name: str, layout: list[tuple[int, int]], opt_name: str
) -> None:
    cfg = hf_cases.config(name, tie_word_embeddings=True)
    opt = OPTS[opt_name]
    clip = 1.0 if opt_name == "adamw" else 0.5
    ref = reference_run(cfg, opt, clip)
    data = batches(cfg)
    last = len(layout) - 1
    assert BATCH % MICRO == 0

    async def body(fabrics: list[WireFabric]) -> tuple[list[float], dict[str, torch.Tensor]]:
        engines: list[StageEngine] = []
        for fabric in fabrics:
            start, end = layout[fabric.stage]
            module = build_stage(cfg, SEED, StageSpec(start, end))
            config = EngineConfig(
                stage=fabric.stage,
                num_stages=len(layout),
                num_micro_batches=MICRO,
                schedule=ScheduleKind.ONE_F_ONE_B,
                optimizer=opt,
                max_grad_norm=clip,
            )
            tied = fabric.tied_link() if module.tied is not None else None
            engines.append(StageEngine(module, fabric.links(), config, tied=tied))
        assert [e.tied is not None for e in engines] == [s in (0, last) for s in range(len(layout))]
        results: dict[int, list[StepResult]] = {}

        async def run(fabric: WireFabric, engine: StageEngine) -> None:
            out = []
            for step, (x, y) in enumerate(data):
                fabric.step = step
                first, final = fabric.stage == 0, fabric.stage == last
                out.append(await trio.to_thread.run_sync(engine.run_step, x if first else None, y if final else None))
            results[fabric.stage] = out

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for fabric, engine in zip(fabrics, engines, strict=True):
                    nursery.start_soon(run, fabric, engine)
        state: dict[str, torch.Tensor] = {}
        for engine in engines:
            for key, block in engine.module.blocks.items():
                for local, p in block.named_parameters():
                    state[hf_key(cfg, int(key), local)] = p.detach()
        return [r.loss for r in results[0]], state

    got = trio.run(partial(with_fabrics, [(a, b, None) for a, b in layout], body, micro=MICRO, tied=True))
    assert_same(cfg, ref, got)
    names = tied_names(cfg)
    assert names is not None
    assert torch.equal(got[1][hf_key(cfg, 0, names[0])], got[1]["lm_head.weight"])


def test_a_fabric_without_a_tied_end_says_so() -> None:
    async def body(fabrics: list[WireFabric]) -> str:
        try:
            fabrics[1].tied_link()  # the middle stage of three
        except LinkError as exc:
            return str(exc)
        return "no error"

    layout = [(0, 1, None), (1, 3, None), (3, 5, None)]
    assert "holds no end of a tied weight" in trio.run(partial(with_fabrics, layout, body, tied=True))


def test_the_head_stage_alone_gets_the_embeddings_initial_tensor() -> None:
    cfg = hf_cases.config("llama", tie_word_embeddings=True)
    head = build_stage(cfg, SEED, StageSpec(4, 5))
    emb = build_stage(cfg, SEED, StageSpec(0, 1))
    assert head.tied is not None and head.tied.copy and emb.tied is not None and not emb.tied.copy
    assert torch.equal(head.tied_parameter(), emb.tied_parameter())
    assert all(p is not head.tied_parameter() for p in head.norm_parameters())  # counted once, on the first stage
    assert any(p is emb.tied_parameter() for p in emb.norm_parameters())
    both = build_stage(cfg, SEED, StageSpec(0, 5))
    assert both.tied is None  # one stage: one shared parameter, nothing to exchange


def test_a_tied_end_without_its_link_is_refused_with_one_line() -> None:
    cfg = hf_cases.config("gpt2", tie_word_embeddings=True)
    module = build_stage(cfg, SEED, StageSpec(2, 4))
    with pytest.raises(ValueError, match="holds one end of a tied weight"):
        StageEngine(
            module,
            object(),  # type: ignore[arg-type]
            EngineConfig(stage=1, num_stages=2, num_micro_batches=1, optimizer=SGDConfig(lr=0.1)),
        )
