"""Megatron tensor parallelism: shard/gather round trips, exact fwd/bwd, one all-reduce per sub-layer."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from arceusd.models.build import build_blocks
from arceusd.models.config import GPTConfig
from arceusd.models.gpt import TransformerBlock
from arceusd.worker.collective import CollectiveTimeout, InMemoryAllReduce, TimedCollective
from arceusd.worker.tensor_parallel import (
    TPSplit,
    TPTransformerBlock,
    even_split,
    gather_transformer_block,
    is_sharded,
    shard_transformer_block,
)

GPT = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)
SPLITS = [
    TPSplit((2, 2), (64, 64)),
    TPSplit((3, 1), (96, 32)),
    TPSplit((1, 2, 1), (16, 100, 12)),
    TPSplit((4,), (128,)),
]


def prefixed(name: str) -> Callable[[str], str]:
    """An ``assert_close`` message that names the parameter ``name``."""
    return lambda message: f"{name}: {message}"


def _full_block() -> TransformerBlock:
    block = build_blocks(GPT, 3, 1, 2)[0]
    assert isinstance(block, TransformerBlock)
    return block


@pytest.mark.parametrize("split", SPLITS)
def test_shard_then_gather_round_trips(split: TPSplit) -> None:
    full = _full_block()
    group = InMemoryAllReduce(split.world_size)
    shards = [shard_transformer_block(full, GPT, split, r, group.rank_view(r)) for r in range(split.world_size)]
    for r, shard in enumerate(shards):
        assert shard.attn.c_attn.weight.shape == (3 * split.heads[r] * 8, 32)
        assert shard.mlp.c_fc.weight.shape == (split.columns[r], 32)
    back = gather_transformer_block(shards, GPT, split)
    for (n, p), (m, q) in zip(back.named_parameters(), full.named_parameters(), strict=True):
        assert n == m and torch.equal(p, q), n
    sharded_elems = sum(p.numel() for s in shards for n, p in s.named_parameters() if is_sharded(n))
    assert sharded_elems == sum(p.numel() for n, p in full.named_parameters() if is_sharded(n))


@pytest.mark.parametrize("split", SPLITS)
def test_tp_block_forward_backward_equals_full_block(split: TPSplit) -> None:
    full = _full_block()
    x = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(0))
    gy = torch.randn(3, 10, 32, generator=torch.Generator().manual_seed(1))
    x_ref = x.clone().requires_grad_(True)
    y_ref = full(x_ref)
    y_ref.backward(gy)
    ref_grads = {n: p.grad for n, p in full.named_parameters()}

    group = InMemoryAllReduce(split.world_size, timeout_s=20)
    colls = [TimedCollective(group.rank_view(r)) for r in range(split.world_size)]
    shards = [shard_transformer_block(full, GPT, split, r, colls[r]) for r in range(split.world_size)]
    outs: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            xr = x.clone().requires_grad_(True)
            y = shards[r](xr)
            fwd_calls = colls[r].calls
            y.backward(gy)
            assert xr.grad is not None
            outs[r] = (y.detach(), xr.grad, fwd_calls)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(split.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert x_ref.grad is not None
    for r in range(split.world_size):
        y, gx, fwd_calls = outs[r]
        torch.testing.assert_close(y, y_ref.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(gx, x_ref.grad, rtol=0, atol=1e-5)
        assert fwd_calls == 2 and colls[r].calls == 4  # one all-reduce per sub-layer, forward and backward
        assert torch.equal(y, outs[0][0]) and torch.equal(gx, outs[0][1])  # replicated results bit-identical
        for n, p in shards[r].named_parameters():
            assert p.grad is not None
            if not is_sharded(n):
                lead_grad = dict(shards[0].named_parameters())[n].grad
                assert lead_grad is not None
                assert torch.equal(p.grad, lead_grad), n
    grad_shards = [TPTransformerBlock(GPT, split.heads[r], split.columns[r], colls[r]) for r in range(split.world_size)]
    with torch.no_grad():
        for r, gs in enumerate(grad_shards):
            src = dict(shards[r].named_parameters())
            for n, p in gs.named_parameters():
                grad = src[n].grad
                assert grad is not None
                p.copy_(grad)
    gathered = dict(gather_transformer_block(grad_shards, GPT, split).named_parameters())
    for n, g in ref_grads.items():
        assert g is not None
        torch.testing.assert_close(gathered[n], g, rtol=0, atol=1e-5, msg=prefixed(n))


def test_split_validation() -> None:
    with pytest.raises(ValueError):
        TPSplit((2, 2), (64,))
    with pytest.raises(ValueError):
        TPSplit((4, 0), (64, 64))
    with pytest.raises(ValueError, match="n_head"):
        TPSplit((3, 2), (64, 64)).check(GPT)
    with pytest.raises(ValueError, match="n_embd"):
        TPSplit((2, 2), (64, 60)).check(GPT)
    s = even_split(GPT, 3)
    assert s.heads == (2, 1, 1) and sum(s.columns) == 128
    s.check(GPT)


def test_in_memory_all_reduce_sums_in_rank_order_and_times_out() -> None:
    group = InMemoryAllReduce(3, timeout_s=10)
    results: dict[int, list[float]] = {}

    def work(r: int) -> None:
        view = group.rank_view(r)
        results[r] = [view.all_reduce_scalar(float(r + k)) for k in range(20)]

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(results[r] == [float(3 + 3 * k) for k in range(20)] for r in range(3))
    lonely = InMemoryAllReduce(2, timeout_s=0.05).rank_view(0)
    with pytest.raises(CollectiveTimeout):
        lonely.all_reduce_sum(torch.ones(2))
