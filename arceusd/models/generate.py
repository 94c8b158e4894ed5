"""Sampling text from a trained GPT (the full model as ``build_reference_model`` gives it)."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    block_size: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend ``prompt`` (1 x T token ids) by ``max_new_tokens`` sampled tokens (nanoGPT's loop)."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    model.eval()
    idx = prompt
    for _ in range(max_new_tokens):
        context = idx[:, -block_size:]  # (1, <=T)
        logits = model(context)[:, -1, :] / temperature  # (1, vocab)
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return idx
