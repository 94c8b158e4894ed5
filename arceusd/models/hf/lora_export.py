"""A finished LoRA job as peft's adapter folder, and, when the spec asks, the merged model (export child only).

Owns: :func:`write_lora_export`, which writes into the job's ``export/`` folder:

- ``adapter_config.json`` (peft's own ``LoraConfig.save_pretrained``: rank, alpha, dropout, the spec's target
  names, ``fan_in_fan_out`` for GPT-2's Conv1D) and ``adapter_model.safetensors`` under peft's keys
  (:func:`arceusd.models.hf.lora_keys.peft_key`), so ``PeftModel.from_pretrained(base_model, folder)`` loads it on
  the base the job started from;
- the tokenizer files (as :func:`arceusd.models.hf.export.write_hf_export` writes them), for
  ``AutoTokenizer.from_pretrained(folder)``;
- with ``merge = true``: ``merged/``, the base with every adapter merged in (``W + alpha / r * B @ A``; GPT-2's
  Conv1D weight is (in, out), so its update is transposed), written by ``write_hf_export`` as a plain
  ``from_pretrained`` folder. The base is rebuilt from the job's initial weights (or seed), as the workers built it.

:func:`adapter_tensors` and :func:`merged_state` are the two mappings, for tests.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from arceusd.models.build import build_block
from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.lora_keys import ADAPTER, adapted_modules, lora_blocks, lora_tensors, peft_key
from arceusd.models.hf.tokenizer_files import tokenizer_config

ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGED = "merged"


def adapter_tensors(config: HFModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"<block>.<local>": adapter tensor}`` -> ``{peft key: tensor}``; ``ValueError`` on a mismatch."""
    expected = {f"{i}.{k}": s for i in sorted(lora_blocks(config)) for k, s in lora_tensors(config, i).items()}
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise ValueError(f"the adapters do not match the spec's [lora]: missing {missing[:3]}, unexpected {extra[:3]}")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"adapter {name} has shape {list(tensor.shape)}; the spec says {list(expected[name])}")
        block, _, local = name.partition(".")
        out[peft_key(config, int(block), local)] = tensor.detach().to("cpu", torch.float32).contiguous()
    return out


@torch.no_grad()
def merged_state(
    config: HFModelConfig, state: dict[str, torch.Tensor], seed: int, weights: Path | None
) -> dict[str, torch.Tensor]:
    """The base's parameters (``"<block>.<local>"``, rebuilt from ``weights`` or ``seed``) with the adapters of
    ``state`` merged into their layers' weights."""
    assert config.lora is not None
    base = replace(config, lora=None)
    out: dict[str, torch.Tensor] = {}
    for i in range(num_hf_blocks(config)):
        tensors = {f"{i}.{k}": p.detach().clone() for k, p in build_block(base, i, seed, weights).named_parameters()}
        for module in adapted_modules(config, i):
            a = state[f"{i}.{module}.lora_A.{ADAPTER}.weight"].float()  # (r, in)
            b = state[f"{i}.{module}.lora_B.{ADAPTER}.weight"].float()  # (out, r)
            delta = (b @ a) * config.lora.scaling  # (out, in)
            key = f"{i}.{module}.weight"
            tensors[key] += delta.T if config.is_gpt2 else delta
        out.update(tensors)
    return out


def _write_adapter_config(directory: Path, config: HFModelConfig) -> None:
    from peft import LoraConfig  # peft: only a LoRA export

    assert config.lora is not None
    lora = config.lora
    LoraConfig(
        task_type="CAUSAL_LM",
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.targets),
        fan_in_fan_out=config.is_gpt2,
        bias="none",
    ).save_pretrained(str(directory))


def write_lora_export(
    directory: Path,
    config: HFModelConfig,
    state: dict[str, torch.Tensor],
    tokenizer: Path | None,
    seed: int,
    weights: Path | None,
) -> Path:
    """Write the export folder (see the module docstring); returns the adapter weights' path."""
    from arceusd.models.hf.export import write_hf_export  # transformers: only a LoRA export

    assert config.lora is not None
    directory.mkdir(parents=True, exist_ok=True)
    tensors = adapter_tensors(config, state)
    _write_adapter_config(directory, config)
    path = directory / ADAPTER_WEIGHTS
    save_file(tensors, str(path), metadata={"format": "pt"})
    if tokenizer is not None:
        shutil.copyfile(tokenizer, directory / "tokenizer.json")
        described = tokenizer_config(json.loads(tokenizer.read_text(encoding="utf-8")), config.block_size)
        described.pop("eos_token_id", None)
        (directory / "tokenizer_config.json").write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
    if config.lora.merge:
        write_hf_export(
            directory / MERGED, replace(config, lora=None), merged_state(config, state, seed, weights), tokenizer
        )
    return path


__all__ = ["ADAPTER_WEIGHTS", "MERGED", "adapter_tensors", "merged_state", "write_lora_export"]
