"""The architecture's own tensor names and shapes, per Arceus block (torch-free).

Owns: the mapping between a block's local parameter names (what :mod:`arceusd.models.hf.blocks` builds, e.g.
``layer.self_attn.q_proj.weight`` in block 3) and the architecture's checkpoint keys
(``model.layers.2.self_attn.q_proj.weight``), and every key's expected shape from the config. Initial weights
are checked against :func:`expected_tensors` and exports are written with :func:`hf_key`.

Tied embeddings (``tie_word_embeddings``): the checkpoint stores the weight once, under the embedding's key, so
:func:`block_tensors` lists no ``lm_head.weight`` for a tied head. A stage that holds the head but not block 0
trains its own copy of the weight all the same (``lm_head.weight``, :func:`tied_names`); the copy is never
written under a key of its own (``export.py``, ``arceusd/jobs/procs/reslice.py``).
"""

from __future__ import annotations

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks

Shape = tuple[int, ...]


def _layer_prefix(config: HFModelConfig, layer: int) -> str:
    return f"transformer.h.{layer}." if config.is_gpt2 else f"model.layers.{layer}."


def hf_key(config: HFModelConfig, index: int, local: str) -> str:
    """The checkpoint key of parameter ``local`` of block ``index``."""
    n = num_hf_blocks(config)
    if index == 0:
        return f"transformer.{local}" if config.is_gpt2 else f"model.{local}"
    if index == n - 1:
        if local.startswith("lm_head."):
            return local
        return f"transformer.{local}" if config.is_gpt2 else f"model.{local}"
    if not local.startswith("layer."):
        raise ValueError(f"block {index} has no parameter {local!r}")
    return _layer_prefix(config, index - 1) + local[len("layer.") :]


def block_tensors(config: HFModelConfig, index: int) -> dict[str, Shape]:
    """Block ``index``'s parameters: local name -> shape (a tied head holds no ``lm_head.weight`` of its own)."""
    C, V, n = config.hidden, config.vocab_size, num_hf_blocks(config)
    inner = config.intermediate
    if index == 0:
        if config.is_gpt2:
            return {"wte.weight": (V, C), "wpe.weight": (config.positions, C)}
        return {"embed_tokens.weight": (V, C)}
    if index == n - 1:
        out: dict[str, Shape] = {"ln_f.weight": (C,), "ln_f.bias": (C,)} if config.is_gpt2 else {"norm.weight": (C,)}
        if not config.tied:
            out["lm_head.weight"] = (V, C)
        return out
    if not 0 < index < n - 1:
        raise ValueError(f"block index {index} out of range: the model has {n} blocks")
    if config.is_gpt2:
        return {
            f"layer.{k}": s
            for k, s in {
                "ln_1.weight": (C,),
                "ln_1.bias": (C,),
                "attn.c_attn.weight": (C, 3 * C),
                "attn.c_attn.bias": (3 * C,),
                "attn.c_proj.weight": (C, C),
                "attn.c_proj.bias": (C,),
                "ln_2.weight": (C,),
                "ln_2.bias": (C,),
                "mlp.c_fc.weight": (C, inner),
                "mlp.c_fc.bias": (inner,),
                "mlp.c_proj.weight": (inner, C),
                "mlp.c_proj.bias": (C,),
            }.items()
        }
    q, kv = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
    t: dict[str, Shape] = {
        "self_attn.q_proj.weight": (q, C),
        "self_attn.k_proj.weight": (kv, C),
        "self_attn.v_proj.weight": (kv, C),
        "self_attn.o_proj.weight": (C, q),
        "mlp.gate_proj.weight": (inner, C),
        "mlp.up_proj.weight": (inner, C),
        "mlp.down_proj.weight": (C, inner),
        "input_layernorm.weight": (C,),
        "post_attention_layernorm.weight": (C,),
    }
    attn_bias = config.model_type == "qwen2" or (config.model_type == "llama" and config.get("attention_bias"))
    if attn_bias:
        t.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    if config.model_type == "llama" and config.get("attention_bias"):
        t["self_attn.o_proj.bias"] = (C,)
    if config.model_type == "llama" and config.get("mlp_bias"):
        t.update({"mlp.gate_proj.bias": (inner,), "mlp.up_proj.bias": (inner,), "mlp.down_proj.bias": (C,)})
    return {f"layer.{k}": s for k, s in t.items()}


def expected_tensors(config: HFModelConfig) -> dict[str, tuple[int, str, Shape]]:
    """Every checkpoint key of the model -> (block index, local name, shape)."""
    out: dict[str, tuple[int, str, Shape]] = {}
    for i in range(num_hf_blocks(config)):
        for local, shape in block_tensors(config, i).items():
            out[hf_key(config, i, local)] = (i, local, shape)
    return out


def untied_head_source(config: HFModelConfig, key: str) -> str | None:
    """The key an untied head's weight starts from when a (tied) checkpoint stores no ``lm_head.weight``."""
    if key == "lm_head.weight" and not config.tied:
        return "transformer.wte.weight" if config.is_gpt2 else "model.embed_tokens.weight"
    return None


def tied_names(config: HFModelConfig) -> tuple[str, str] | None:
    """For a tied model, the local names of the tied weight in block 0 (the owner, whose key the checkpoint
    stores) and in the head (the copy a stage without block 0 trains); None when untied."""
    if not config.tied:
        return None
    return ("wte.weight" if config.is_gpt2 else "embed_tokens.weight"), "lm_head.weight"


def param_count(config: HFModelConfig, index: int) -> int:
    """Parameters held by block ``index``."""
    total = 0
    for shape in block_tensors(config, index).values():
        size = 1
        for d in shape:
            size *= d
        total += size
    return total


__all__ = ["block_tensors", "expected_tensors", "hf_key", "param_count", "tied_names"]
