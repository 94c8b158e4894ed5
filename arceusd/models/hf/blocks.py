"""The blocks of a stock ``transformers`` causal LM, built from the installed library's own classes (workers only).

Owns: :func:`build_hf_block` and :func:`tie_hf_blocks`. Blocks, in order (``n_layer + 2``):
  0            embeddings: ``embed_tokens`` (gpt2: ``wte`` + ``wpe``)              (B, T) int64 -> (B, T, C)
  1..n_layer   one decoder layer (``LlamaDecoderLayer``, ``GPT2Block``, ...) as ``layer``; rotary embeddings
               are computed inside the block from its own ``rotary`` module (a buffer, no parameter), so a
               stage needs nothing from the embedding stage but the hidden states    (B, T, C) -> (B, T, C)
  n_layer + 1  final norm (``norm`` / gpt2 ``ln_f``) + ``lm_head``                  (B, T, C) -> (B, T, V)
Parameter names map to the architecture's checkpoint keys by :mod:`arceusd.models.hf.keys`.

Attention is the library's SDPA path with no mask (causal, every position attends to its past: no padding in
packed training sequences), the same computation as ``AutoModelForCausalLM`` on the same ids. Initialisation is
the library's scheme (normal(0, initializer_range) for matrices and embeddings, GPT-2's residual projections
scaled by 1/sqrt(2 n_layer), norms 1, biases 0) drawn from the block's own generator (``models/init.py``), or
the tensors of initial weights (:mod:`arceusd.models.hf.weights`).

GPT-2's activation (``gelu_new``, the tanh approximation of GELU) is the same function computed by torch's one
fused kernel (``F.gelu(x, approximate="tanh")``) instead of the library's seven element-wise operations written
out in Python (:class:`TanhGELU`): the same values (to float rounding), a third of the memory traffic; the
config and the export still say ``gelu_new``, which ``transformers`` loads as its own.

Tied embeddings: with ``tie_word_embeddings`` the head's ``lm_head.weight`` *is* the embedding's weight.
:func:`tie_hf_blocks` shares the parameter when a stage holds block 0 and the head. A stage that holds the head
without block 0 gets its own copy, initialised as the embedding's tensor (block 0 built from the same generator,
or read from the same initial weights), and the first and the last stage sum their gradients of it before every
optimizer step (``arceusd/worker/tied.py``), so both copies take the same updates and stay bit-identical: the
same training as one process holding one weight.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from arceusd.models.hf.config import HFModelConfig, num_hf_blocks
from arceusd.models.hf.keys import block_tensors
from arceusd.models.hf.weights import load_block_tensors
from arceusd.models.init import block_generator, fill_normal

_LAYERS: dict[str, Any] = {
    "gpt2": GPT2Block,
    "llama": LlamaDecoderLayer,
    "qwen2": Qwen2DecoderLayer,
    "mistral": MistralDecoderLayer,
}


class TanhGELU(nn.Module):
    """``gelu_new`` (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) in torch's fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x, approximate="tanh")


def transformers_config(config: HFModelConfig) -> PretrainedConfig:
    """The library's config object for ``config`` (SDPA attention, no cache)."""
    fields: dict[str, Any] = dict(config.fields)
    if config.is_gpt2:
        fields["n_ctx"] = fields["n_positions"]
    fields.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)  # the tokenizer's (export.py)
    out = AutoConfig.for_model(config.model_type, **fields)
    out._attn_implementation = "sdpa"
    out.use_cache = False
    return out


class HFEmbedding(nn.Module):
    """Token embeddings (gpt2: + learned positions)."""

    def __init__(self, config: HFModelConfig) -> None:
        super().__init__()
        self.gpt2 = config.is_gpt2
        self.block_size = config.block_size
        if self.gpt2:
            self.wte = nn.Embedding(config.vocab_size, config.hidden)
            self.wpe = nn.Embedding(config.positions, config.hidden)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden)

    def token_weight(self) -> nn.Parameter:
        table: nn.Embedding = self.wte if self.gpt2 else self.embed_tokens
        return cast(nn.Parameter, table.weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, T = idx.shape
        if self.block_size < T:
            raise ValueError(f"sequence length {T} exceeds the model's block_size {self.block_size}")
        if not self.gpt2:
            out: torch.Tensor = self.embed_tokens(idx)  # (B, T) -> (B, T, C)
            return out
        pos = torch.arange(T, dtype=torch.long, device=idx.device)  # (T,)
        x: torch.Tensor = self.wte(idx) + self.wpe(pos)  # (B, T, C) + (T, C)
        return x


RopeCosSin = tuple[torch.Tensor, torch.Tensor]


class HFDecoderBlock(nn.Module):
    """One decoder layer of the library's class; rotary embeddings computed here, once for each sequence length,
    device and dtype: the same positions every step give the same ``cos``/``sin``, which the library's model
    computes once per forward (here a stage's every layer recomputed them every step: a dozen kernels a layer)."""

    def __init__(self, config: HFModelConfig, layer: nn.Module, rotary: nn.Module | None) -> None:
        super().__init__()
        self.gpt2 = config.is_gpt2
        self.layer = layer
        self.rotary = rotary
        self._rope: tuple[tuple[int, torch.device, torch.dtype], torch.Tensor, torch.Tensor, RopeCosSin] | None = None
        """((length, device, dtype), the frequencies' tensor, positions, (cos, sin)) of the last forward: not a
        buffer (neither saved nor moved; ``.to()`` replaces the frequencies' tensor, so a moved block recomputes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gpt2:
            out: torch.Tensor = self.layer(x, attention_mask=None)  # (B, T, C)
            return out
        assert self.rotary is not None
        key, inv_freq = (x.shape[1], x.device, x.dtype), cast(torch.Tensor, self.rotary.inv_freq)
        cached = self._rope
        if cached is not None and cached[0] == key and cached[1] is inv_freq:
            pos, cos_sin = cached[2], cached[3]
        else:
            pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # (1, T)
            cos_sin = cast(RopeCosSin, self.rotary(x, pos))  # each (1, T, hd)
            # A RoPE that rescales with the length it sees (dynamic, longrope) is recomputed every time; an
            # inference tensor could not be saved for a later training step's backward.
            static = not any(kind in str(getattr(self.rotary, "rope_type", "")) for kind in ("dynamic", "longrope"))
            if static and not torch.is_inference_mode_enabled():
                self._rope = (key, inv_freq, pos, cos_sin)
        y: torch.Tensor = self.layer(x, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
        return y


class HFHead(nn.Module):
    """Final norm + LM head (``lm_head.weight`` is the embedding's when tied: :func:`tie_hf_blocks`)."""

    def __init__(self, config: HFModelConfig, tc: PretrainedConfig) -> None:
        super().__init__()
        self.gpt2 = config.is_gpt2
        if self.gpt2:
            self.ln_f = nn.LayerNorm(config.hidden, eps=float(config.get("layer_norm_epsilon")))
        else:
            self.norm = LlamaRMSNorm(config.hidden, eps=float(config.get("rms_norm_eps")))
        self.lm_head = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_f(x) if self.gpt2 else self.norm(x)  # (B, T, C)
        logits: torch.Tensor = self.lm_head(h)  # (B, T, V)
        return logits


def _module(config: HFModelConfig, tc: PretrainedConfig, index: int) -> nn.Module:
    n = num_hf_blocks(config)
    with torch.device("meta"):
        if index == 0:
            module: nn.Module = HFEmbedding(config)
        elif index == n - 1:
            module = HFHead(config, tc)
        else:
            kind = _LAYERS[config.model_type]
            layer = kind(tc, layer_idx=index - 1)
            if config.is_gpt2:
                layer.mlp.act = TanhGELU()  # gelu_new, fused (the module docstring)
            module = HFDecoderBlock(config, layer, None)
    module = module.to_empty(device="cpu")
    if isinstance(module, HFDecoderBlock) and not config.is_gpt2:
        module.rotary = LlamaRotaryEmbedding(tc)  # type: ignore[arg-type]  # buffers computed on the CPU, never on meta
    if isinstance(module, HFHead) and config.tied:
        del module.lm_head.weight  # set by tie_hf_blocks: the embedding's parameter, or a copy of it
    return module


@torch.no_grad()
def _init(module: nn.Module, config: HFModelConfig, gen: torch.Generator) -> None:
    std = float(config.get("initializer_range"))
    residual = std / math.sqrt(2 * config.n_layer)
    for name, p in module.named_parameters():  # definition order: deterministic
        if p.dim() >= 2:
            gpt2_residual = config.is_gpt2 and name.endswith("c_proj.weight")
            fill_normal(p, residual if gpt2_residual else std, gen)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)  # norm weights


def build_hf_block(config: HFModelConfig, index: int, seed: int, weights: Path | None = None) -> nn.Module:
    """Block ``index``: from ``weights`` (a safetensors file under the architecture's keys) when given, else
    initialised from ``(seed, index)`` alone."""
    n = num_hf_blocks(config)
    if not 0 <= index < n:
        raise ValueError(f"block index {index} out of range: the model has {n} blocks")
    module = _module(config, transformers_config(config), index)
    expected = block_tensors(config, index)
    got = {k: tuple(p.shape) for k, p in module.named_parameters()}
    if got != expected:  # the library's classes disagree with keys.py: a transformers version we do not know
        raise RuntimeError(f"block {index}: the installed transformers builds {got}, Arceus expects {expected}")
    if weights is None:
        _init(module, config, block_generator(seed, index))
    else:
        tensors = load_block_tensors(weights, config, index)
        with torch.no_grad():
            for name, p in module.named_parameters():
                p.copy_(tensors[name])
    return module


def tie_hf_blocks(config: HFModelConfig, blocks: dict[int, nn.Module], seed: int, weights: Path | None = None) -> None:
    """Share the embedding as the head's weight when one stage holds both ends; a head without block 0 gets a
    copy of the embedding's initial tensor (block 0 built from ``seed`` or read from ``weights``, as the stage
    holding it builds it)."""
    if not config.tied:
        return
    last = num_hf_blocks(config) - 1
    if last not in blocks:
        return
    head = blocks[last]
    assert isinstance(head, HFHead)
    if 0 in blocks:
        emb = blocks[0]
        assert isinstance(emb, HFEmbedding)
        head.lm_head.weight = emb.token_weight()
        return
    source = build_hf_block(config, 0, seed, weights)
    assert isinstance(source, HFEmbedding)
    copy = source.token_weight().detach().clone()
    if config.lora is not None:  # a frozen base (lora.py): the copy is a buffer too, and nothing is exchanged
        head.lm_head.register_buffer("weight", copy)
    else:
        head.lm_head.weight = nn.Parameter(copy)


__all__ = [
    "HFDecoderBlock",
    "HFEmbedding",
    "HFHead",
    "TanhGELU",
    "build_hf_block",
    "tie_hf_blocks",
    "transformers_config",
]
