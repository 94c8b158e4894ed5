"""Reading one block's initial weights from a safetensors file, lazily (workers only).

Owns: :func:`load_block_tensors`: ``safe_open`` maps the file and only the block's own tensors are read, as
fp32, keyed by the block's local parameter names. The file was checked against the config when the spec was
read (:mod:`arceusd.models.hf.weights_check`); a key missing here is still one clear error.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import block_tensors, hf_key, untied_head_source


def load_block_tensors(path: Path, config: HFModelConfig, index: int) -> dict[str, torch.Tensor]:
    """Block ``index``'s tensors from ``path`` (local name -> fp32 tensor of the config's shape)."""
    out: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        for local, shape in block_tensors(config, index).items():
            key = hf_key(config, index, local)
            source = untied_head_source(config, key)
            if key not in keys and source is not None and source in keys:  # a tied checkpoint: the head starts as it
                key = source
            if key not in keys:
                raise ValueError(
                    f"initial weights {path}: missing {key} (block {index}); the file does not match model.config"
                )
            t = f.get_tensor(key)
            if tuple(t.shape) != shape:
                raise ValueError(
                    f"initial weights {path}: {key} has shape {list(t.shape)}, model.config says {list(shape)}"
                )
            out[local] = t.to(torch.float32)
    return out


__all__ = ["load_block_tensors"]
