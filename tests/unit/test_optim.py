"""Stage optimizers match torch.optim; global clipping matches clip_grad_norm_; LR schedule shape."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from arceusd.worker.microbatch import micro_batch_sizes, split_micro_batches
from arceusd.worker.optim import (
    SGD,
    AdamW,
    AdamWConfig,
    LRSchedule,
    OptimizerConfig,
    SGDConfig,
    clip_grad_norm_global,
    make_optimizer,
)


def _model(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _constant(value: float) -> Callable[[float], float]:
    """A ``reduce`` that ignores the local value and returns ``value`` (the sum over all stages)."""
    return lambda _local: value


def _torch_opt(config: OptimizerConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if isinstance(config, SGDConfig):
        return torch.optim.SGD(
            params,
            lr=config.lr,
            momentum=config.momentum,
            dampening=config.dampening,
            weight_decay=config.weight_decay,
            nesterov=config.nesterov,
        )
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        eps=config.eps,
        weight_decay=config.weight_decay,
    )


CONFIGS: list[OptimizerConfig] = [
    SGDConfig(lr=0.1, momentum=0.9),
    SGDConfig(lr=0.05, momentum=0.8, dampening=0.1, weight_decay=0.01),
    SGDConfig(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.02),
    AdamWConfig(lr=0.01),
    AdamWConfig(lr=0.003, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_optimizer_matches_torch_optim(config: OptimizerConfig) -> None:
    ours_model, ref_model = _model(0), _model(0)
    ours = make_optimizer(ours_model.named_parameters(), config)
    ref = _torch_opt(config, list(ref_model.parameters()))
    schedule = LRSchedule(max_lr=config.lr, min_lr=config.lr / 10, warmup_steps=2, decay_steps=5)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        lr = schedule(step)
        for g in ref.param_groups:
            g["lr"] = lr
        ref.zero_grad()
        ours.zero_grad()
        ((ref_model(x) - y) ** 2).mean().backward()
        ((ours_model(x) - y) ** 2).mean().backward()
        ref.step()
        ours.step(lr)
    for a, b in zip(ours_model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert ours.step_count == 6
    state = ours.state_tensors()
    n_params = len(list(ours_model.parameters()))
    assert len(state) == (2 * n_params if isinstance(ours, AdamW) else n_params)
    assert isinstance(ours, SGD | AdamW)


def _adamw_run(
    config: AdamWConfig, steps: range, opt: AdamW | None = None, model: nn.Module | None = None
) -> tuple[nn.Module, AdamW]:
    model = model if model is not None else _model(0)
    opt = opt if opt is not None else AdamW(model.named_parameters(), config)
    for step in steps:
        gen = torch.Generator().manual_seed(100 + step)
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step(config.lr)
    return model, opt


def test_adamw_uses_the_fused_kernel_and_its_fallback_agrees() -> None:
    """The stage's AdamW runs torch's fused kernel on CPU; the foreach fallback (older torch, devices without
    the kernel) gives the same parameters to rounding."""
    config = AdamWConfig(lr=0.01, weight_decay=0.1)
    fused_model, fused = _adamw_run(config, range(5))
    assert fused.fused is True
    fallback_model = _model(0)
    fallback = AdamW(fallback_model.named_parameters(), config)
    fallback.fused = False  # as after a RuntimeError from the fused kernel
    _adamw_run(config, range(5), fallback, fallback_model)
    assert fallback.fused is False
    for a, b in zip(fused_model.parameters(), fallback_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_adamw_resumed_from_its_state_continues_exactly() -> None:
    """Restoring ``state_tensors`` and the step count (a checkpoint) continues the run bit for bit: the bias
    corrections read the restored step, not a fresh one."""
    config = AdamWConfig(lr=0.01)
    whole, _ = _adamw_run(config, range(6))
    first, opt = _adamw_run(config, range(3))
    resumed_model = _model(1)
    with torch.no_grad():
        for p, q in zip(resumed_model.parameters(), first.parameters(), strict=True):
            p.copy_(q)
    resumed = AdamW(resumed_model.named_parameters(), config)
    resumed.load_state_tensors(opt.state_tensors(), opt.step_count)
    _adamw_run(config, range(3, 6), resumed, resumed_model)
    for a, b in zip(resumed_model.parameters(), whole.parameters(), strict=True):
        assert torch.equal(a, b)


def test_adamw_keeps_each_step_count_on_the_device_and_steps_as_a_fresh_count_would() -> None:
    """The step counts torch's kernel reads are kept from step to step and set on the device (a tensor made from a
    Python number on a GPU waits for the whole queue: once per parameter per step): the fused kernel's step makes
    no tensor from Python data after the first step, and the parameters equal, to the bit, those of the functional
    ``adamw`` fed a fresh count every step (the optimizer before), through a step on which one parameter has no
    gradient, a resume at another step count, and the foreach fallback."""
    from torch.optim.adamw import adamw as torch_adamw

    from tests.unit.test_solo_engine import DeviceWaits

    config = AdamWConfig(lr=0.01, weight_decay=0.1)
    for fused in (True, False):
        model, ref = _model(0), _model(0)
        opt = AdamW(model.named_parameters(), config)
        opt.fused = None if fused else False
        names = [n for n, _ in ref.named_parameters()]
        avg = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
        avg_sq = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
        count = 0
        for step in range(7):
            if step == 4:  # a resume at another step count: the kept counts are set to it
                opt.load_state_tensors(opt.state_tensors(), 10)
                count = 10
            gen = torch.Generator().manual_seed(200 + step)
            x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
                ((m(x) - y) ** 2).mean().backward()
                if step == 2:  # the last bias has no gradient on this step
                    m[2].bias.grad = None
            waits = DeviceWaits()
            with waits:
                opt.step(config.lr)
            if fused and step > 0:  # (torch's own foreach path makes one for CPU counts only)
                assert waits.seen == [], step
            with torch.no_grad():
                have = [n for n, p in ref.named_parameters() if p.grad is not None]
                params = dict(ref.named_parameters())
                torch_adamw(
                    [params[n] for n in have],
                    [params[n].grad for n in have],  # type: ignore[misc]
                    [avg[n] for n in have],
                    [avg_sq[n] for n in have],
                    [],
                    [torch.tensor(float(count)) for _ in have],
                    foreach=not fused,
                    fused=fused,
                    amsgrad=False,
                    beta1=config.beta1,
                    beta2=config.beta2,
                    lr=config.lr,
                    weight_decay=config.weight_decay,
                    eps=config.eps,
                    maximize=False,
                )
            count += 1
            for n, a, b in zip(names, model.parameters(), ref.parameters(), strict=True):
                assert torch.equal(a, b), (fused, step, n)
        assert opt.fused is fused and opt.step_count == 13


def test_global_clipping_over_split_parameters_matches_clip_grad_norm() -> None:
    for max_norm in (0.05, 1e3):
        full, split = _model(3), _model(3)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
        full(x).pow(2).sum().backward()
        split(x).pow(2).sum().backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(full.parameters(), max_norm)
        stages = [list(split[0].parameters()), list(split[2].parameters())]
        from arceusd.worker.optim import local_grad_sq_norm

        total = sum(local_grad_sq_norm(p) for p in stages)
        norms = [clip_grad_norm_global(p, p, max_norm, reduce=_constant(total)) for p in stages]
        assert norms[0] == pytest.approx(float(ref_norm), rel=1e-6) and norms[0] == norms[1]
        for a, b in zip(split.parameters(), full.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)


def test_lr_schedule_warmup_peak_cosine_floor() -> None:
    s = LRSchedule(max_lr=1.0, min_lr=0.1, warmup_steps=4, decay_steps=14)
    warm = [s(i) for i in range(4)]
    assert warm == sorted(warm) and warm[-1] < 1.0
    assert s(4) == pytest.approx(1.0)
    assert s(9) == pytest.approx(0.1 + 0.5 * 0.9)
    decay = [s(i) for i in range(4, 15)]
    assert decay == sorted(decay, reverse=True)
    assert s(14) == pytest.approx(0.1) and s(100) == 0.1
    assert LRSchedule(max_lr=0.3)(1000) == 0.3
    with pytest.raises(ValueError):
        LRSchedule(max_lr=1.0, warmup_steps=5, decay_steps=5)
    assert math.isfinite(s(0))


def test_micro_batches_cover_batch_and_last_is_smaller() -> None:
    assert micro_batch_sizes(10, 4) == [3, 3, 2, 2]
    for b in range(1, 20):
        for m in range(1, b + 1):
            sizes = micro_batch_sizes(b, m)
            assert sum(sizes) == b and min(sizes) >= 1 and len(sizes) == m
    t = torch.arange(10)
    assert torch.equal(torch.cat(split_micro_batches(t, 3)), t)
    with pytest.raises(ValueError):
        micro_batch_sizes(3, 4)


def test_the_gradient_norm_reads_back_to_the_host_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read per tensor stalled a GPU stage once per parameter every step: one read for all of them."""
    from arceusd.worker.optim import local_grad_sq_norm

    model = _model(6)
    model(torch.randn(4, 6, generator=torch.Generator().manual_seed(3))).pow(2).sum().backward()
    params = list(model.parameters())
    assert len(params) == 4
    expected = sum(float(p.grad.double().square().sum()) for p in params if p.grad is not None)
    reads = 0
    item = torch.Tensor.item

    def counted(self: torch.Tensor) -> object:
        nonlocal reads
        reads += 1
        return item(self)

    monkeypatch.setattr(torch.Tensor, "item", counted)
    total = local_grad_sq_norm(params)
    assert reads == 1
    assert total == pytest.approx(expected, rel=1e-6)
