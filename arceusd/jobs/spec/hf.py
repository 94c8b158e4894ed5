"""The job spec's fields for stock ``transformers`` causal LMs (torch-free): ``[model] type = "hf"`` and
``[data] kind = "tokens"``, read and bounded like the other fields (:mod:`arceusd.jobs.spec.parser` calls these).

Owns::

    [model]  type = "hf", config = "config.json" (a path, relative to the spec's folder; or the config inline as
             a table, the form a spec travels in), block_size (training context length), weights? (a safetensors
             file under the architecture's keys), weights_sha256? and weights_tensors? (the file's digest and
             each tensor's, key -> [dtype, sha256] (a tensor a tensor-parallel split cuts: the root of its chunks'
             digests): recorded when the file is read; members check the slice they receive against them,
             arceusd/models/hf/weights_slice.py)
    [data]   kind = "tokens", path, tokenizer (a tokenizers tokenizer.json), format ("text" | "jsonl"),
             text_field ("text"), val_fraction, sha256?, tokenizer_sha256?

and the facts the owner reads from those files (digests, the tokenizer's vocabulary size) without torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from arceusd.data.text_files import file_sha256
from arceusd.jobs.spec.fields import FieldReader
from arceusd.jobs.spec.parsed import TOKENS_FORMATS, TokensDataSpec, TrainingSpec, resolve_path
from arceusd.models.hf.config import HFModelConfig, parse_hf_config
from arceusd.models.hf.keys import expected_tensors
from arceusd.models.hf.weights_check import weights_problems
from arceusd.models.hf.weights_slice import DTYPE_BYTES, WeightsSliceError, digest_file

HF_KEYS = ("type", "config", "block_size", "weights", "weights_sha256", "weights_tensors")
TOKENS_KEYS = ("kind", "path", "tokenizer", "format", "text_field", "val_fraction", "sha256", "tokenizer_sha256")
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TokensFacts:
    sha256: str
    tokenizer_sha256: str
    vocab_size: int


def _hex(r: FieldReader, t: Mapping[str, Any], key: str, prefix: str) -> str | None:
    d = r.string(t, key, prefix, None, max_len=64)
    if d is not None and not _HEX64_RE.match(d):
        r.problem(f"{prefix}.{key}", f"got {d!r}; allowed: 64 lowercase hex characters (a sha256 digest)")
        return None
    return d


def _read_json(r: FieldReader, path: Path, where: str, limit: int) -> Any:
    try:
        raw = path.read_bytes()
        if len(raw) > limit:
            r.problem(where, f"{path} is {len(raw)} bytes; at most {limit}")
            return None
        return json.loads(raw)
    except OSError as e:
        r.problem(where, f"cannot read {path}: {e.strerror or e} (relative paths resolve from the spec's folder)")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        r.problem(where, f"{path} is not JSON: {e}")
    return None


def parse_hf_model(
    r: FieldReader, t: Mapping[str, Any], base_dir: Path | None, check_files: bool
) -> HFModelConfig | None:
    """``[model] type = "hf"``; with ``check_files`` the config file is read and the weights checked."""
    r.unknown_keys(t, HF_KEYS, "model")
    block = r.integer(t, "block_size", "model", lo=1, hi=1 << 24)
    weights = r.string(t, "weights", "model", None, max_len=4096)
    digest = _hex(r, t, "weights_sha256", "model")
    raw = t.get("config")
    doc: Any = None
    if isinstance(raw, str):
        if not check_files:
            r.problem("model.config", "a path needs the file; a spec from the wire carries the config inline")
            return None
        doc = _read_json(r, resolve_path(raw, base_dir), "model.config", MAX_CONFIG_BYTES)
    elif isinstance(raw, Mapping):
        doc = raw
    else:
        r.problem("model.config", f"got {raw!r}; allowed: the path of a config.json or the config as a table")
    if doc is None or block is None:
        return None
    config = parse_hf_config(doc, block, "model.config", r.problem)
    if config is None:
        return None
    tensors = _tensor_table(r, t.get("weights_tensors"), config)
    if weights is not None and check_files:
        path = resolve_path(weights, base_dir)
        problems = weights_problems(path, config)
        for line in problems:
            r.problem("model.weights", f"{line}; give the weights of this config (the architecture's own keys)")
        if problems:
            return None
        try:  # the file's digest and each tensor's, in one pass: members check their slices against these
            actual, table = digest_file(path, config)
        except (OSError, WeightsSliceError) as e:
            r.problem("model.weights", f"cannot read {path}: {e}")
            return None
        if digest is not None and digest != actual:
            r.problem("model.weights_sha256", f"the weights' digest is {actual}, not {digest}; the file changed")
            return None
        found = tuple(sorted((k, d, h) for k, (d, h) in table.items()))
        if tensors is not None and tensors != found:
            r.problem("model.weights_tensors", "the weights' tensors differ from these digests; the file changed")
            return None
        digest, tensors = actual, found
    elif weights is not None and tensors is None and "weights_tensors" not in t:
        r.problem(
            "model.weights_tensors",
            "missing: a spec from the wire carries its weights' tensor digests (the owner records them at submit)",
        )
        return None
    elif weights is None:
        if digest is not None:
            r.problem("model.weights_sha256", "applies only with model.weights")
        if "weights_tensors" in t:
            r.problem("model.weights_tensors", "applies only with model.weights")
    return replace(config, weights=weights, weights_sha256=digest, weights_tensors=tensors)


def _tensor_table(r: FieldReader, raw: Any, config: HFModelConfig) -> tuple[tuple[str, str, str], ...] | None:
    """``model.weights_tensors`` (key -> [dtype, sha256]) bounded by the config's own keys, or None."""
    if raw is None:
        return None
    names = set(expected_tensors(config)) | {"lm_head.weight"}  # a tied checkpoint may store the head too
    if not isinstance(raw, Mapping) or not 0 < len(raw) <= len(names):
        r.problem("model.weights_tensors", f"must be a table of 1 to {len(names)} tensors (key = [dtype, sha256])")
        return None
    out = []
    for key, value in raw.items():
        if key not in names:
            r.problem("model.weights_tensors", f"{str(key)[:80]!r} is no tensor of this config")
            return None
        if (
            not isinstance(value, list)
            or len(value) != 2
            or value[0] not in DTYPE_BYTES
            or not isinstance(value[1], str)
            or not _HEX64_RE.match(value[1])
        ):
            r.problem(
                "model.weights_tensors",
                f"{key}: got {str(value)[:80]}; allowed: [dtype ({', '.join(DTYPE_BYTES)}), 64 lowercase hex]",
            )
            return None
        out.append((str(key), str(value[0]), str(value[1])))
    return tuple(sorted(out))


def hf_model_dict(m: HFModelConfig) -> dict[str, Any]:
    """The ``[model]`` table of a spec's canonical form (the config inline)."""
    out: dict[str, Any] = {"type": "hf", "config": m.as_dict(), "block_size": m.block_size}
    if m.weights is not None:
        out["weights"] = m.weights
    if m.weights_sha256 is not None:
        out["weights_sha256"] = m.weights_sha256
    if m.weights_tensors is not None:
        out["weights_tensors"] = {k: [d, h] for k, d, h in m.weights_tensors}
    return out


def parse_tokens_data(r: FieldReader, t: Mapping[str, Any], digest: str | None) -> TokensDataSpec | None:
    r.unknown_keys(t, TOKENS_KEYS, "data")
    path = r.string(t, "path", "data")
    tokenizer = r.string(t, "tokenizer", "data", max_len=4096)
    fmt = r.choice(t, "format", "data", TOKENS_FORMATS, "text")
    field = r.string(t, "text_field", "data", "text", max_len=256)
    val = r.number(t, "val_fraction", "data", 0.1, lo=0.0, hi=1.0, hi_open=True)
    tok_digest = _hex(r, t, "tokenizer_sha256", "data")
    if "text_field" in t and fmt == "text":
        r.problem("data.text_field", "applies only with data.format = 'jsonl'")
    if path is None or tokenizer is None or fmt is None or field is None or val is None:
        return None
    return TokensDataSpec(
        path=path,
        tokenizer=tokenizer,
        val_fraction=val,
        format=fmt,  # type: ignore[arg-type]
        text_field=field,
        sha256=digest,
        tokenizer_sha256=tok_digest,
    )


def tokens_dict(d: TokensDataSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": "tokens",
        "path": d.path,
        "tokenizer": d.tokenizer,
        "format": d.format,
        "val_fraction": d.val_fraction,
        "sha256": d.sha256,
        "tokenizer_sha256": d.tokenizer_sha256,
    }
    if d.format == "jsonl":
        out["text_field"] = d.text_field
    return {k: v for k, v in out.items() if v is not None}


def tokenizer_vocab_size(doc: Any) -> int:
    """Ids a tokenizer.json can produce: its model's vocabulary and its added tokens (highest id + 1)."""
    ids: list[int] = []
    model = doc.get("model") if isinstance(doc, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):  # unigram: [[piece, score], ...]
        ids.append(len(vocab) - 1)
    for tok in doc.get("added_tokens", []) if isinstance(doc, dict) else []:
        if isinstance(tok, dict) and isinstance(tok.get("id"), int):
            ids.append(tok["id"])
    return max(ids) + 1 if ids else 0


def tokens_facts(r: FieldReader, d: TokensDataSpec, base_dir: Path | None) -> TokensFacts | None:
    """The data file's and tokenizer's digests and the tokenizer's size, checked against recorded digests."""
    path, tok = resolve_path(d.path, base_dir), resolve_path(d.tokenizer, base_dir)
    doc = _read_json(r, tok, "data.tokenizer", MAX_TOKENIZER_BYTES)
    if doc is None:
        return None
    size = tokenizer_vocab_size(doc)
    if size <= 0:
        r.problem("data.tokenizer", f"{tok} has no vocabulary; give a tokenizers tokenizer.json")
        return None
    try:
        facts = TokensFacts(file_sha256(path), file_sha256(tok), size)
    except OSError as e:
        r.problem("data.path", f"cannot read {path}: {e.strerror or e} (relative paths resolve from the spec's folder)")
        return None
    if d.sha256 is not None and d.sha256 != facts.sha256:
        r.problem("data.sha256", f"the data file's digest is {facts.sha256}, not {d.sha256}; the file changed")
    if d.tokenizer_sha256 is not None and d.tokenizer_sha256 != facts.tokenizer_sha256:
        r.problem(
            "data.tokenizer_sha256",
            f"the tokenizer's digest is {facts.tokenizer_sha256}, not {d.tokenizer_sha256}; the file changed",
        )
    return facts


def check_hf(r: FieldReader, m: HFModelConfig, facts: TokensFacts | None) -> None:
    if facts is not None and facts.vocab_size > m.vocab_size:
        r.problem(
            "model.config.vocab_size",
            f"{m.vocab_size} is smaller than the tokenizer's {facts.vocab_size} tokens; allowed: >= {facts.vocab_size}",
        )


def check_hf_training(r: FieldReader, m: HFModelConfig, training: TrainingSpec | None) -> None:
    """A tied embedding split across stages has two copies kept equal by summing their gradients every step
    (``arceusd/worker/tied.py``); DiLoCo's replicas would average each copy on its own ring, so they drift."""
    if m.tied and m.lora is None and training is not None and training.sync == "diloco":
        r.problem(
            "training.sync",
            "'diloco' cannot train tied embeddings (model.config.tie_word_embeddings = "
            "true: the embedding's and the LM head's copies would drift apart); use 'every_step' or 'auto' "
            "(a tied model's replicas then sync every step), or set tie_word_embeddings to false",
        )


def with_tokens_facts(d: TokensDataSpec, facts: TokensFacts) -> TokensDataSpec:
    return replace(d, sha256=facts.sha256, tokenizer_sha256=facts.tokenizer_sha256)


__all__ = [
    "TokensFacts",
    "check_hf",
    "check_hf_training",
    "hf_model_dict",
    "parse_hf_model",
    "parse_tokens_data",
    "tokens_dict",
    "tokens_facts",
    "with_tokens_facts",
]
