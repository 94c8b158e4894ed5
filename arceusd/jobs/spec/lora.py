"""The job spec's ``[lora]`` section (torch-free): fine-tune low-rank adapters on a frozen stock causal LM.

Owns::

    [lora]  r = 8                 # the adapters' rank, 1..1024, at most the model's hidden size
            alpha = 8             # scale alpha / r (peft's lora_alpha), an integer 1..65536
            dropout = 0.0         # on the adapters' input, [0, 0.5]; 0 keeps training exact across processes
            target_modules = ["q_proj", "v_proj"]   # names of linear layers of the decoder layers (required)
            merge = false         # the export also writes the base with the adapters merged in

read and bounded like the other fields (:mod:`arceusd.jobs.spec.parser` calls :func:`parse_lora`), with one line
per problem naming the field and the fix. Targets are checked against the architecture by the name tables of
:mod:`arceusd.models.hf.lora_spec` (no module is built: the daemon never imports torch). ``[lora]`` applies only
to ``[model] type = "hf"`` and not yet to a tied embedding (``tie_word_embeddings = true``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from arceusd.jobs.spec.fields import FieldReader
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora_spec import (
    MAX_ALPHA,
    MAX_DROPOUT,
    MAX_RANK,
    MAX_TARGETS,
    LoraSpec,
    matched_paths,
    names_for,
)

LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "merge")


def _targets(r: FieldReader, t: Mapping[str, Any], model: HFModelConfig | None) -> tuple[str, ...] | None:
    value = t.get("target_modules")
    hint = f"; {model.model_type} offers: {', '.join(names_for(model.model_type))}" if model is not None else ""
    if value is None:
        r.problem(
            "lora.target_modules", f'missing required field: the layers to adapt, e.g. ["q_proj", "v_proj"]{hint}'
        )
        return None
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_TARGETS
        or not all(isinstance(v, str) and 0 < len(v) <= 64 for v in value)
    ):
        r.problem(
            "lora.target_modules", f"must be a list of 1 to {MAX_TARGETS} module names, got {str(value)[:60]}{hint}"
        )
        return None
    if len(set(value)) != len(value):
        r.problem("lora.target_modules", f"names a module twice ({value}); list each once")
        return None
    if model is None:
        return tuple(sorted(value))
    bad = [v for v in value if not matched_paths(model.model_type, (v,))]
    if bad:
        r.problem(
            "lora.target_modules",
            f"{bad[0]!r} names no module of a {model.model_type} decoder layer; "
            f"use one of: {', '.join(names_for(model.model_type))}",
        )
        return None
    return tuple(sorted(value))


def parse_lora(r: FieldReader, doc: Mapping[str, Any], model: object) -> LoraSpec | None:
    """The ``[lora]`` table of ``doc`` checked against ``model`` (the parsed ``[model]``, None when it was
    invalid); None when there is no table or it has a problem (recorded on ``r``)."""
    t = r.table(doc, "lora", "", required=False)
    if t is None:
        return None
    r.unknown_keys(t, LORA_KEYS, "lora")
    hf = model if isinstance(model, HFModelConfig) else None
    if model is not None and hf is None:
        r.problem("lora", 'LoRA adapts a stock transformers model: use [model] type = "hf" or remove [lora]')
    if hf is not None and hf.tied:
        r.problem(
            "lora",
            "LoRA with model.config.tie_word_embeddings = true is not supported yet; set it to false "
            "(the LM head then starts as a copy of the embedding)",
        )
    rank = r.integer(t, "r", "lora", 8, lo=1, hi=MAX_RANK)
    if rank is not None and hf is not None and rank > hf.hidden:
        r.problem("lora.r", f"{rank} exceeds the model's hidden size {hf.hidden}; allowed: 1..{hf.hidden}")
        rank = None
    alpha = r.integer(t, "alpha", "lora", 8, lo=1, hi=MAX_ALPHA)
    dropout = r.number(t, "dropout", "lora", 0.0, lo=0.0, hi=MAX_DROPOUT)
    merge = r.boolean(t, "merge", "lora", False)
    targets = _targets(r, t, hf)
    if rank is None or alpha is None or dropout is None or merge is None or targets is None:
        return None
    return LoraSpec(r=rank, alpha=alpha, targets=targets, dropout=dropout, merge=merge)


def with_lora(r: FieldReader, doc: Mapping[str, Any], model: Any) -> Any:
    """``model`` with the spec's ``[lora]`` attached (a stock LM), or as it was when the spec has none."""
    lora = parse_lora(r, doc, model)
    if lora is None or not isinstance(model, HFModelConfig):
        return model
    return replace(model, lora=lora)


def lora_dict(lora: LoraSpec) -> dict[str, Any]:
    """The ``[lora]`` table of a spec's canonical form."""
    return {
        "r": lora.r,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": list(lora.targets),
        "merge": lora.merge,
    }


__all__ = ["LORA_KEYS", "lora_dict", "parse_lora", "with_lora"]
