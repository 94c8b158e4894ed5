"""The MLP as placeable blocks: one block per ``nn.Linear``, ReLU between layers, none after the last.

Block 0 flattens its input, so images ``(B, 1, 28, 28)`` and vectors ``(B, 784)`` both work.
"""

from __future__ import annotations

import torch
from torch import nn

from arceusd.models.config import MLPConfig
from arceusd.models.init import block_generator, init_linear_default, materialize


class MLPLayer(nn.Module):
    """One Linear (+ ReLU unless it is the last layer)."""

    def __init__(self, in_features: int, out_features: int, relu: bool, flatten: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.relu = relu
        self.flatten = flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flatten:
            x = x.flatten(1)  # (B, *) -> (B, in)
        x = self.fc(x)  # (B, in) -> (B, out)
        return torch.relu(x) if self.relu else x


def mlp_num_blocks(config: MLPConfig) -> int:
    """Number of placeable blocks (one per Linear)."""
    return len(config.layer_sizes) - 1


def build_mlp_block(config: MLPConfig, index: int, seed: int) -> MLPLayer:
    """Block ``index`` of the MLP, initialised deterministically from ``(seed, index)``."""
    n = mlp_num_blocks(config)
    if not 0 <= index < n:
        raise ValueError(f"MLP block index {index} out of range: the model has {n} blocks")
    fan_in, fan_out = config.layer_sizes[index], config.layer_sizes[index + 1]
    layer = materialize(lambda: MLPLayer(fan_in, fan_out, relu=index < n - 1, flatten=index == 0))
    init_linear_default(layer.fc, block_generator(seed, index))
    return layer
