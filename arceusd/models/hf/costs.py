"""Block costs of a stock causal LM for the partitioner (torch-free; conventions of ``arceusd.models.costs``).

Parameters come from :mod:`arceusd.models.hf.keys` (exact), activations are the hidden states (B, T, C) between
blocks and the logits after the head, FLOPs are 2 per multiply-add of the matrices plus attention's QK^T and AV.
A decoder layer's tensor-parallel split units (``arceusd/worker/hf_tensor_parallel.py``): ``heads`` counts its
key/value heads (a rank holds whole grouped-query groups, each with its query heads; a model with one KV head
does not split) and ``mlp_columns`` its MLP hidden width; the partitioner's share of a layer on a rank is its
fraction of these, and a split layer all-reduces its (B, T, C) output twice forward and twice backward. The
embedding and the head stay whole (0, 0). Whether a job's planner may split at all is
:func:`arceusd.worker.hf_tp_split.planner_tensor_parallel`.

Tied embeddings: the head counts its own copy of the tied weight (parameters, gradient and optimizer state),
which it holds in every plan of two stages or more (``arceusd/worker/tied.py``); a one-stage plan shares one
tensor, so there the head's copy is over-counted (memory errs on the safe side). The gradient exchange between
the first and the last stage (``V x C`` fp32 values each way, once per step) is not in the predicted step
time: the partitioner's link costs are per stage boundary only.
"""

from __future__ import annotations

from collections.abc import Callable

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import block_tensors, param_count
from partitioner.blocks import BlockCost


def _matmul_params(config: HFModelConfig, index: int) -> int:
    total = 0
    for name, shape in block_tensors(config, index).items():
        if len(shape) == 2 and "embed" not in name and not name.startswith(("wte", "wpe")):
            total += shape[0] * shape[1]
    return total


def hf_block_costs(
    config: HFModelConfig, dtype_bytes: int, optimizer_bytes: Callable[[int], int], index_bytes: int = 8
) -> list[BlockCost]:
    """One cost per block; ``optimizer_bytes(param_bytes)`` is the caller's rule for gradient + state."""
    T, C, V, n = config.block_size, config.hidden, config.vocab_size, num_hf_blocks(config)
    attn_width = config.n_head * config.head_dim
    costs: list[BlockCost] = []
    for i in range(n):
        params = param_count(config, i) * dtype_bytes
        matmul = 2.0 * _matmul_params(config, i) * T
        if i == n - 1 and config.tied:  # the head's copy of the tied weight (module docstring)
            params += V * C * dtype_bytes
            matmul = 2.0 * C * V * T
        if i == 0:
            name, out_bytes, stash, fwd = "embedding", T * C * dtype_bytes, T * index_bytes, float(T * C)
        elif i == n - 1:
            name, out_bytes, stash, fwd = "head", T * V * dtype_bytes, (2 * T * C + T * V) * dtype_bytes, matmul
        else:
            name, out_bytes = f"layer{i - 1}", T * C * dtype_bytes
            fwd = matmul + 4.0 * T * T * attn_width
            # inputs of each matmul and norm, q/k/v, the MLP's hidden (x3 for gated ones), attention weights
            stash = (8 * T * C + 3 * T * config.intermediate + config.n_head * T * T) * dtype_bytes
        layer = 0 < i < n - 1
        costs.append(
            BlockCost(
                name=name,
                param_bytes=params,
                optimizer_bytes=optimizer_bytes(params),
                activation_bytes_per_sample=out_bytes,
                stash_bytes_per_sample=stash,
                forward_flops_per_sample=fwd,
                backward_flops_per_sample=2.0 * fwd,
                heads=config.n_kv_head if layer else 0,
                mlp_columns=config.intermediate if layer else 0,
            )
        )
    return costs


__all__ = ["hf_block_costs"]
