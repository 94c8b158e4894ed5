"""DiLoCo against synchronous replicas at equal tokens on the Tiny Shakespeare GPT: close validation loss for
far fewer bytes between the replicas, counted on the rings' wire.

Two replicas (each a one-stage pipeline, in threads over the in-memory links and ring), the same batches (each
replica its half of every global batch), the same inner AdamW and LR schedule. Synchronous: gradients
all-reduced every step (raw fp32 frames). DiLoCo: H = 50 local steps, then the int8 pseudo-gradients averaged
and the outer Nesterov step (lr 0.7, momentum 0.9).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from arceusd.data.text import context_windows, load_text
from arceusd.models.build import loss_mean, num_blocks
from arceusd.models.config import GPTConfig
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import InMemoryFabric
from arceusd.worker.optim import AdamWConfig, LRSchedule
from arceusd.worker.replicas import DiLoCoConfig, ReplicaCodec, ReplicaConfig, ReplicaSync, SyncMode
from arceusd.worker.ring import InMemoryRing
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage

TEXT = Path(__file__).resolve().parents[2] / "data" / "tinyshakespeare" / "input.txt"
STEPS = 300
BATCH_PER_REPLICA = 16
LR = 1e-3  # nanoGPT's shakespeare_char learning rate
H = 50


def _train(
    mode: SyncMode,
    model: GPTConfig,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    val: tuple[torch.Tensor, torch.Tensor],
) -> tuple[float, int]:
    """(validation loss of replica 0 at the end, bytes the ring carried)."""
    ring = InMemoryRing(2, timeout_s=120)
    config = ReplicaConfig(2, mode=mode, diloco=DiLoCoConfig(h=H, codec=ReplicaCodec.INT8))
    engines = []
    for r in range(2):
        module = build_stage(model, 1, StageSpec(0, num_blocks(model), None, 0), None)
        engine_config = EngineConfig(
            stage=0,
            num_stages=1,
            num_micro_batches=1,
            schedule=ScheduleKind.ONE_F_ONE_B,
            optimizer=AdamWConfig(lr=LR, beta2=0.99, weight_decay=0.1),
            lr_schedule=LRSchedule(LR, LR / 10, 20, STEPS),
            max_grad_norm=1.0,
        )
        engines.append(
            StageEngine(module, InMemoryFabric([1]).links(0), engine_config, replicas=ReplicaSync(config, ring.link(r)))
        )
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            for x, y in batches:
                engines[r].run_step(x.chunk(2)[r], y.chunk(2)[r])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if errors:
        raise errors[0]
    assert all(not t.is_alive() for t in threads), "a replica hung"
    first, second = (dict(e.module.named_parameters()) for e in engines)
    assert all(torch.equal(p, second[n]) for n, p in first.items())  # both modes end with identical replicas
    module = engines[0].module
    module.eval()
    with torch.no_grad():
        return float(loss_mean(module(val[0]), val[1])), ring.bytes_sent


@pytest.mark.slow
def test_diloco_h50_is_within_3_percent_of_synchronous_for_50x_fewer_bytes() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_text(TEXT)
        model = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=data.vocab.size)
        gen = torch.Generator().manual_seed(7)
        hi = data.train.numel() - model.block_size - 1
        batches = [
            context_windows(data.train, torch.randint(0, hi, (2 * BATCH_PER_REPLICA,), generator=gen), model.block_size)
            for _ in range(STEPS)
        ]
        val_offsets = torch.randint(
            0, data.val.numel() - model.block_size - 1, (256,), generator=torch.Generator().manual_seed(8)
        )
        val = context_windows(data.val, val_offsets, model.block_size)
        sync_loss, sync_bytes = _train(SyncMode.ALLREDUCE, model, batches, val)
        diloco_loss, diloco_bytes = _train(SyncMode.DILOCO, model, batches, val)
    finally:
        torch.set_num_threads(threads)
    print(
        f"sync: val {sync_loss:.4f}, {sync_bytes} B; diloco: val {diloco_loss:.4f}, {diloco_bytes} B; "
        f"{diloco_loss / sync_loss - 1:+.2%}, {sync_bytes / diloco_bytes:.0f}x fewer bytes"
    )
    assert sync_loss < 2.6  # both really trained (a uniform guess over 65 characters is 4.17)
    assert diloco_loss <= sync_loss * 1.03
    assert sync_bytes >= 50 * diloco_bytes
