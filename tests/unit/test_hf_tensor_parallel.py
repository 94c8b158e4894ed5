"""Tensor-parallel shards of stock transformers decoder layers (llama with GQA, qwen2 with q/k/v biases, gpt2's
fused c_attn) equal the unsplit layer: forward, input and parameter gradients, and a few optimizer steps (fp32).

The shards run in threads over the in-memory ``Collective`` the GPT tensor-parallel tests use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from arceusd.models.hf.blocks import HFDecoderBlock, build_hf_block
from arceusd.models.hf.config import HFModelConfig
from arceusd.worker.collective import InMemoryAllReduce, TimedCollective
from arceusd.worker.hf_tensor_parallel import (
    gather_hf_block,
    gather_hf_tensor,
    hf_is_sharded,
    shard_hf_block,
    shard_hf_tensor,
)
from arceusd.worker.hf_tp_split import hf_even_split, hf_split, max_hf_tensor_parallel
from arceusd.worker.tp_split import TPSplit
from tests.unit import hf_cases

TOL = 1e-4
SEED = 11

# llama: 6 heads in 3 KV groups of 2, head_dim 8, 40 MLP columns; qwen2: 4 heads, 4 KV heads (q/k/v biases);
# gpt2: 4 heads of 8, c_attn fused; n_inner 48. Splits uneven where the config allows.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 40},
    "llama_gqa": {},
    "llama_bias": {"attention_bias": True, "mlp_bias": True},
    "qwen2": {"num_key_value_heads": 4},
    "mistral": {},
    "gpt2": {"n_inner": 48},
}
CASES: list[tuple[str, TPSplit]] = [
    ("llama", TPSplit((2, 1), (25, 15))),
    ("llama", TPSplit((1, 1, 1), (10, 20, 10))),
    ("llama_gqa", TPSplit((1, 1), (30, 18))),
    ("llama_bias", TPSplit((1, 1), (24, 24))),
    ("qwen2", TPSplit((3, 1), (13, 27))),
    ("qwen2", TPSplit((1, 2, 1), (10, 10, 20))),
    ("mistral", TPSplit((1, 1), (20, 20))),
    ("gpt2", TPSplit((3, 1), (16, 32))),
    ("gpt2", TPSplit((1, 1, 2), (20, 20, 8))),
]


def _config(name: str) -> HFModelConfig:
    return hf_cases.config(name.split("_")[0], **CONFIGS[name])


def _block(cfg: HFModelConfig, seed: int = SEED) -> HFDecoderBlock:
    """Decoder layer 0 (block 1), initialised from ``seed``."""
    block = build_hf_block(cfg, 1, seed)
    assert isinstance(block, HFDecoderBlock)
    return block


def prefixed(name: str) -> Callable[[str], str]:
    return lambda message: f"{name}: {message}"


def _run_ranks(world: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(r: int) -> None:
        try:
            work(r)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)


def _grads_as_block(shards: Sequence[HFDecoderBlock], cfg: HFModelConfig, split: TPSplit) -> dict[str, torch.Tensor]:
    """Every parameter's gradient gathered over the ranks (replicated ones: rank 0's)."""
    out: dict[str, torch.Tensor] = {}
    per_rank = [dict(s.named_parameters()) for s in shards]
    for name in per_rank[0]:
        grads = [d[name].grad for d in per_rank]
        assert all(g is not None for g in grads), name
        out[name] = gather_hf_tensor(name, [g for g in grads if g is not None], cfg, split)
    return out


@pytest.mark.parametrize(("name", "split"), CASES)
def test_shard_then_gather_round_trips(name: str, split: TPSplit) -> None:
    cfg = _config(name)
    full = _block(cfg)
    group = InMemoryAllReduce(split.world_size)
    shards = [shard_hf_block(full, cfg, split, r, group.rank_view(r)) for r in range(split.world_size)]
    hs = hf_split(split, cfg)
    for r, shard in enumerate(shards):
        params = dict(shard.named_parameters())
        if cfg.is_gpt2:
            assert params["layer.attn.c_attn.weight"].shape == (cfg.hidden, 3 * hs.heads[r] * cfg.head_dim)
            assert params["layer.mlp.c_fc.weight"].shape == (cfg.hidden, split.columns[r])
        else:
            assert params["layer.self_attn.q_proj.weight"].shape == (hs.heads[r] * cfg.head_dim, cfg.hidden)
            assert params["layer.self_attn.k_proj.weight"].shape == (hs.kv_heads[r] * cfg.head_dim, cfg.hidden)
            assert params["layer.mlp.up_proj.weight"].shape == (split.columns[r], cfg.hidden)
    back = gather_hf_block(shards, cfg, split, _block(cfg, seed=SEED + 1))
    for (n, p), (m, q) in zip(back.named_parameters(), full.named_parameters(), strict=True):
        assert n == m and torch.equal(p, q), n
    sharded = sum(p.numel() for s in shards for n, p in s.named_parameters() if hf_is_sharded(n, cfg))
    assert sharded == sum(p.numel() for n, p in full.named_parameters() if hf_is_sharded(n, cfg))
    assert sharded > 0


@pytest.mark.parametrize(("name", "split"), CASES)
def test_tp_layer_forward_backward_and_steps_equal_the_unsplit_layer(name: str, split: TPSplit) -> None:
    cfg = _config(name)
    full = _block(cfg)
    world = split.world_size
    group = InMemoryAllReduce(world, timeout_s=30)
    colls = [TimedCollective(group.rank_view(r)) for r in range(world)]
    shards = [shard_hf_block(full, cfg, split, r, colls[r]) for r in range(world)]
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, hf_cases.BLOCK, cfg.hidden, generator=gen) for _ in range(3)]
    gys = [torch.randn(2, hf_cases.BLOCK, cfg.hidden, generator=gen) for _ in range(3)]

    # the reference: the unsplit layer, three SGD steps on the same inputs and output gradients. (Not AdamW: it
    # scales gpt2's key bias, whose true gradient is 0 (softmax ignores a shift), from rounding noise to a full
    # step, so two exact computations that round differently move it apart by up to the learning rate.)
    ref_opt = torch.optim.SGD(full.parameters(), lr=0.1, momentum=0.9)
    ref: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
    for x, gy in zip(xs, gys, strict=True):
        ref_opt.zero_grad()
        xr = x.clone().requires_grad_(True)
        y = full(xr)
        y.backward(gy)
        assert xr.grad is not None
        ref.append((y.detach(), xr.grad, {n: p.grad.clone() for n, p in full.named_parameters() if p.grad is not None}))
        ref_opt.step()

    outs: dict[int, list[tuple[torch.Tensor, torch.Tensor, int]]] = {r: [] for r in range(world)}
    grads: list[dict[str, torch.Tensor]] = []
    barrier = threading.Barrier(world)

    def work(r: int) -> None:
        opt = torch.optim.SGD(shards[r].parameters(), lr=0.1, momentum=0.9)
        for x, gy in zip(xs, gys, strict=True):
            opt.zero_grad()
            xr = x.clone().requires_grad_(True)
            y = shards[r](xr)
            fwd = colls[r].calls
            y.backward(gy)
            assert xr.grad is not None
            outs[r].append((y.detach(), xr.grad, colls[r].calls - fwd))
            barrier.wait()
            if r == 0:
                grads.append(_grads_as_block(shards, cfg, split))
            barrier.wait()
            opt.step()

    _run_ranks(world, work)
    assert colls[0].calls == 3 * 4  # per step: one all-reduce per sub-layer forward, one backward
    for step, (y_ref, gx_ref, g_ref) in enumerate(ref):
        for r in range(world):
            y, gx, bwd_calls = outs[r][step]
            assert bwd_calls == 2
            torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL)
            torch.testing.assert_close(gx, gx_ref, rtol=0, atol=TOL)
            assert torch.equal(y, outs[0][step][0]) and torch.equal(gx, outs[0][step][1])  # bit-identical ranks
        assert set(grads[step]) == set(g_ref)
        for n, g in g_ref.items():
            torch.testing.assert_close(grads[step][n], g, rtol=0, atol=TOL, msg=prefixed(f"step {step} {n}"))
    weights = gather_hf_block(shards, cfg, split, _block(cfg, seed=SEED + 1))
    moved = 0.0
    initial = dict(_block(cfg).named_parameters())
    for (n, p), (m, q) in zip(weights.named_parameters(), full.named_parameters(), strict=True):
        assert n == m
        torch.testing.assert_close(p, q, rtol=0, atol=TOL, msg=prefixed(n))
        moved = max(moved, float((q - initial[n]).detach().abs().max()))
    assert moved > 1e-3  # the steps did move the weights
    for r in range(1, world):  # replicated parameters stay bit-identical across ranks
        lead = dict(shards[0].named_parameters())
        for n, p in shards[r].named_parameters():
            if not hf_is_sharded(n, cfg):
                assert torch.equal(p, lead[n]), n


def test_split_checks_against_the_hf_config() -> None:
    """For these models a split counts key/value heads (whole GQA groups), each with its query heads."""
    llama = _config("llama")  # 6 heads, 3 KV groups of 2, 40 columns
    hs = hf_split(TPSplit((2, 1), (25, 15)), llama)
    assert (hs.heads, hs.kv_heads, hs.columns) == ((4, 2), (2, 1), (25, 15))
    assert hs.as_split() == TPSplit((2, 1), (25, 15))
    with pytest.raises(ValueError, match="3 KV heads"):
        hf_split(TPSplit((4, 2), (20, 20)), llama)  # query heads are not the unit
    with pytest.raises(ValueError, match="40 hidden columns"):
        hf_split(TPSplit((2, 1), (20, 21)), llama)
    assert max_hf_tensor_parallel(llama) == 3
    assert hf_even_split(llama, 2) == TPSplit((2, 1), (20, 20))
    with pytest.raises(ValueError, match="splits over"):
        hf_even_split(llama, 4)
    qwen_mqa = hf_cases.config("qwen2")  # one KV head: no split
    assert max_hf_tensor_parallel(qwen_mqa) == 1
    gpt2 = _config("gpt2")
    assert hf_even_split(gpt2, 3) == TPSplit((2, 1, 1), (16, 16, 16))
    full = _block(llama)
    group = InMemoryAllReduce(2)
    with pytest.raises(ValueError, match="collective is rank"):
        shard_hf_block(full, llama, TPSplit((2, 1), (25, 15)), 1, group.rank_view(0))


def test_tensor_shard_by_name_covers_the_layers_split_tensors() -> None:
    """By name, as checkpoints use it: gpt2's c_attn takes each rank's heads from each of q, k and v."""
    cfg = _config("gpt2")
    split = TPSplit((3, 1), (16, 32))
    C, hd = cfg.hidden, cfg.head_dim
    full = torch.arange(C * 3 * C, dtype=torch.float32).reshape(C, 3 * C)
    part = shard_hf_tensor("layer.attn.c_attn.weight", full, cfg, split, 1)
    expected = torch.cat([full[:, s * C + 3 * hd : s * C + 4 * hd] for s in range(3)], dim=1)
    assert torch.equal(part, expected)
    parts = [shard_hf_tensor("layer.attn.c_attn.weight", full, cfg, split, r) for r in range(2)]
    assert torch.equal(gather_hf_tensor("layer.attn.c_attn.weight", parts, cfg, split), full)
    assert not hf_is_sharded("layer.attn.c_proj.bias", cfg)
    assert hf_is_sharded("layer.self_attn.k_proj.bias", _config("qwen2"))
