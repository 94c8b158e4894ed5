"""The config of a stock ``transformers`` causal LM, bounded like every other spec field (torch-free).

Owns: :class:`HFModelConfig` (a model_type plus its architecture fields, complete and canonical: every field a
block depends on is explicit, so the spec hash pins the architecture) and :func:`parse_hf_config`, which reads a
``config.json`` document, keeps the architecture fields, drops known metadata (token ids, dtype, versions) and
reports one line per problem through a ``problem(path, message)`` callback, naming the field and the fix.

Supported: ``gpt2``, ``llama``, ``qwen2``, ``mistral``, with full causal attention (no sliding window shorter
than the training context, no rope scaling), plain rotary embeddings and fp32 training. ``block_size`` is the
training context length (at most the architecture's position count).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from arceusd.models.hf.lora_spec import LoraSpec

MODEL_TYPES = ("gpt2", "llama", "qwen2", "mistral")
MAX_WIDTH = 1 << 20
MAX_VOCAB = 1 << 22
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_POSITIONS = 1 << 24

Problem = Callable[[str, str], None]

#: Keys a config.json may carry that do not change the blocks' computation; dropped.
_METADATA = frozenset(
    {
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_cache",
        "_name_or_path",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "task_specific_params",
        "summary_type",
        "summary_use_proj",
        "summary_activation",
        "summary_proj_to_labels",
        "summary_first_dropout",
        "id2label",
        "label2id",
        "chunk_size_feed_forward",
        "is_decoder",
        "is_encoder_decoder",
        "tokenizer_class",
        "prefix",
        "problem_type",
        "max_window_layers",
        "num_labels",
    }
)

_DECODER_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
_GPT2_INTS = ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions", "n_inner")


def _bounds(key: str) -> tuple[int, int]:
    if key in ("num_hidden_layers", "n_layer"):
        return 1, MAX_LAYERS
    if key in ("num_attention_heads", "num_key_value_heads", "n_head"):
        return 1, MAX_HEADS
    if key == "vocab_size":
        return 1, MAX_VOCAB
    if key in ("max_position_embeddings", "n_positions"):
        return 1, MAX_POSITIONS
    if key == "head_dim":
        return 1, 4096
    return 1, MAX_WIDTH


@dataclass(frozen=True)
class HFModelConfig:
    """A validated stock causal LM. ``fields``: the architecture's config.json values, sorted by key (explicit
    defaults included); ``block_size``: the training context length; ``weights``: initial weights (a
    safetensors file under the architecture's keys, path as the spec gives it) and their sha256, or None (the
    library's initialisation drawn per block from the job's seed); ``lora``: the spec's ``[lora]`` (adapters
    trained on a frozen base, :mod:`arceusd.models.hf.lora_spec`), or None (every parameter trains)."""

    model_type: str
    fields: tuple[tuple[str, Any], ...]
    block_size: int
    weights: str | None = None
    weights_sha256: str | None = None
    lora: LoraSpec | None = None
    weights_tensors: tuple[tuple[str, str, str], ...] | None = None
    """Every tensor of ``weights``: (key, dtype, sha256 of its raw bytes), sorted by key; recorded with
    ``weights_sha256`` so that a member checks its slice against the signed spec
    (:mod:`arceusd.models.hf.weights_slice`)."""

    def get(self, key: str) -> Any:
        for k, v in self.fields:
            if k == key:
                return v
        raise KeyError(key)

    def as_dict(self) -> dict[str, Any]:
        """The architecture fields as a config.json dict (``model_type`` included)."""
        return {"model_type": self.model_type, **dict(self.fields)}

    @property
    def is_gpt2(self) -> bool:
        return self.model_type == "gpt2"

    @property
    def n_layer(self) -> int:
        return int(self.get("n_layer" if self.is_gpt2 else "num_hidden_layers"))

    @property
    def hidden(self) -> int:
        return int(self.get("n_embd" if self.is_gpt2 else "hidden_size"))

    @property
    def n_head(self) -> int:
        return int(self.get("n_head" if self.is_gpt2 else "num_attention_heads"))

    @property
    def n_kv_head(self) -> int:
        return self.n_head if self.is_gpt2 else int(self.get("num_key_value_heads"))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head if self.is_gpt2 else int(self.get("head_dim"))

    @property
    def intermediate(self) -> int:
        return int(self.get("n_inner")) if self.is_gpt2 else int(self.get("intermediate_size"))

    @property
    def vocab_size(self) -> int:
        return int(self.get("vocab_size"))

    @property
    def tied(self) -> bool:
        return bool(self.get("tie_word_embeddings"))

    @property
    def positions(self) -> int:
        return int(self.get("n_positions" if self.is_gpt2 else "max_position_embeddings"))

    def canonical_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)


def num_hf_blocks(config: HFModelConfig) -> int:
    """Embeddings, one block per decoder layer, final norm + head."""
    return config.n_layer + 2


def _number(
    doc: Mapping[str, Any],
    key: str,
    default: float,
    lo: float,
    hi: float,
    where: str,
    problem: Problem,
    lo_open: bool = False,
) -> float | None:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        problem(f"{where}.{key}", f"got {v!r}; allowed: a number")
        return None
    if v < lo or v > hi or (lo_open and v == lo):
        problem(f"{where}.{key}", f"{v} is out of bounds; allowed: {'(' if lo_open else '['}{lo}, {hi}]")
        return None
    return float(v)


def _integer(doc: Mapping[str, Any], key: str, default: int | None, where: str, problem: Problem) -> int | None:
    v = doc.get(key, default)
    lo, hi = _bounds(key)
    if isinstance(v, bool) or not isinstance(v, int):
        problem(f"{where}.{key}", f"got {v!r}; allowed: an integer {lo}..{hi}")
        return None
    if not lo <= v <= hi:
        problem(f"{where}.{key}", f"{v} is out of bounds; allowed: {lo}..{hi}")
        return None
    return v


def _boolean(doc: Mapping[str, Any], key: str, default: bool, where: str, problem: Problem) -> bool | None:
    v = doc.get(key, default)
    if not isinstance(v, bool):
        problem(f"{where}.{key}", f"got {v!r}; allowed: true or false")
        return None
    return v


def _must(doc: Mapping[str, Any], key: str, allowed: tuple[Any, ...], where: str, problem: Problem, why: str) -> None:
    if key in doc and doc[key] not in allowed:
        shown = " or ".join(json.dumps(a) for a in allowed)
        problem(f"{where}.{key}", f"got {doc[key]!r}; Arceus supports only {shown} ({why})")


def _rope_theta(doc: Mapping[str, Any], where: str, problem: Problem) -> float | None:
    params = doc.get("rope_parameters")
    if params is not None:
        if not isinstance(params, Mapping) or params.get("rope_type", "default") != "default":
            problem(
                f"{where}.rope_parameters",
                f"got {params!r}; Arceus supports only rope_type 'default' "
                "(plain rotary embeddings); remove the scaling",
            )
            return None
        return _number(params, "rope_theta", 10000.0, 0.0, 1e12, f"{where}.rope_parameters", problem, True)
    if doc.get("rope_scaling") is not None:
        problem(f"{where}.rope_scaling", "Arceus supports only plain rotary embeddings; set rope_scaling to null")
        return None
    return _number(doc, "rope_theta", 10000.0, 0.0, 1e12, where, problem, lo_open=True)


def _decoder_fields(
    model_type: str, doc: Mapping[str, Any], block_size: int, where: str, problem: Problem
) -> dict[str, Any] | None:
    known = set(_DECODER_INTS) | {
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "tie_word_embeddings",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
        "attention_dropout",
        "initializer_range",
        "sliding_window",
        "use_sliding_window",
        "pretraining_tp",
        "layer_types",
    }
    _unknown(doc, known, where, problem)
    out: dict[str, Any] = {}
    heads = _integer(doc, "num_attention_heads", None, where, problem)
    hidden = _integer(doc, "hidden_size", None, where, problem)
    for key in ("vocab_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"):
        out[key] = _integer(doc, key, None, where, problem)
    kv = _integer(doc, "num_key_value_heads", heads, where, problem) if heads is not None else None
    out.update(num_attention_heads=heads, hidden_size=hidden, num_key_value_heads=kv)
    head_dim = None
    if heads is not None and hidden is not None:
        given = doc.get("head_dim")
        if given is None and hidden % heads:
            problem(
                f"{where}.hidden_size",
                f"{hidden} is not divisible by num_attention_heads = {heads}; give head_dim or make it divisible",
            )
        head_dim = (
            _integer(doc, "head_dim", hidden // heads or 1, where, problem)
            if given is not None
            else (hidden // heads if hidden % heads == 0 else None)
        )
        if kv is not None and heads % kv:
            problem(f"{where}.num_key_value_heads", f"{kv} does not divide num_attention_heads = {heads}")
    out["head_dim"] = head_dim
    out["rms_norm_eps"] = _number(doc, "rms_norm_eps", 1e-6, 0.0, 1.0, where, problem, lo_open=True)
    out["rope_theta"] = _rope_theta(doc, where, problem)
    out["initializer_range"] = _number(doc, "initializer_range", 0.02, 0.0, 1.0, where, problem, lo_open=True)
    out["tie_word_embeddings"] = _boolean(doc, "tie_word_embeddings", False, where, problem)
    _must(doc, "hidden_act", ("silu",), where, problem, "the activation of the stock checkpoints")
    _must(doc, "attention_dropout", (0, 0.0), where, problem, "dropout differs between processes")
    _must(doc, "pretraining_tp", (1,), where, problem, "a training-time slicing that changes no result")
    out["hidden_act"] = "silu"
    out["attention_dropout"] = 0.0
    if model_type == "llama":
        out["attention_bias"] = _boolean(doc, "attention_bias", False, where, problem)
        out["mlp_bias"] = _boolean(doc, "mlp_bias", False, where, problem)
    else:
        for key in ("attention_bias", "mlp_bias"):
            if key in doc:
                problem(f"{where}.{key}", f"{model_type} has no {key} setting; remove it")
    if model_type in ("qwen2", "mistral"):
        window = doc.get("sliding_window")
        sliding = model_type == "mistral" or bool(doc.get("use_sliding_window", False))
        if sliding and window is not None and (not isinstance(window, int) or window < block_size):
            problem(
                f"{where}.sliding_window",
                f"got {window!r}: a window shorter than the training context "
                f"model.block_size = {block_size} is not supported; set it to null or >= {block_size}",
            )
        layer_types = doc.get("layer_types")
        full = isinstance(layer_types, list) and all(t == "full_attention" for t in layer_types)
        if layer_types is not None and not full and sliding:
            problem(f"{where}.layer_types", "only 'full_attention' layers are supported; remove layer_types")
        out["sliding_window"] = None
        if model_type == "qwen2":
            out["use_sliding_window"] = False
    if any(v is None for k, v in out.items() if k != "sliding_window"):
        return None
    return out


def _gpt2_fields(doc: Mapping[str, Any], where: str, problem: Problem) -> dict[str, Any] | None:
    known = set(_GPT2_INTS) | {
        "activation_function",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "layer_norm_epsilon",
        "initializer_range",
        "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
        "tie_word_embeddings",
        "n_ctx",
        "add_cross_attention",
    }
    _unknown(doc, known, where, problem)
    out: dict[str, Any] = {}
    for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
        out[key] = _integer(doc, key, None, where, problem)
    if out["n_embd"] is not None and out["n_head"] is not None and out["n_embd"] % out["n_head"]:
        problem(f"{where}.n_embd", f"{out['n_embd']} is not divisible by n_head = {out['n_head']}")
    inner = doc.get("n_inner")
    out["n_inner"] = (
        _integer(doc, "n_inner", None, where, problem)
        if inner is not None
        else (4 * out["n_embd"] if out["n_embd"] is not None else None)
    )
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
        _must(doc, key, (0, 0.0), where, problem, "dropout differs between processes; set it to 0.0")
        out[key] = 0.0
    out["layer_norm_epsilon"] = _number(doc, "layer_norm_epsilon", 1e-5, 0.0, 1.0, where, problem, lo_open=True)
    out["initializer_range"] = _number(doc, "initializer_range", 0.02, 0.0, 1.0, where, problem, lo_open=True)
    out["tie_word_embeddings"] = _boolean(doc, "tie_word_embeddings", True, where, problem)
    _must(doc, "activation_function", ("gelu_new",), where, problem, "GPT-2's own activation")
    _must(doc, "scale_attn_weights", (True,), where, problem, "GPT-2's own attention")
    _must(doc, "scale_attn_by_inverse_layer_idx", (False,), where, problem, "GPT-2's own attention")
    _must(doc, "reorder_and_upcast_attn", (False,), where, problem, "GPT-2's own attention")
    _must(doc, "add_cross_attention", (False,), where, problem, "a decoder-only model")
    out["activation_function"] = "gelu_new"
    if any(v is None for v in out.values()):
        return None
    return out


def _unknown(doc: Mapping[str, Any], known: set[str], where: str, problem: Problem) -> None:
    extra = sorted(k for k in doc if k not in known and k not in _METADATA)
    if extra:
        problem(
            f"{where}.{extra[0]}",
            f"unknown config field{'s' if len(extra) > 1 else ''} {', '.join(extra)}; "
            "Arceus would not know whether it changes the architecture: remove it",
        )


def parse_hf_config(doc: object, block_size: int | None, where: str, problem: Problem) -> HFModelConfig | None:
    """Validate a config.json document (``where`` prefixes the field paths in problems); None when invalid."""
    if not isinstance(doc, Mapping):
        problem(where, f"a config must be a JSON object, got {type(doc).__name__}")
        return None
    model_type = doc.get("model_type")
    if model_type not in MODEL_TYPES:
        problem(
            f"{where}.model_type",
            f"got {model_type!r}; Arceus trains {', '.join(MODEL_TYPES)} "
            "(give one of these architectures' config.json)",
        )
        return None
    fields = (
        _gpt2_fields(doc, where, problem)
        if model_type == "gpt2"
        else _decoder_fields(model_type, doc, block_size or 0, where, problem)
    )
    if fields is None:
        return None
    positions = int(fields["n_positions" if model_type == "gpt2" else "max_position_embeddings"])
    block = positions if block_size is None else block_size
    if not 1 <= block <= positions:
        key = "n_positions" if model_type == "gpt2" else "max_position_embeddings"
        problem("model.block_size", f"{block} exceeds the architecture's {key} = {positions}; allowed: 1..{positions}")
        return None
    return HFModelConfig(str(model_type), tuple(sorted(fields.items())), block)


def hf_config_from_dict(d: Mapping[str, Any], block_size: int) -> HFModelConfig:
    """Rebuild a config from :meth:`HFModelConfig.as_dict` (e.g. a worker's copy); ``ValueError`` if invalid."""
    problems: list[str] = []
    config = parse_hf_config(d, block_size, "model.config", lambda p, m: problems.append(f"{p}: {m}"))
    if config is None:
        raise ValueError("; ".join(problems) or "invalid model config")
    return config


__all__ = ["MODEL_TYPES", "HFModelConfig", "hf_config_from_dict", "num_hf_blocks", "parse_hf_config"]
