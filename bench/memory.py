"""Bigger than any one device: the largest model the planner places on N devices against one device, each lending
the same memory (issue 30, item 7; goal: at least 0.8 N times the parameters of one device's largest).

For each model family (the built-in GPT, tensor-parallel splittable, and a stock transformers Llama, split by whole
layers) at a fixed width, the number of layers is searched (bisection: whether a plan exists only grows with the
devices and shrinks with the layers) for the most the real planner (``partitioner.plan``, over the daemon's block
costs ``arceusd.models.costs.block_costs`` and the planning inputs the leader builds: the spec's batch and
micro-batches, tensor-parallel groups of up to 4 for the GPT, links of 1 ms and 100 MB/s) can place on N equal
devices lending M each. Printed per N: the largest model's layers and parameters, its parameters over one
device's largest (the ratio; goal >= 0.8 N), and how much of the N x M lent its training state uses
(``arceusd.jobs.plans.memory_fit``, the number ``arceusd submit`` refuses by). No daemons and no torch. Always exits 0
(``make bench`` runs it with ``--quick``); a ratio under the goal is marked ``BELOW GOAL``.

    python bench/memory.py [--quick] [--lend-mib M]

What bounds the ratio is the pipeline's activations, not the weights: one device trains as a lone 1F1B stage
holding 2 micro-batches' stash per layer, while stage s of S holds min(S - s + 1, m) of them
(``partitioner.cost.in_flight_1f1b``, what the worker's schedule keeps), so every stage but the last two of a
deep pipeline keeps m = 4. Per layer of the 1024-wide GPT below that is 252 MB of weights, gradients and AdamW
state and 84 MB per micro-batch: 420 MB alone against up to 588 MB in a pipeline, a ratio that tends to
420 / 588 = 0.71 N as N grows, less what one device spends on the embeddings and the head, which N devices hold
once. Tensor-parallel groups (the GPT's layers, not the stock models') split a stage's stash too, which is why
the GPT keeps above the Llama. The micro-batch count sets the cap: measured here (4096 MiB each, batch 16), with
4 micro-batches the GPT reached 0.89 / 0.83 / 0.79 N on 2 / 4 / 8 devices and the Llama 0.89 / 0.76 / 0.72 N;
with 2 (every stage holds 2, as one device does) 0.98 / 0.96 / 0.98 N and 0.91 / 0.93 / 0.94 N; with 8, 0.95 /
0.90 / 0.87 N and 0.95 / 0.86 / 0.72 N. Beyond 6 devices the planner's search is its stated heuristic.
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
from partitioner import DeviceProfile, Link, LinkMatrix, PlanError, PlanInputs, TrainingParams, plan

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


def placeable(config: ModelConfig, devices: int, lend_bytes: int, tensor_parallel: int, batch: Batch) -> bool:
    """Whether the planner finds a plan for ``config`` on ``devices`` equal devices lending ``lend_bytes``."""
    ids = [f"{i:032x}" for i in range(devices)]
    inputs = PlanInputs(
        tuple(block_costs(config)),
        tuple(DeviceProfile(p, 1e11, lend_bytes) for p in ids),
        LinkMatrix.symmetric((a, b, Link(1e-3, 100e6)) for i, a in enumerate(ids) for b in ids[i + 1 :]),
        TrainingParams(batch.size, (batch.micro_batches,), max_tensor_parallel=tensor_parallel),
    )
    try:
        plan(inputs)
    except PlanError:
        return False
    return True


def most_layers(
    family: Callable[[int], ModelConfig], devices: int, lend_bytes: int, tensor_parallel: int, batch: Batch
) -> int:
    """The most layers of ``family`` the planner places (0: not even one)."""
    lo, hi = 0, 1
    while placeable(family(hi), devices, lend_bytes, tensor_parallel, batch):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if placeable(family(mid), devices, lend_bytes, tensor_parallel, batch) else (lo, mid)
    return lo


def run(quick: bool, lend_mib: int, batch: Batch) -> int:
    lend = lend_mib * MIB
    sizes = (2, 4) if quick else (2, 4, 8)
    families: list[tuple[str, Callable[[int], ModelConfig], int]] = [("gpt 1024-wide", gpt, 4)]
    if not quick:
        families.append(("llama 1024-wide", llama, 1))
    print(
        f"largest model the planner places, each device lending {lend_mib} MiB; batch {batch.size} in "
        f"{batch.micro_batches} micro-batches (goal: params(N) / params(1) >= {GOAL} N)"
    )
    short = 0
    for name, family, tp in families:
        t0 = time.perf_counter()
        one = most_layers(family, 1, lend, tp, batch)
        if one == 0:
            print(f"{name}: one device of {lend_mib} MiB holds no layer at all; give --lend-mib more")
            return 1
        base = params(family(one))
        print(f"{name}: 1 device  {one:4d} layers  {base / 1e6:8.1f} M params  (baseline)")
        for n in sizes:
            layers = most_layers(family, n, lend, tp, batch)
            p = params(family(layers))
            used = blocks_memory(block_costs(family(layers)), batch.size, batch.micro_batches).total_bytes / (n * lend)
            ratio = p / base
            short += ratio < GOAL * n
            print(
                f"{name}: {n} devices {layers:4d} layers  {p / 1e6:8.1f} M params  {ratio:5.2f}x one device "
                f"({ratio / n:.2f} N; goal {GOAL} N){'' if ratio >= GOAL * n else '  BELOW GOAL'}; training "
                f"state {used:.0%} of the {n} x {lend_mib} MiB lent"
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
