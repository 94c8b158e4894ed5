"""Declarative model configs, as named by job specs. A job never ships code: only these fields.

Validation of user input happens in ``arceusd/jobs/spec/schema.py``; these constructors check invariants and raise
``ValueError`` with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.models.hf.config import HFModelConfig


@dataclass(frozen=True)
class MLPConfig:
    """A multi-layer perceptron: ``layer_sizes`` [in, hidden..., out], ReLU between layers, one block per Linear."""

    layer_sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.layer_sizes) < 2:
            raise ValueError("mlp.layer_sizes needs at least an input and an output size, e.g. [784, 128, 64, 10]")
        if any(s <= 0 for s in self.layer_sizes):
            raise ValueError(f"mlp.layer_sizes must all be positive, got {list(self.layer_sizes)}")


@dataclass(frozen=True)
class GPTConfig:
    """A nanoGPT-style decoder: token+position embedding, ``n_layer`` pre-norm blocks, final norm, LM head."""

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"gpt.{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"gpt.n_embd ({self.n_embd}) must be divisible by gpt.n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"gpt.dropout must be in [0, 1), got {self.dropout}")


ModelConfig = MLPConfig | GPTConfig | HFModelConfig
"""``HFModelConfig``: a stock ``transformers`` causal LM (``arceusd/models/hf/``)."""
