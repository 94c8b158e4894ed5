"""``split_backward``: the input's half and the weights' half of a backward equal one whole backward, and the
weights' half runs no node of the input's path again."""

from __future__ import annotations

import pytest
import torch

from arceusd.models.build import build_blocks, loss_sum
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.worker.split_backward import backward_input

GPT = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=20, dropout=0.0)


def _stage(config: GPTConfig | MLPConfig, start: int, end: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(*build_blocks(config, 3, start, end))


def _whole_and_split(
    stage: torch.nn.Module, x: torch.Tensor, root_of: object, seed_grad: torch.Tensor | None
) -> tuple[list[torch.Tensor], torch.Tensor | None, list[torch.Tensor], torch.Tensor | None]:
    params = list(stage.parameters())
    outs = []
    for split in (False, True):
        stage.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_(x.is_floating_point())
        root = root_of(stage(xi))  # type: ignore[operator]
        if split:
            gx, pending = backward_input(root, seed_grad, xi, params)
            assert all(p.grad is None for p in params)  # nothing of the weights' half yet
            pending.run()
        else:
            torch.autograd.backward(root, seed_grad)
            gx = xi.grad
        outs.append(([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params], gx))
    (wg, wx), (sg, sx) = outs
    return wg, wx, sg, sx


def test_a_middle_gpt_stage_splits_into_the_same_gradients_bit_for_bit() -> None:
    stage = _stage(GPT, 1, 3)  # two transformer blocks: attention, layer norms, MLP
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, 32, generator=gen)
    g = torch.randn(3, 16, 32, generator=gen)
    whole, whole_x, split, split_x = _whole_and_split(stage, x, lambda y: y, g)
    assert whole_x is not None and split_x is not None and torch.equal(whole_x, split_x)
    for a, b in zip(whole, split, strict=True):
        assert torch.equal(a, b)
    assert all(a.abs().sum() > 0 for a in whole)


def test_a_last_stage_from_its_loss_and_an_mlp() -> None:
    gen = torch.Generator().manual_seed(1)
    stage = _stage(GPT, 2, 4)  # a block and the head: the root is the scalar loss
    targets = torch.randint(0, 20, (2, 16), generator=gen)
    whole, wx, split, sx = _whole_and_split(
        stage, torch.randn(2, 16, 32, generator=gen), lambda y: loss_sum(y, targets), None
    )
    assert wx is not None and sx is not None and torch.equal(wx, sx)
    assert all(torch.equal(a, b) for a, b in zip(whole, split, strict=True))
    mlp = MLPConfig(layer_sizes=(6, 5, 4, 3))
    mlp_stage = _stage(mlp, 1, 3)
    y = torch.randint(0, 3, (4,), generator=gen)
    whole, wx, split, sx = _whole_and_split(mlp_stage, torch.randn(4, 5, generator=gen), lambda o: loss_sum(o, y), None)
    assert wx is not None and sx is not None and torch.equal(wx, sx)
    assert all(torch.equal(a, b) for a, b in zip(whole, split, strict=True))


def test_the_weights_half_accumulates_into_existing_gradients_and_runs_once() -> None:
    stage = _stage(GPT, 1, 2)
    params = list(stage.parameters())
    gen = torch.Generator().manual_seed(2)
    x, g = torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen)
    stage(x).backward(g)  # micro-batch 0, whole
    first = [p.grad.clone() for p in params if p.grad is not None]
    xi = x.clone().requires_grad_(True)
    _, pending = backward_input(stage(xi), g, xi, params)
    pending.run()
    assert all(torch.equal(p.grad, 2 * f) for p, f in zip(params, first, strict=True) if p.grad is not None)
    with pytest.raises(RuntimeError, match="already computed"):
        pending.run()


def test_a_first_stage_has_no_input_half_and_a_detached_input_is_refused() -> None:
    stage = _stage(GPT, 0, 2)  # the embedding: token ids need no gradient
    params = list(stage.parameters())
    tokens = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(3))
    y = stage(tokens)
    gx, pending = backward_input(y, torch.ones_like(y), tokens, params)
    assert gx is None and all(p.grad is None for p in params)
    pending.run()
    assert all(p.grad is not None for p in params)
    other = torch.randn(2, 16, 32, requires_grad=True)
    mid = _stage(GPT, 1, 2)
    out = mid(torch.randn(2, 16, 32))
    with pytest.raises(ValueError, match="does not reach"):
        backward_input(out, torch.ones_like(out), other, list(mid.parameters()))


def test_the_weights_half_recomputes_no_input_gradient() -> None:
    """Count the matrix products: the two halves together run as many as one whole backward (a rerun of the
    backward for the weights would run the input path's again)."""
    stage = _stage(GPT, 1, 3)
    params = list(stage.parameters())
    gen = torch.Generator().manual_seed(4)
    x, g = torch.randn(2, 16, 32, generator=gen), torch.randn(2, 16, 32, generator=gen)

    def count_mm(fn: object) -> int:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()  # type: ignore[operator]
        return sum(1 for e in prof.events() if e.name in ("aten::mm", "aten::bmm", "aten::addmm"))

    xi = x.clone().requires_grad_(True)
    y = stage(xi)
    whole = count_mm(lambda: y.backward(g))
    xi = x.clone().requires_grad_(True)
    y = stage(xi)
    holder: dict[str, object] = {}
    first = count_mm(lambda: holder.update(p=backward_input(y, g, xi, params)[1]))
    second = count_mm(lambda: holder["p"].run())  # type: ignore[attr-defined]
    assert first > 0 and second > 0
    assert first + second == whole
