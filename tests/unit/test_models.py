"""Models as blocks: deterministic per-block init, slices equal the full model, costs match modules."""

from __future__ import annotations

import pytest
import torch

from arceusd.models.build import build_blocks, build_reference_model, loss_mean, loss_sum, num_blocks
from arceusd.models.config import GPTConfig, MLPConfig, ModelConfig
from arceusd.models.costs import block_costs
from arceusd.models.gpt import Embedding, Head, TransformerBlock

MLP = MLPConfig((32, 16, 12, 10))
GPT = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)
GPT_NOBIAS = GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=11, bias=False)
CONFIGS: list[ModelConfig] = [MLP, GPT, GPT_NOBIAS]


def _sample(config: ModelConfig, batch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    if isinstance(config, MLPConfig):
        return torch.randn(batch, config.layer_sizes[0], generator=gen)
    assert isinstance(config, GPTConfig)
    return torch.randint(0, config.vocab_size, (batch, config.block_size), generator=gen)


@pytest.mark.parametrize("config", CONFIGS)
def test_slices_equal_full_model_and_init_is_deterministic(config: ModelConfig) -> None:
    rng_before = torch.get_rng_state()
    full = build_reference_model(config, seed=7)
    assert torch.equal(torch.get_rng_state(), rng_before)  # no hidden draw from the global RNG
    n = num_blocks(config)
    assert len(full) == n
    for start in range(n):
        for end in range(start + 1, n + 1):
            part = build_blocks(config, 7, start, end)
            for offset, block in enumerate(part):
                ref = dict(full[start + offset].named_parameters())
                for name, p in block.named_parameters():
                    assert torch.equal(p, ref[name]), (start, end, name)
    other = build_reference_model(config, seed=8)
    assert any(not torch.equal(a, b) for a, b in zip(full.parameters(), other.parameters(), strict=True))
    with pytest.raises(ValueError):
        build_blocks(config, 7, 0, n + 1)


def test_gpt_block_structure_and_causality() -> None:
    blocks = build_blocks(GPT, 0)
    assert isinstance(blocks[0], Embedding) and isinstance(blocks[-1], Head)
    assert all(isinstance(b, TransformerBlock) for b in blocks[1:-1])
    model = build_reference_model(GPT, 0)
    x = _sample(GPT, 2)
    logits = model(x)
    assert logits.shape == (2, GPT.block_size, GPT.vocab_size)
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % GPT.vocab_size  # change only the last token
    logits2 = model(x2)
    torch.testing.assert_close(logits[:, :-1], logits2[:, :-1])
    assert not torch.allclose(logits[:, -1], logits2[:, -1])
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, GPT.block_size + 1, dtype=torch.long))


def test_mlp_has_relu_between_layers_only() -> None:
    blocks = build_blocks(MLP, 0)
    assert len(blocks) == 3
    x = torch.randn(4, 32)
    h = blocks[1](blocks[0](x))
    assert (h >= 0).all()
    out = blocks[2](h)
    assert (out < 0).any()  # the last layer has no ReLU
    assert blocks[0](torch.randn(4, 2, 16)).shape == (4, 16)  # block 0 flattens


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype_bytes", [4, 2])
def test_block_costs_match_the_modules(config: ModelConfig, dtype_bytes: int) -> None:
    blocks = build_blocks(config, 0)
    adamw = block_costs(config, dtype_bytes)
    sgd = block_costs(config, dtype_bytes, optimizer="sgd")
    assert len(adamw) == len(blocks) == len(sgd)
    x = _sample(config, 3)
    for block, cost, sgd_cost in zip(blocks, adamw, sgd, strict=True):
        n_params = sum(p.numel() for p in block.parameters())
        assert cost.param_bytes == n_params * dtype_bytes
        assert cost.optimizer_bytes == 3 * cost.param_bytes  # grad + exp_avg + exp_avg_sq
        assert sgd_cost.optimizer_bytes == 2 * cost.param_bytes  # grad + momentum
        x = block(x)
        assert cost.activation_bytes_per_sample == x[0].numel() * dtype_bytes
        assert cost.forward_flops_per_sample > 0 and cost.backward_flops_per_sample == 2 * cost.forward_flops_per_sample
        assert cost.stash_bytes_per_sample > 0
        if isinstance(block, TransformerBlock):
            assert isinstance(config, GPTConfig)
            assert (cost.heads, cost.mlp_columns) == (config.n_head, 4 * config.n_embd)
        else:
            assert (cost.heads, cost.mlp_columns) == (0, 0)
    with pytest.raises(ValueError):
        block_costs(config, 0)


def test_loss_sum_over_parts_equals_mean_over_batch() -> None:
    model = build_reference_model(GPT, 0)
    x = _sample(GPT, 5)
    y = torch.roll(x, -1, dims=1)
    full = loss_mean(model(x), y)
    parts = sum(loss_sum(model(x[i : i + 2]), y[i : i + 2]) for i in range(0, 5, 2)) / y.numel()
    torch.testing.assert_close(parts, full)
