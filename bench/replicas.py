"""Replicas in one process: tokens/s of 2 data-parallel replicas against one device alone, on an emulated link.

The worker's arithmetic alone (``bench/swarm_netns.py`` runs the same comparison through daemons, each in its own
network namespace with shaped links). Here each
"device" is a thread running a ``StageEngine`` with 1 torch thread; the replicas' ring is the in-memory ring,
optionally shaped: a send blocks its sender for rtt/2 + bytes / bandwidth before the frame is delivered (a
serialised link per direction). Runs, all in this process and this run:

  (a) one device alone, the whole global batch per step (the baseline);
  (b) 2 replicas, synchronous all-reduce, unshaped ring (a fast link);
  (c) 2 replicas, synchronous all-reduce, ring shaped to ``--slow-mbit`` (default 50 Mbit/s, 1 ms rtt);
  (d) 2 replicas, DiLoCo (H = 50, int8 pseudo-gradients) on the same slow ring.

A GPT of 2 layers, width 128, context 64 on Tiny Shakespeare, global batch 32, AdamW. Prints tokens/s and the
ratio against (a). On a 2-core machine shared with others the ratios are noisy: run it under the shared lock.

Usage: ``python bench/replicas.py [--steps N] [--slow-mbit M] [--quick]`` from the project root (``--quick``: 4
steps of a tiny model, CI's bench smoke).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from arceusd.data.text import context_windows, load_text  # noqa: E402
from arceusd.models.build import num_blocks  # noqa: E402
from arceusd.models.config import GPTConfig  # noqa: E402
from arceusd.worker.engine import EngineConfig, StageEngine  # noqa: E402
from arceusd.worker.links import InMemoryFabric  # noqa: E402
from arceusd.worker.optim import AdamWConfig  # noqa: E402
from arceusd.worker.replicas import DiLoCoConfig, ReplicaConfig, ReplicaSync, SyncMode  # noqa: E402
from arceusd.worker.ring import InMemoryRing  # noqa: E402
from arceusd.worker.schedule import ScheduleKind  # noqa: E402
from arceusd.worker.stage import StageSpec, build_stage  # noqa: E402

GLOBAL_BATCH = 32


class ShapedRing(InMemoryRing):
    """An ``InMemoryRing`` whose sends take rtt/2 + bytes / bandwidth on the sending thread."""

    def __init__(self, world: int, bandwidth_bytes_per_s: float, rtt_s: float) -> None:
        super().__init__(world, timeout_s=300)
        self.bandwidth = bandwidth_bytes_per_s
        self.rtt_s = rtt_s

    def _send(self, rank: int, frame: bytes) -> None:
        time.sleep(self.rtt_s / 2 + len(frame) / self.bandwidth)
        super()._send(rank, frame)


def _engine(model: GPTConfig, sync: ReplicaSync | None) -> StageEngine:
    module = build_stage(model, 1, StageSpec(0, num_blocks(model), None, 0), None)
    config = EngineConfig(
        stage=0,
        num_stages=1,
        num_micro_batches=1,
        schedule=ScheduleKind.ONE_F_ONE_B,
        optimizer=AdamWConfig(lr=1e-3),
        max_grad_norm=1.0,
    )
    return StageEngine(module, InMemoryFabric([1]).links(0), config, replicas=sync)


def _run(
    model: GPTConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    replicas: int,
    ring: InMemoryRing | None,
    mode: SyncMode,
) -> tuple[float, int]:
    """(tokens/s over all steps but the first, ring bytes)."""
    config = ReplicaConfig(replicas, mode=mode, diloco=DiLoCoConfig(h=50))
    engines = [_engine(model, ReplicaSync(config, ring.link(r)) if ring else None) for r in range(replicas)]
    marks: list[float] = []

    def work(r: int) -> None:
        for i, (x, y) in enumerate(batches):
            engines[r].run_step(x.chunk(replicas)[r], y.chunk(replicas)[r])
            if r == 0 and i == 0:
                marks.append(time.perf_counter())
        if r == 0:
            marks.append(time.perf_counter())

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    tokens = (len(batches) - 1) * GLOBAL_BATCH * model.block_size
    return tokens / (marks[1] - marks[0]), ring.bytes_sent if ring else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=101)
    parser.add_argument("--slow-mbit", type=float, default=50.0)
    parser.add_argument("--quick", action="store_true", help="4 steps of a tiny model (CI's bench smoke)")
    args = parser.parse_args()
    if args.quick:
        args.steps = 4
    torch.set_num_threads(1)
    data = load_text(ROOT / "data" / "tinyshakespeare" / "input.txt")
    width = 32 if args.quick else 128
    model = GPTConfig(n_layer=2, n_head=4, n_embd=width, block_size=64, vocab_size=data.vocab.size)
    gen = torch.Generator().manual_seed(3)
    hi = data.train.numel() - model.block_size - 1
    batches = [
        context_windows(data.train, torch.randint(0, hi, (GLOBAL_BATCH,), generator=gen), model.block_size)
        for _ in range(args.steps)
    ]
    slow = args.slow_mbit * 1e6 / 8
    runs = [
        ("(a) one device alone", 1, None, SyncMode.ALLREDUCE),
        ("(b) 2 replicas, all-reduce, fast", 2, InMemoryRing(2, timeout_s=300), SyncMode.ALLREDUCE),
        (f"(c) 2 replicas, all-reduce, {args.slow_mbit:g} Mbit/s", 2, ShapedRing(2, slow, 1e-3), SyncMode.ALLREDUCE),
        (f"(d) 2 replicas, DiLoCo H=50, {args.slow_mbit:g} Mbit/s", 2, ShapedRing(2, slow, 1e-3), SyncMode.DILOCO),
    ]
    base = 0.0
    for name, replicas, ring, mode in runs:
        tps, sent = _run(model, batches, replicas, ring, mode)
        base = base or tps
        print(f"{name:45s} {tps:9.0f} tokens/s  {tps / base:5.2f}x  ring {sent / 1e6:8.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
