"""Deterministic, per-block parameter initialisation.

Every block is initialised from its own ``torch.Generator`` seeded by ``(model seed, block index)``. So
a stage that builds only blocks ``[start, end)`` gets exactly the tensors a single process building the
whole model with the same seed gets, without ever materialising the other blocks, and without touching
torch's global RNG.
Modules are first created on the ``meta`` device (no allocation, no global RNG draw) and then materialised.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

_SEED_MIX = 1_000_003
_SEED_MOD = 2**63 - 1


def block_generator(seed: int, index: int) -> torch.Generator:
    """The RNG that initialises block ``index`` of a model built with ``seed``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed((seed * _SEED_MIX + index + 1) % _SEED_MOD)
    return gen


def materialize(factory: Callable[[], M]) -> M:
    """Build a module on the meta device, then give it real (uninitialised) CPU storage."""
    with torch.device("meta"):
        module = factory()
    return module.to_empty(device="cpu")


@torch.no_grad()
def fill_normal(t: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """Fill ``t`` with N(0, std^2) draws from ``gen``."""
    t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * std)


@torch.no_grad()
def fill_uniform(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    """Fill ``t`` with U(-bound, bound) draws from ``gen``."""
    t.copy_((torch.rand(t.shape, generator=gen, dtype=t.dtype) * 2.0 - 1.0) * bound)


@torch.no_grad()
def init_linear_default(layer: nn.Linear, gen: torch.Generator) -> None:
    """PyTorch's default ``nn.Linear`` init (U(+-1/sqrt(fan_in)) for weight and bias), drawn from ``gen``."""
    bound = 1.0 / math.sqrt(layer.in_features) if layer.in_features > 0 else 0.0
    fill_uniform(layer.weight, bound, gen)
    if layer.bias is not None:
        fill_uniform(layer.bias, bound, gen)


@torch.no_grad()
def init_layer_norm(norm: nn.LayerNorm) -> None:
    """LayerNorm: weight 1, bias 0."""
    if norm.weight is not None:
        norm.weight.fill_(1.0)
    if norm.bias is not None:
        norm.bias.zero_()
