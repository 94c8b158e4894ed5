"""The model as the partitioner sees it: an ordered list of block costs.

Models (``arceusd/models``) produce these from their configs; the partitioner never sees a torch module.
All sizes are bytes, all FLOPs are per sample (one sequence for a GPT, one image for an MLP).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockCost:
    """Cost of one placeable block.

    ``heads`` is the attention head count for a block with attention (tensor-parallel split unit), else 0.
    ``mlp_columns`` is the hidden width of the block's column-parallel MLP (split unit), else 0. A block with
    both 0 is not tensor-parallelisable (embeddings, heads, plain MLP layers) and is placed on one device.
    ``activation_bytes_per_sample`` is the size of the block's *output* (what crosses a stage boundary after it);
    ``stash_bytes_per_sample`` what it keeps for backward per in-flight micro-batch sample.
    """

    name: str
    param_bytes: int
    optimizer_bytes: int
    activation_bytes_per_sample: int
    stash_bytes_per_sample: int
    forward_flops_per_sample: float
    backward_flops_per_sample: float
    heads: int = 0
    mlp_columns: int = 0

    def __post_init__(self) -> None:
        for field_name in (
            "param_bytes",
            "optimizer_bytes",
            "activation_bytes_per_sample",
            "stash_bytes_per_sample",
            "heads",
            "mlp_columns",
        ):
            if getattr(self, field_name) < 0:
                raise ValueError(f"block {self.name!r}: {field_name} must be >= 0")
        if self.forward_flops_per_sample < 0 or self.backward_flops_per_sample < 0:
            raise ValueError(f"block {self.name!r}: FLOPs must be >= 0")
