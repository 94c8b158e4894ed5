"""Stock transformers causal LMs split into pipeline stages train exactly as a plain transformers loop (fp32, CPU).

The reference is ``AutoModelForCausalLM`` built by the installed library, loaded with the same initial tensors
(under the architecture's own keys), trained on the same batches with ``torch.optim`` and cross-entropy over
all positions. Pipelines run Arceus' ``StageEngine`` in threads over the in-memory links (as ``test_engine``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel

from arceusd.models.build import build_blocks, num_blocks
from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import hf_key
from arceusd.worker.engine import StageEngine
from arceusd.worker.optim import AdamWConfig, LRSchedule, OptimizerConfig, SGDConfig
from arceusd.worker.schedule import ScheduleKind
from tests.unit import hf_cases
from tests.unit.test_engine import SEED, Case, build_engines, drive, prefixed

STEPS = 3
BATCH, MICRO = 6, 3
TOL = 1e-5


def batches(cfg: HFModelConfig) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        x = torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=gen)
        y = torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=gen)
        out.append((x, y))
    return out


def initial_state(cfg: HFModelConfig) -> dict[str, torch.Tensor]:
    """The Arceus blocks' initial tensors under the architecture's keys."""
    state: dict[str, torch.Tensor] = {}
    for i, block in enumerate(build_blocks(cfg, SEED)):
        for local, p in block.named_parameters():
            state[hf_key(cfg, i, local)] = p.detach().clone()
    return state


def reference_model(cfg: HFModelConfig) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_config(transformers_config(cfg))  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(initial_state(cfg), strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if cfg.tied else set()), (missing, unexpected)
    if cfg.tied:
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # type: ignore[no-untyped-call]
    return model


def reference_run(
    cfg: HFModelConfig, opt: OptimizerConfig, clip: float | None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = reference_model(cfg)
    losses = train_plain(model, list(model.parameters()), cfg, opt, clip)
    return losses, {k: v.detach() for k, v in model.state_dict().items()}


def train_plain(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    cfg: HFModelConfig,
    opt: OptimizerConfig,
    clip: float | None,
) -> list[float]:
    """A plain single-process loop over ``batches(cfg)`` training ``params`` of a transformers model: the losses."""
    optimizer: torch.optim.Optimizer = (
        torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum)
        if isinstance(opt, SGDConfig)
        else torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
    )
    losses = []
    for x, y in batches(cfg):
        optimizer.zero_grad()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()  # type: ignore[no-untyped-call]
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def pipeline_run(
    cfg: HFModelConfig,
    layout: list[tuple[int, int]],
    opt: OptimizerConfig,
    schedule: ScheduleKind,
    clip: float | None,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    case = Case(cfg, [(a, b, None) for a, b in layout], micro_batches=MICRO, batch=BATCH)
    engines = build_engines(case, schedule, opt, LRSchedule(max_lr=opt.lr), clip)
    results = drive(engines, batches(cfg))
    state: dict[str, torch.Tensor] = {}
    for ranks in engines:
        engine: StageEngine = ranks[0]
        for key, block in engine.module.blocks.items():
            for local, p in block.named_parameters():
                state[hf_key(cfg, int(key), local)] = p.detach()
    return [r.loss for r in results], state


def assert_same(
    cfg: HFModelConfig,
    ref: tuple[list[float], dict[str, torch.Tensor]],
    got: tuple[list[float], dict[str, torch.Tensor]],
) -> float:
    """Asserts losses and weights agree to ``TOL``; returns the largest absolute weight difference."""
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(ref[0]), rtol=0, atol=TOL)
    worst = 0.0
    for key, value in got[1].items():
        torch.testing.assert_close(value, ref[1][key], rtol=0, atol=TOL, msg=prefixed(key))
        worst = max(worst, float((value - ref[1][key]).abs().max()))
    assert set(got[1]) == set(ref[1])  # a tied head shows the shared weight under lm_head.weight too
    return worst


OPTS: dict[str, OptimizerConfig] = {
    "adamw": AdamWConfig(lr=3e-3, weight_decay=0.1),
    "sgd": SGDConfig(lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("llama", [(0, 2), (2, 5)]),
        ("llama", [(0, 1), (1, 3), (3, 5)]),
        ("qwen2", [(0, 2), (2, 4)]),
        ("qwen2", [(0, 1), (1, 3), (3, 4)]),
        ("mistral", [(0, 2), (2, 4)]),
        ("gpt2", [(0, 2), (2, 4)]),
        ("gpt2", [(0, 1), (1, 3), (3, 4)]),
    ],
)
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_pipeline_equals_plain_transformers_training(name: str, layout: list[tuple[int, int]], opt_name: str) -> None:
    cfg = hf_cases.config(name)
    assert layout[-1][1] == num_blocks(cfg)
    opt = OPTS[opt_name]
    clip = 1.0 if opt_name == "adamw" else None
    ref = reference_run(cfg, opt, clip)
    got = pipeline_run(cfg, layout, opt, ScheduleKind.ONE_F_ONE_B, clip)
    assert_same(cfg, ref, got)


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_tied_embeddings_train_exactly_in_one_stage(name: str) -> None:
    cfg = hf_cases.config(name, tie_word_embeddings=True)
    opt = OPTS["adamw"]
    ref = reference_run(cfg, opt, 1.0)
    got = pipeline_run(cfg, [(0, num_blocks(cfg))], opt, ScheduleKind.GPIPE, 1.0)
    assert_same(cfg, ref, got)


@pytest.mark.parametrize(
    ("name", "layout", "opt_name"),
    [
        ("gpt2", [(0, 2), (2, 4)], "adamw"),
        ("gpt2", [(0, 1), (1, 3), (3, 4)], "sgd"),
        ("llama", [(0, 3), (3, 5)], "sgd"),
        ("llama", [(0, 1), (1, 3), (3, 5)], "adamw"),
    ],
)
def test_a_tied_model_split_across_stages_trains_exactly_as_one_process(
    name: str, layout: list[tuple[int, int]], opt_name: str
) -> None:
    """The embedding on the first stage, the head (with its copy of the tied weight) on the last: the first and
    the last stage sum their gradients of it, clipping counts it once (SGD with a clip below the gradient's
    norm sees a weight counted twice), and both copies stay bit-identical."""
    cfg = hf_cases.config(name, tie_word_embeddings=True)
    opt = OPTS[opt_name]
    clip = 1.0 if opt_name == "adamw" else 0.5
    ref = reference_run(cfg, opt, clip)
    got = pipeline_run(cfg, layout, opt, ScheduleKind.ONE_F_ONE_B, clip)
    assert_same(cfg, ref, got)
    owner = hf_key(cfg, 0, "wte.weight" if cfg.is_gpt2 else "embed_tokens.weight")
    assert torch.equal(got[1][owner], got[1]["lm_head.weight"])  # the two copies, bit for bit
    assert got[1][owner].data_ptr() != got[1]["lm_head.weight"].data_ptr()  # really two tensors on two stages


def test_gpt2_blocks_compute_gelu_new_in_one_fused_kernel() -> None:
    """GPT-2's ``gelu_new`` runs as torch's fused tanh GELU (one kernel, not seven): the library's function, the
    same values."""
    from transformers.activations import NewGELUActivation

    from arceusd.models.hf.blocks import HFDecoderBlock, TanhGELU, build_hf_block

    block = build_hf_block(hf_cases.config("gpt2"), 1, seed=SEED)
    assert isinstance(block, HFDecoderBlock)
    mlp = block.layer.get_submodule("mlp")
    act = mlp.act
    assert isinstance(act, TanhGELU)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(5)) * 4
    torch.testing.assert_close(act(x), NewGELUActivation()(x), rtol=1e-6, atol=1e-6)


def test_a_rotary_block_computes_cos_and_sin_once_per_length() -> None:
    """A Llama-style block computes its rotary ``cos``/``sin`` once per sequence length, device and dtype (a
    stage's every layer recomputed them every step; the library's model does once per forward): the same outputs
    and gradients, to the bit, as a block computing them afresh; a new length, dtype or a move recomputes; a
    forward in inference mode keeps nothing (its tensors could not be saved for a training step's backward)."""
    from arceusd.models.hf.blocks import HFDecoderBlock, build_hf_block

    cfg = hf_cases.config("llama")
    block, fresh = build_hf_block(cfg, 1, seed=SEED), build_hf_block(cfg, 1, seed=SEED)
    assert isinstance(block, HFDecoderBlock) and isinstance(fresh, HFDecoderBlock) and block.rotary is not None
    calls = 0
    rotary_forward = block.rotary.forward

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return rotary_forward(*args, **kwargs)

    block.rotary.forward = counted
    gen = torch.Generator().manual_seed(11)
    for step, length in enumerate((cfg.block_size, cfg.block_size, cfg.block_size, cfg.block_size - 3)):
        x = torch.randn(2, length, cfg.hidden, generator=gen)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        fresh._rope = None  # afresh every time
        ya, yb = block(xa), fresh(xb)
        assert torch.equal(ya, yb), step
        ya.square().sum().backward()
        yb.square().sum().backward()
        assert xa.grad is not None and xb.grad is not None and torch.equal(xa.grad, xb.grad), step
        for (name, p), q in zip(block.named_parameters(), fresh.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad), (step, name)
    assert calls == 2  # once for each length
    block.double()  # a new dtype and frequencies' tensor
    block(torch.randn(2, 5, cfg.hidden, dtype=torch.float64, generator=gen))
    assert calls == 3
    block._rope = None
    with torch.inference_mode():
        block(torch.randn(2, 5, cfg.hidden, dtype=torch.float64, generator=gen))
    assert block._rope is None and calls == 4
