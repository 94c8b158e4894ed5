"""A finished stock causal LM as a folder ``transformers`` loads with no Arceus code (workers / child processes).

Owns: :func:`write_hf_export`: ``config.json`` (the library's own, via ``save_pretrained``), ``model.safetensors``
under the architecture's keys (``model.layers.0.self_attn.q_proj.weight``; a tied head is not stored twice, as
the library saves it: the embedding's key holds the weight, and the head's copy a plan that splits the two ends
trains, bit-identical to it, is dropped when the shards are gathered, ``arceusd/jobs/procs/reslice.py``) and, given a
tokenizer.json, ``tokenizer.json`` + ``tokenizer_config.json`` so that ``AutoModelForCausalLM.from_pretrained(dir)``
and ``AutoTokenizer.from_pretrained(dir)`` load it.
:func:`hf_state` maps Arceus' reference-model names (``"<block>.<local name>"``) to those keys.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import expected_tensors, hf_key
from arceusd.models.hf.tokenizer_files import tokenizer_config

ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def hf_state(config: HFModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<block>.<local>": tensor}`` -> ``{architecture key: tensor}``; ``ValueError`` on a mismatch."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        block, _, local = name.partition(".")
        if config.tied and local == "lm_head.weight":
            continue  # the embedding's, stored once
        out[hf_key(config, int(block), local)] = tensor.detach().to("cpu", torch.float32).contiguous()
    expected = expected_tensors(config)
    if set(out) != set(expected):
        missing, extra = sorted(set(expected) - set(out)), sorted(set(out) - set(expected))
        raise ValueError(f"the model does not match its config: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, (_, _, shape) in expected.items():
        if tuple(out[key].shape) != shape:
            raise ValueError(f"{key} has shape {list(out[key].shape)}; the config says {list(shape)}")
    return out


def write_hf_export(
    directory: Path, config: HFModelConfig, state: dict[str, torch.Tensor], tokenizer: Path | None = None
) -> Path:
    """Write the export folder (see the module docstring); returns the weights' path."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = hf_state(config, state)
    tc = transformers_config(config)
    tc.architectures = [ARCHITECTURES[config.model_type]]
    eos: Any = None  # the tokenizer's end-of-text id, not the architecture's default (GPT-2's 50256)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, directory / "tokenizer.json")
        described = tokenizer_config(json.loads(tokenizer.read_text(encoding="utf-8")), config.block_size)
        eos = described.pop("eos_token_id", None)
        (directory / "tokenizer_config.json").write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
    tc.bos_token_id = tc.eos_token_id = eos
    tc.pad_token_id = None
    tc.use_cache = True  # for generate(); training never uses the cache
    tc.save_pretrained(str(directory))
    path = directory / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


__all__ = ["ARCHITECTURES", "hf_state", "write_hf_export"]
