"""A stock ``transformers`` model object and its tokenizer as the files a job spec names: ``config.json``,
``model.safetensors`` (the initial weights, under the architecture's own keys) and ``tokenizer.json``.

Nothing is pickled: the config is JSON, the weights safetensors (a header and raw bytes), the tokenizer the
``tokenizers`` library's JSON. The objects are inspected by their attributes, so this module imports neither
torch nor transformers; :func:`write_weights` imports ``safetensors.torch`` (and so torch, which the caller's
model already loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arceus.errors import UnsupportedModelError
from arceusd.models.hf.config import MODEL_TYPES

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def model_type_of(model: Any) -> str:
    """The ``model_type`` of a transformers causal LM that Arceus trains.

    Error handling: :class:`UnsupportedModelError` in one line for any other object or architecture.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if not callable(getattr(model, "named_parameters", None)) or not isinstance(model_type, str):
        raise UnsupportedModelError(
            f"expected a transformers causal LM (a torch module with a .config), got {type(model).__name__}"
        )
    if model_type not in MODEL_TYPES:
        raise UnsupportedModelError(
            f"Arceus trains {', '.join(MODEL_TYPES)} models; this {type(model).__name__} is {model_type!r}"
        )
    return model_type


def positions_of(model: Any) -> int:
    """The architecture's longest context (``n_positions`` for gpt2, else ``max_position_embeddings``)."""
    key = "n_positions" if model_type_of(model) == "gpt2" else "max_position_embeddings"
    value = getattr(model.config, key, None)
    return value if isinstance(value, int) and value > 0 else 1


def config_json(model: Any) -> str:
    """The model's config.json text (every field, defaults included, as ``save_pretrained`` would write it)."""
    config = model.config
    to_json = getattr(config, "to_json_string", None)
    text = to_json(use_diff=False) if callable(to_json) else json.dumps(config.to_dict(), indent=2, sort_keys=True)
    if not isinstance(text, str):
        raise UnsupportedModelError(f"{type(config).__name__} did not give its config as JSON text")
    return text


def tokenizer_json(tokenizer: Any) -> str:
    """The tokenizer.json text of a ``tokenizers.Tokenizer`` or a transformers fast tokenizer.

    Error handling: :class:`UnsupportedModelError` for anything else (a slow, Python-only tokenizer).
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str = getattr(backend, "to_str", None)
    text = to_str() if callable(to_str) else None
    if not isinstance(text, str):
        raise UnsupportedModelError(
            f"expected a tokenizers.Tokenizer or a transformers fast tokenizer (one with a "
            f"tokenizer.json), got {type(tokenizer).__name__}"
        )
    return text


def write_text_files(model: Any, tokenizer: Any, folder: Path) -> None:
    """``folder/config.json`` and ``folder/tokenizer.json`` (the folder made if need be)."""
    config, tok = config_json(model), tokenizer_json(tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(config, encoding="utf-8")
    (folder / TOKENIZER_FILE).write_text(tok, encoding="utf-8")


def write_weights(model: Any, folder: Path) -> Path:
    """The model's parameters as ``folder/model.safetensors`` under its own key names; a tied weight once, under
    the embedding's key (``named_parameters`` names a shared parameter once, by its first name)."""
    from safetensors.torch import save_file  # torch: only to write weights

    tensors = {name: p.detach().to("cpu").contiguous() for name, p in model.named_parameters()}
    path = folder / WEIGHTS_FILE
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


__all__ = [
    "CONFIG_FILE",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "config_json",
    "model_type_of",
    "positions_of",
    "tokenizer_json",
    "write_text_files",
    "write_weights",
]
