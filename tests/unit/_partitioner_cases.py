"""Shared builders for the partitioner tests: small seeded GPT-like instances."""

from __future__ import annotations

import dataclasses
import random

from partitioner.inputs import Link, LinkMatrix, PlanInputs, TrainingParams
from partitioner.synthetic import gpt_like_blocks, random_inputs

MIB = 1 << 20


def small_instance(
    seed: int,
    n_devices: int,
    n_layer: int,
    max_tp: int = 2,
    mem_gib: tuple[float, float] = (0.02, 0.12),
    batch: int = 16,
    fast_links: bool = False,
    counts: tuple[int, ...] = (1, 2, 4, 8),
) -> PlanInputs:
    """A GPT-like model of ``n_layer + 2`` blocks on ``n_devices`` random devices (tight memory).

    ``fast_links``: every link 20 us / 100 GB/s (NVLink-like), where tensor parallelism pays off.
    """
    blocks = gpt_like_blocks(n_layer, 256, 4, 128, 2048)
    training = TrainingParams(batch, counts, wire_bytes_per_element=2, max_tensor_parallel=max_tp)
    inputs = random_inputs(random.Random(seed), n_devices, blocks, training, mem_range_gib=mem_gib)
    if fast_links:
        ids = [d.peer_id for d in inputs.devices]
        fast = Link(2e-5, 1e11)
        links = LinkMatrix.symmetric([(a, b, fast) for a in ids for b in ids if a < b])
        inputs = dataclasses.replace(inputs, links=links)
    return inputs


def calibrated(inputs: PlanInputs, seed: int) -> PlanInputs:
    """``inputs`` with seeded random calibration on every device (block efficiency 0.3-1.2, dispatch
    0-2 ms per block, optimizer 0-20 ns per parameter) and link (0-5 ms per message), of the size the
    profile measures on CPUs: large enough to change plans."""
    rng = random.Random(seed)
    devices = tuple(
        dataclasses.replace(
            d,
            block_efficiency=rng.uniform(0.3, 1.2),
            dispatch_s=rng.uniform(0, 2e-3),
            optimizer_s_per_param=rng.uniform(0, 2e-8),
        )
        for d in inputs.devices
    )
    links = LinkMatrix(
        tuple((a, b, dataclasses.replace(lk, message_s=rng.uniform(0, 5e-3))) for a, b, lk in inputs.links.links)
    )
    return dataclasses.replace(inputs, devices=devices, links=links)
