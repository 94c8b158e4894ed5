"""Synthetic planner inputs for tests and benchmarks: a GPT-like block list and seeded random clusters.

Pure: randomness only from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random

from partitioner.blocks import BlockCost
from partitioner.inputs import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams

GIB = 1 << 30


def gpt_like_blocks(
    n_layer: int, n_embd: int, n_head: int, seq: int, vocab: int, bytes_per_el: int = 4
) -> tuple[BlockCost, ...]:
    """Embedding, ``n_layer`` transformer blocks (attention heads + 4x MLP columns), final norm + LM head.

    FLOPs per sample: 2 x params x tokens forward (+ attention scores), backward 2x forward. Optimizer
    state is Adam's two moments (2 x params). Stash ~ 16 activations of width n_embd per token (no
    recomputation).
    """
    d, t = n_embd, seq
    act = t * d * bytes_per_el
    emb_params = vocab * d + seq * d
    blocks = [
        BlockCost("embed", emb_params * bytes_per_el, 2 * emb_params * bytes_per_el, act, act, 2.0 * t * d, 4.0 * t * d)
    ]
    layer_params = 12 * d * d + 13 * d
    fwd = 2.0 * layer_params * t + 4.0 * t * t * d
    for i in range(n_layer):
        blocks.append(
            BlockCost(
                f"h.{i}",
                layer_params * bytes_per_el,
                2 * layer_params * bytes_per_el,
                act,
                16 * act,
                fwd,
                2 * fwd,
                heads=n_head,
                mlp_columns=4 * d,
            )
        )
    head_params = vocab * d + 2 * d
    blocks.append(
        BlockCost(
            "lm_head",
            head_params * bytes_per_el,
            2 * head_params * bytes_per_el,
            t * vocab * bytes_per_el,
            t * (vocab + d) * bytes_per_el,
            2.0 * head_params * t,
            4.0 * head_params * t,
        )
    )
    return tuple(blocks)


def random_cluster(
    rng: random.Random, n: int, base_flops: float = 2e12, mem_range_gib: tuple[float, float] = (2.0, 32.0)
) -> tuple[tuple[DeviceProfile, ...], LinkMatrix]:
    """``n`` devices: speed 1-8x ``base_flops``, memory in ``mem_range_gib``, symmetric links with rtt
    0.1-50 ms and bandwidth 10 Mbit/s - 10 Gbit/s (log-uniform)."""
    devices = tuple(
        DeviceProfile(
            peer_id=f"peer{i:02d}-{rng.randrange(1 << 30):08x}",
            flops_per_s=base_flops * rng.uniform(1.0, 8.0),
            memory_bytes=int(rng.uniform(*mem_range_gib) * GIB),
            kind=rng.choice(("cpu", "cuda", "mps")),
        )
        for i in range(n)
    )
    pairs = []
    for a in range(n):
        for b in range(a + 1, n):
            rtt = 10 ** rng.uniform(-4, -1.30103)  # 0.1 ms .. 50 ms
            bw = 10 ** rng.uniform(7, 10) / 8  # 10 Mbit/s .. 10 Gbit/s in bytes/s
            pairs.append((devices[a].peer_id, devices[b].peer_id, Link(rtt, bw)))
    return devices, LinkMatrix.symmetric(pairs)


def random_inputs(
    rng: random.Random,
    n_devices: int,
    blocks: tuple[BlockCost, ...],
    training: TrainingParams,
    mem_range_gib: tuple[float, float] = (2.0, 32.0),
) -> PlanInputs:
    devices, links = random_cluster(rng, n_devices, mem_range_gib=mem_range_gib)
    return PlanInputs(blocks, devices, links, training)
