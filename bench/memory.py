"""Bigger than any one device: the largest model the planner places on N devices against one device, each lending
the same memory (issue 30, item 7; goal: at least 0.8 N times the parameters of one device's largest).

For each model family (the built-in GPT and a stock transformers Llama, both tensor-parallel splittable) at a fixed
width, the number of layers is searched (bisection: whether a plan exists only grows with the
devices and shrinks with the layers) for the most the real planner (``partitioner.plan``, over the daemon's block
costs ``arceusd.models.costs.block_costs`` and the planning inputs the leader builds: the spec's batch and
micro-batches, tensor-parallel groups of up to 4, links of 1 ms and 100 MB/s) can place on N equal
devices lending M each. Printed per N: the largest model's layers and parameters, its parameters over one
device's largest (the ratio; goal >= 0.8 N), and how much of the N x M lent its training state uses
(``arceusd.jobs.plans.memory_fit``, the number ``arceusd submit`` refuses by). No daemons and no torch. Always exits 0
(``make bench`` runs it with ``--quick``); a ratio under the goal is marked ``BELOW GOAL``.

    python bench/memory.py [--quick] [--lend-mib M]

Printed beside each: whether the largest keeps the pipeline's full warm-up or a cap on the micro-batches in
flight (``Plan.in_flight_cap``, which the planner takes only when nothing fits otherwise; slower: at a cap of 1 the
devices take turns), and the largest that keeps the full warm-up.

What bounded the ratio before the cap is the pipeline's activations, not the weights: stage s of S holds
min(S - s + 1, m) micro-batches' stashes in 1F1B (``partitioner.cost.in_flight_1f1b``), so every stage but the
last two of a deep pipeline keeps m = 4. Per layer of the 1024-wide GPT that is 252 MB of weights, gradients and
AdamW state and 84 MB per micro-batch: 336 MB alone (one micro-batch in flight) against up to 588 MB in a
pipeline. With the cap every stage may hold one, as one device does, and the ratio is about N (a little over: the
embeddings and the head are held once). Measured (4096 MiB each, batch 16 in 4 micro-batches, 28 Nov): the GPT
1.03 / 1.02 / 1.03 N on 2 / 4 / 8 devices, the Llama 1.03 / 1.02 / 1.02 N; with the full warm-up 0.74 / 0.70 /
0.66 N and 0.74 / 0.65 / 0.64 N against the same one-device baseline. Beyond 6 devices the planner's search is its
stated heuristic.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arceusd.jobs.plans.memory_fit import MIB, blocks_memory
from arceusd.models.config import GPTConfig, ModelConfig
from arceusd.models.costs import block_costs
from arceusd.models.hf.config import hf_config_from_dict
from partitioner import DeviceProfile, Link, LinkMatrix, Plan, PlanError, PlanInputs, TrainingParams, plan

GOAL = 0.8


def gpt(layers: int) -> GPTConfig:
    return GPTConfig(n_layer=layers, n_head=16, n_embd=1024, block_size=256, vocab_size=8192)


def llama(layers: int) -> ModelConfig:
    fields = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 2752,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": 8192,
        "tie_word_embeddings": False,
        "max_position_embeddings": 256,
    }
    return hf_config_from_dict(fields, block_size=256)


def params(config: ModelConfig) -> int:
    """Parameters of the model (what its blocks hold, 4 bytes each)."""
    return sum(b.param_bytes for b in block_costs(config)) // 4


@dataclass(frozen=True)
class Batch:
    """The spec's global batch and its micro-batches."""

    size: int = 16
    micro_batches: int = 4


def placed(config: ModelConfig, devices: int, lend_bytes: int, tensor_parallel: int, batch: Batch) -> Plan | None:
    """The planner's plan for ``config`` on ``devices`` equal devices lending ``lend_bytes`` (None: none fits)."""
    ids = [f"{i:032x}" for i in range(devices)]
    inputs = PlanInputs(
        tuple(block_costs(config)),
        tuple(DeviceProfile(p, 1e11, lend_bytes) for p in ids),
        LinkMatrix.symmetric((a, b, Link(1e-3, 100e6)) for i, a in enumerate(ids) for b in ids[i + 1 :]),
        TrainingParams(batch.size, (batch.micro_batches,), max_tensor_parallel=tensor_parallel),
    )
    try:
        return plan(inputs)
    except PlanError:
        return None


def most_layers(
    family: Callable[[int], ModelConfig],
    devices: int,
    lend_bytes: int,
    tensor_parallel: int,
    batch: Batch,
    warm_up: bool = False,
) -> tuple[int, Plan | None]:
    """The most layers of ``family`` the planner places (0: not even one), and its plan; ``warm_up``: only plans
    that keep the pipeline's full warm-up (no ``in_flight_cap``: the speed of a pipeline, as before the cap)."""

    def fits(layers: int) -> Plan | None:
        found = placed(family(layers), devices, lend_bytes, tensor_parallel, batch)
        return None if found is None or (warm_up and found.in_flight_cap) else found

    lo, hi = 0, 1
    best = found = fits(hi)
    while found is not None:
        lo, best, hi = hi, found, hi * 2
        found = fits(hi)
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        found = fits(mid)
        if found is not None:
            lo, best = mid, found
        else:
            hi = mid
    return lo, best if lo else None


def in_flight(p: Plan | None) -> str:
    """How many micro-batches the plan's stages keep in flight at most (a cap: the model fits no other way)."""
    if p is None:
        return ""
    return f"at most {p.in_flight_cap} in flight" if p.in_flight_cap else f"{p.schedule}, the full warm-up"


def run(quick: bool, lend_mib: int, batch: Batch) -> int:
    lend = lend_mib * MIB
    sizes = (2, 4) if quick else (2, 4, 8)
    families: list[tuple[str, Callable[[int], ModelConfig], int]] = [("gpt 1024-wide", gpt, 4)]
    if not quick:
        families.append(("llama 1024-wide", llama, 4))
    print(
        f"largest model the planner places, each device lending {lend_mib} MiB; batch {batch.size} in "
        f"{batch.micro_batches} micro-batches (goal: params(N) / params(1) >= {GOAL} N)"
    )
    short = 0
    for name, family, tp in families:
        t0 = time.perf_counter()
        one, one_plan = most_layers(family, 1, lend, tp, batch)
        if one == 0:
            print(f"{name}: one device of {lend_mib} MiB holds no layer at all; give --lend-mib more")
            return 1
        base = params(family(one))
        print(f"{name}: 1 device  {one:4d} layers  {base / 1e6:8.1f} M params  (baseline; {in_flight(one_plan)})")
        for n in sizes:
            layers, largest = most_layers(family, n, lend, tp, batch)
            full, _ = most_layers(family, n, lend, tp, batch, warm_up=True)
            p = params(family(layers))
            used = blocks_memory(block_costs(family(layers)), batch.size, batch.micro_batches).total_bytes / (n * lend)
            ratio = p / base
            short += ratio < GOAL * n
            print(
                f"{name}: {n} devices {layers:4d} layers  {p / 1e6:8.1f} M params  {ratio:5.2f}x one device "
                f"({ratio / n:.2f} N; goal {GOAL} N){'' if ratio >= GOAL * n else '  BELOW GOAL'}; training "
                f"state {used:.0%} of the {n} x {lend_mib} MiB lent; {in_flight(largest)}; with the full "
                f"warm-up {full} layers ({params(family(full)) / base:.2f}x)"
            )
        print(f"{name}: searched in {time.perf_counter() - t0:.1f} s")
    if short:
        print(f"{short} size(s) below the goal (see the module docstring for why)")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 and 4 devices, the GPT only")
    parser.add_argument("--lend-mib", type=int, default=4096, help="memory each device lends (MiB)")
    parser.add_argument("--batch", type=int, default=16, help="the global batch (samples per step)")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step")
    args = parser.parse_args()
    sys.exit(run(args.quick, args.lend_mib, Batch(args.batch, args.micro_batches)))


if __name__ == "__main__":
    main()
