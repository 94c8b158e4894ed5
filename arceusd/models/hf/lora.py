"""LoRA on one block of a stock causal LM: peft's adapters injected, drawn from the block's own RNG, the base
frozen (workers and the export child only).

Owns: :func:`add_lora`, :func:`freeze_base` and :func:`hold_base`.

Why peft, per block: ``peft.inject_adapter_in_model`` works on any ``nn.Module``, so each Arceus block (a
``LlamaDecoderLayer`` wrapped as ``layer``) gets peft's own ``lora.Linear`` / Conv1D layers (the same forward,
scaling and dropout as ``get_peft_model`` on the whole model, and peft's tensor names, which the export keeps)
without building the whole model in one process. peft's random initialisation draws from torch's global RNG,
so the adapters are drawn again here from a generator of the job's seed and the block: ``lora_A`` as peft does
(U(+-1/sqrt(in)), its kaiming-uniform with a = sqrt(5)), ``lora_B`` zero, so the adapted model starts as the base.

Frozen means not a parameter: every base tensor becomes a buffer of its module, so ``parameters()`` is the
adapters alone and everything that walks it (the optimizer, the gradient norm, the replicas' all-reduce and
DiLoCo, checkpoint shards, re-slicing, the leader's shard checks) sees only the adapters, with no change to that
code. The buffers are rebuilt from the job's initial weights (or seed) whenever a block is built.

Precision: the base is held in fp32, or, in a job trained with bf16 autocast (``training.precision = "bf16"``),
its matmul weights in bf16 (:func:`hold_base`): the values autocast would compute with anyway, in half the
memory. On the CPU that is the job's choice as well (fp32 by default).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.lora_keys import adapted_modules, lora_tensors
from arceusd.models.init import block_generator, fill_uniform


def _is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def add_lora(block: nn.Module, config: HFModelConfig, index: int, seed: int) -> nn.Module:
    """Inject block ``index``'s adapters (none outside the decoder layers), initialise them from ``(seed,
    index)`` and freeze the rest; returns ``block`` (changed in place)."""
    lora = config.lora
    if lora is None:
        return block
    modules = adapted_modules(config, index)
    if modules:
        from peft import LoraConfig, inject_adapter_in_model  # imported only by LoRA jobs' workers

        peft_config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(modules),
            fan_in_fan_out=config.is_gpt2,
            bias="none",
        )
        inject_adapter_in_model(peft_config, block)
        _init(block, block_generator(seed, num_hf_blocks(config) + index))  # not any block's own stream
    freeze_base(block)
    got = {k: tuple(p.shape) for k, p in block.named_parameters()}
    expected = lora_tensors(config, index)
    if got != expected:  # peft built other tensors than lora_keys.py names: a peft version we do not know
        raise RuntimeError(f"block {index}: peft built the adapters {got}, Arceus expects {expected}")
    return block


@torch.no_grad()
def _init(block: nn.Module, gen: torch.Generator) -> None:
    for name, p in block.named_parameters():  # definition order: deterministic
        if ".lora_A." in name:
            fill_uniform(p, 1.0 / math.sqrt(p.shape[1]), gen)
        elif ".lora_B." in name:
            p.zero_()


def freeze_base(block: nn.Module) -> None:
    """Every parameter but the adapters becomes a buffer of its module (same name, same tensor)."""
    for prefix, module in block.named_modules():
        for name, p in list(module._parameters.items()):
            if p is None or _is_adapter(f"{prefix}.{name}" if prefix else name):
                continue
            del module._parameters[name]
            module.register_buffer(name, p.detach().requires_grad_(False))


def _matmul_module(module: nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D  # transformers: only LoRA jobs' workers

    # a tensor-parallel rank's row-parallel projection says so (``matmul_weight``: hf_tensor_parallel.py)
    return isinstance(module, nn.Linear | Conv1D) or bool(getattr(module, "matmul_weight", False))


@torch.no_grad()
def hold_base(module: nn.Module, dtype: torch.dtype) -> int:
    """Hold the frozen matmul weights of ``module`` (the base layers' and the LM head's) in ``dtype``; the
    adapters, norms, embeddings and biases keep theirs. Returns the bytes saved."""
    saved = 0
    for sub in module.modules():
        weight = sub._buffers.get("weight")
        if weight is not None and weight.is_floating_point() and _matmul_module(sub) and weight.dtype != dtype:
            cast = weight.to(dtype)
            saved += weight.numel() * weight.element_size() - cast.numel() * cast.element_size()
            sub._buffers["weight"] = cast
    return saved


__all__ = ["add_lora", "freeze_base", "hold_base"]
