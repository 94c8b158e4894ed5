"""How far training can move a parameter (arceusd/jobs/judging/plausibility.py, issue #29 item 8): the bound holds for
the real optimizers driven by the worst gradients we can make (huge, sign-flipping, sparse), the scan's magnitude
bracket holds in every float dtype, and a shard of 1e30 is refused while the honest shards of a run pass."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.judging import plausibility
from arceusd.jobs.judging.shard_scan import Magnitude, scan_shard
from arceusd.jobs.spec.parsed import TrainingSpec


def training(optimizer: str, **kw: object) -> TrainingSpec:
    base: dict[str, object] = {
        "steps": 400,
        "epochs": None,
        "batch_size": 8,
        "micro_batches": 1,
        "optimizer": optimizer,
        "lr": 0.01,
        "weight_decay": 0.0,
    }
    base.update(kw)
    return TrainingSpec(**base)  # type: ignore[arg-type]


def hostile_gradients(kind: str, n: int, steps: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        if kind == "huge":
            g = torch.randn(n, generator=gen) * 1e6
        elif kind == "flip":  # a long push one way after tiny gradients (Adam's ratio at its largest)
            g = torch.full((n,), 1e-6 if t < steps // 2 else 1e3)
        else:  # sparse bursts
            g = torch.zeros(n)
            g[t % n] = 1e4 * (1 if t % 3 else -1)
        out.append(g)
    return out


def run(spec: TrainingSpec, grads: list[torch.Tensor], start: torch.Tensor) -> torch.Tensor:
    p = torch.nn.Parameter(start.clone())
    t = spec
    if t.optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW([p], lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    else:
        opt = torch.optim.SGD([p], lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    for step, g in enumerate(grads):
        for group in opt.param_groups:
            group["lr"] = t.lr_at(step)
        p.grad = g.clone()
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([p], t.grad_clip)
        opt.step()
    return p.detach()


@pytest.mark.parametrize("kind", ["huge", "flip", "sparse"])
@pytest.mark.parametrize(
    "spec",
    [
        training("adamw"),
        training("adamw", lr=0.1, weight_decay=0.1, warmup_steps=20, lr_decay="cosine", min_lr=0.001),
        training("adamw", betas=(0.5, 0.9)),
        training("sgd", momentum=0.9, grad_clip=1.0, lr=0.05),
        training("sgd", momentum=0.0, grad_clip=0.5, lr=0.2, weight_decay=0.01),
    ],
    ids=["adamw", "adamw-schedule-decay", "adamw-betas", "sgd-momentum-clip", "sgd-clip-decay"],
)
def test_the_real_optimizers_never_move_a_value_past_the_ceiling(spec: TrainingSpec, kind: str) -> None:
    start = torch.randn(64, generator=torch.Generator().manual_seed(1)) * 0.05
    grads = hostile_gradients(kind, 64, 300, 2)
    middle = run(spec, grads[:100], start)  # a checkpoint at step 100, checked at 300 (momentum carried over)
    end = run(spec, grads, start)
    assert float(middle.abs().max()) <= plausibility.ceiling(spec, 0, 100, float(start.abs().max()))
    limit = plausibility.ceiling(spec, 100, 300, float(middle.abs().max()))
    assert float(end.abs().max()) <= limit, (float(end.abs().max()), limit)
    assert limit < 1e3, "the bound is loose enough to mean nothing"


def test_adams_ratio_bound_is_one_at_the_first_step_and_about_seven_for_the_defaults() -> None:
    bound = plausibility.adam_ratio_bound(0.9, 0.999)
    assert bound is not None and 7.0 < bound < 7.5
    assert plausibility.adam_ratio_bound(0.0, 0.5) == pytest.approx(1.0 / math.sqrt(0.5), rel=1e-6)  # g after zeros
    assert plausibility.adam_ratio_bound(0.99, 0.9) is None  # beta1^2 >= beta2: no bound


def test_sgd_without_clipping_refuses_only_a_huge_growth() -> None:
    spec = training("sgd", momentum=0.9, lr=0.05)
    assert plausibility.ceiling(spec, 0, 20, 0.1) == plausibility.UNCLIPPED_GROWTH
    assert plausibility.ceiling(spec, 0, 20, 3.0) == 3.0 * plausibility.UNCLIPPED_GROWTH
    assert (
        plausibility.implausible(
            spec, 80, 100, {"param.blocks.0.w": 2.0}, {"param.blocks.0.w": Magnitude(2.0**99, 2.0**100)}
        )
        is not None
    )
    assert (
        plausibility.implausible(spec, 80, 100, {"param.blocks.0.w": 2.0}, {"param.blocks.0.w": Magnitude(8.0, 16.0)})
        is None
    )


def test_a_shard_of_1e30_is_refused_and_an_honest_one_passes(tmp_path: Path) -> None:
    spec = training("adamw", lr=0.001)
    before = {"param.blocks.0.weight": torch.randn(32, 16) * 0.1, "param.blocks.0.bias": torch.zeros(16)}
    reference = {k: float(v.abs().max()) for k, v in before.items()}
    honest = run(spec, hostile_gradients("huge", 32 * 16, 20, 3), before["param.blocks.0.weight"].flatten())
    shapes = {k: tuple(v.shape) for k, v in before.items()}
    path = tmp_path / "s.safetensors"
    path.write_bytes(
        save_bytes(
            {"param.blocks.0.weight": honest.reshape(32, 16), "param.blocks.0.bias": torch.full((16,), 0.015)}, {}
        )
    )
    assert plausibility.implausible(spec, 0, 20, reference, scan_shard(path, shapes)) is None
    path.write_bytes(save_bytes({k: torch.full_like(v, 1e30) for k, v in before.items()}, {}))
    why = plausibility.implausible(spec, 0, 20, reference, scan_shard(path, shapes))
    assert why is not None and "moved further than training can move them" in why


@settings(max_examples=80, deadline=None)
@given(
    dtype=st.sampled_from((torch.float32, torch.float16, torch.bfloat16, torch.float64)),
    n=st.integers(1, 200),
    exponent=st.integers(-30, 30),
    zero=st.booleans(),
)
def test_the_magnitude_bracket_holds_in_every_dtype(
    tmp_path_factory: pytest.TempPathFactory, dtype: torch.dtype, n: int, exponent: int, zero: bool
) -> None:
    if dtype == torch.float16:
        exponent = max(-14, min(exponent, 14))
    values = torch.zeros(n, dtype=dtype) if zero else (torch.randn(n, dtype=torch.float64) * 2.0**exponent).to(dtype)
    path = tmp_path_factory.mktemp("m") / "s.safetensors"
    path.write_bytes(save_bytes({"param.blocks.0.w": values}, {}))
    found = scan_shard(path, {"param.blocks.0.w": (n,)})["param.blocks.0.w"]
    largest = float(values.abs().max())
    assert found.lower <= largest < found.upper and found.upper <= max(2 * largest, found.upper) + 0
