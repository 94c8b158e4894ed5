"""Tiny random stock causal-LM configs (gpt2, llama, qwen2, mistral) for the tests; nothing is downloaded."""

from __future__ import annotations

from typing import Any

from arceusd.models.hf.config import HFModelConfig, parse_hf_config

VOCAB = 97
BLOCK = 12

RAW: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "qwen2": {
        "model_type": "qwen2",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 40,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    },
    "mistral": {
        "model_type": "mistral",
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 40,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": VOCAB,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 32,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": False,
    },
}


def config(name: str, **overrides: Any) -> HFModelConfig:
    """The tiny config ``name`` with ``overrides`` applied; fails the test on a problem."""
    problems: list[str] = []
    cfg = parse_hf_config({**RAW[name], **overrides}, BLOCK, "model.config", lambda p, m: problems.append(f"{p}: {m}"))
    assert cfg is not None, problems
    return cfg
