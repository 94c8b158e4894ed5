"""A LoRA fine-tuning job's adapter settings and the modules each architecture can adapt (torch-free).

Owns: :class:`LoraSpec` (rank, alpha, dropout, target module names, whether the export also merges the adapters
into the base) and the name tables of the linear layers inside one decoder layer of each architecture
(:data:`LAYER_LINEARS`), with :func:`matched_paths`, the rule by which a target names them: a target matches a
layer's module whose path inside the decoder layer equals it or ends with ``"." + target``, peft's own rule for a
list of ``target_modules`` (so GPT-2's ``c_proj`` names both ``attn.c_proj`` and ``mlp.c_proj``, and
``attn.c_proj`` only the first). Only decoder layers carry adapters; embeddings, final norm and LM head stay
frozen. Bounds: :data:`MAX_RANK`, :data:`MAX_ALPHA`, :data:`MAX_DROPOUT`, :data:`MAX_TARGETS`.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_RANK = 1024
MAX_ALPHA = 65536
MAX_DROPOUT = 0.5
MAX_TARGETS = 16

_DECODER = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)

LAYER_LINEARS: dict[str, tuple[str, ...]] = {
    "llama": _DECODER,
    "qwen2": _DECODER,
    "mistral": _DECODER,
    "gpt2": ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),  # transformers' Conv1D: weight (in, out)
}
"""The linear layers of one decoder layer, by their path inside it (``LlamaDecoderLayer``, ``GPT2Block``, ...)."""


@dataclass(frozen=True)
class LoraSpec:
    """Low-rank adapters on ``targets`` of every decoder layer; the base model is frozen.

    ``r``: the adapters' rank; ``alpha``: their scale is ``alpha / r`` (peft's ``lora_alpha``, an integer as
    peft types it); ``dropout``: on the adapters' input (0: exact, the same in every process; more draws from
    each worker's own RNG); ``targets``: module names (sorted, unique), each matching at least one of the
    architecture's :data:`LAYER_LINEARS`; ``merge``: the export also writes the base with the adapters merged
    in, as a plain ``from_pretrained`` folder."""

    r: int
    alpha: int
    targets: tuple[str, ...]
    dropout: float = 0.0
    merge: bool = False

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


def names_for(model_type: str) -> tuple[str, ...]:
    """The target names an architecture offers: each linear's own name, then their paths inside the layer."""
    paths = LAYER_LINEARS[model_type]
    short = tuple(dict.fromkeys(p.rpartition(".")[2] for p in paths))
    return short + paths


def matched_paths(model_type: str, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The decoder layer's linear paths the targets name (in the layer's order)."""
    return tuple(p for p in LAYER_LINEARS[model_type] if any(p == t or p.endswith("." + t) for t in targets))


__all__ = [
    "LAYER_LINEARS",
    "MAX_ALPHA",
    "MAX_DROPOUT",
    "MAX_RANK",
    "MAX_TARGETS",
    "LoraSpec",
    "matched_paths",
    "names_for",
]
