"""What ``AutoTokenizer`` needs beside a tokenizer.json (torch-free).

Owns: :func:`tokenizer_config`: a ``tokenizer_config.json`` naming the fast tokenizer class and the special tokens
found in the tokenizer.json (end-of-text as eos, bos and pad when there is no other), bounded by the context.
"""

from __future__ import annotations

from typing import Any

EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>")


def tokenizer_config(tokenizer_json: dict[str, Any], block_size: int) -> dict[str, Any]:
    """The tokenizer_config.json for ``tokenizer_json``; ``eos_token_id`` (not a tokenizer_config key, removed
    before writing) says the end-of-text id for the model's config."""
    added = {t.get("content"): t.get("id") for t in tokenizer_json.get("added_tokens", []) if isinstance(t, dict)}
    out: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size}
    eos = next((n for n in EOS_NAMES if n in added), None)
    if eos is not None:
        out.update(eos_token=eos, bos_token="<s>" if "<s>" in added else eos, pad_token=eos)
        out["eos_token_id"] = added[eos]
    return out


__all__ = ["tokenizer_config"]
