"""Block costs of a LoRA job for the partitioner (torch-free; conventions of ``arceusd.models.costs``).

The base model's costs (:func:`arceusd.models.hf.costs.hf_block_costs`) changed where freezing changes them:

- memory: the base's parameters are held (``param_bytes``, at the planner's dtype: an upper bound when the base is
  held in bf16), the adapters' added; gradient and optimizer state only for the adapters (``optimizer_bytes``);
  activations and their stash as in full training (the adapters still need the inputs of their layers, and the
  frozen layers' input gradients need what autograd keeps);
- compute: the forward adds each adapter's two thin matmuls (2 FLOPs per multiply-add, over the block's
  tokens); the backward of a frozen matmul computes only its input's gradient (1x its forward, no weight
  gradient), attention's QK^T and AV still 2x, the adapters 2x theirs; the embeddings need no backward at all
  (nothing before them trains);
- tensor parallelism: a split layer's adapters split with it (``arceusd/worker/hf_tensor_parallel.py``) and add
  no all-reduce, only ``r`` values per token and adapted projection to the sub-layer's: not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.costs import hf_block_costs
from arceusd.models.hf.lora_keys import lora_param_count
from partitioner.blocks import BlockCost


def lora_block_costs(
    config: HFModelConfig, dtype_bytes: int, optimizer_bytes: Callable[[int], int], index_bytes: int = 8
) -> list[BlockCost]:
    """One cost per block of the LoRA job ``config`` (``config.lora`` set)."""
    base = hf_block_costs(replace(config, lora=None), dtype_bytes, optimizer_bytes, index_bytes)
    T = config.block_size
    attention = 4.0 * T * T * config.n_head * config.head_dim  # QK^T and AV, forward, per decoder layer
    out: list[BlockCost] = []
    for i, cost in enumerate(base):
        adapters = lora_param_count(config, i)
        adapter_flops = 2.0 * adapters * T
        if i == 0:
            backward = 0.0
        elif i == len(base) - 1:
            backward = cost.forward_flops_per_sample  # the head's input gradient
        else:
            matmul = cost.forward_flops_per_sample - attention
            backward = matmul + 2.0 * attention + 2.0 * adapter_flops
        out.append(
            replace(
                cost,
                param_bytes=cost.param_bytes + adapters * dtype_bytes,
                optimizer_bytes=optimizer_bytes(adapters * dtype_bytes),
                forward_flops_per_sample=cost.forward_flops_per_sample + adapter_flops,
                backward_flops_per_sample=backward,
            )
        )
    return out


__all__ = ["lora_block_costs"]
