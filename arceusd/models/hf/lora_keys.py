"""The adapters of a LoRA job, by block: their local names, shapes and peft's checkpoint keys (torch-free).

Owns: :func:`adapted_modules` (the linear layers of block ``index`` that carry an adapter, with their input and
output widths), :func:`lora_tensors` (the block's trainable tensors: local name -> shape, the names
:mod:`arceusd.models.hf.lora` builds with peft, ``layer.self_attn.q_proj.lora_A.default.weight``),
:func:`lora_blocks` (the blocks holding any) and :func:`peft_key` (the key peft saves the tensor under in
``adapter_model.safetensors``: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``).

Shapes are peft's: ``lora_A`` (r, in), ``lora_B`` (out, r), whatever the base layer's layout (a Llama linear's
weight is (out, in), GPT-2's Conv1D's (in, out)).
"""

from __future__ import annotations

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import Shape, block_tensors, hf_key
from arceusd.models.hf.lora_spec import matched_paths

ADAPTER = "default"
"""peft's adapter name inside the modules (``lora_A.default``); dropped from the saved keys, as peft does."""
PEFT_PREFIX = "base_model.model."


def adapted_modules(config: HFModelConfig, index: int) -> dict[str, tuple[int, int]]:
    """Local module path (``layer.self_attn.q_proj``) -> (in, out) features, for block ``index``; empty without
    LoRA and for the embeddings and the head."""
    if config.lora is None or not 0 < index < num_hf_blocks(config) - 1:
        return {}
    tensors = block_tensors(config, index)
    out: dict[str, tuple[int, int]] = {}
    for path in matched_paths(config.model_type, config.lora.targets):
        rows, cols = tensors[f"layer.{path}.weight"]
        out[f"layer.{path}"] = (rows, cols) if config.is_gpt2 else (cols, rows)  # Conv1D: (in, out)
    return out


def lora_tensors(config: HFModelConfig, index: int) -> dict[str, Shape]:
    """Block ``index``'s trainable tensors under LoRA: local name -> shape."""
    assert config.lora is not None or not adapted_modules(config, index)
    r = config.lora.r if config.lora is not None else 0
    out: dict[str, Shape] = {}
    for module, (fan_in, fan_out) in adapted_modules(config, index).items():
        out[f"{module}.lora_A.{ADAPTER}.weight"] = (r, fan_in)
        out[f"{module}.lora_B.{ADAPTER}.weight"] = (fan_out, r)
    return out


def lora_blocks(config: HFModelConfig) -> set[int]:
    """The blocks that hold adapters (every decoder layer, when a target matches)."""
    return {i for i in range(num_hf_blocks(config)) if adapted_modules(config, i)}


def lora_param_count(config: HFModelConfig, index: int) -> int:
    total = 0
    for shape in lora_tensors(config, index).values():
        total += shape[0] * shape[1]
    return total


def peft_key(config: HFModelConfig, index: int, local: str) -> str:
    """peft's key of adapter tensor ``local`` of block ``index`` (as ``get_peft_model_state_dict`` names it)."""
    plain = local.replace(f".{ADAPTER}.", ".")
    return PEFT_PREFIX + hf_key(config, index, plain)


__all__ = ["ADAPTER", "PEFT_PREFIX", "adapted_modules", "lora_blocks", "lora_param_count", "lora_tensors", "peft_key"]
