"""The job's only worker keeps its step's scalars on the device (``StageEngine.solo``, ``pending_step.py``): the
same losses, gradient norms, clipping and parameters as the path whose scalars cross a link, to the bit, and a
queued step's figures read only when asked."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from arceusd.models.config import GPTConfig
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import InMemoryFabric
from arceusd.worker.optim import AdamWConfig, clip_grads, clip_grads_on_device, device_grad_sq_norm, local_grad_sq_norm
from arceusd.worker.pending_step import PendingStep, StepResult
from arceusd.worker.stage import StageSpec, build_stage

GPT = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=65)


def _engine(clip: float | None, micro: int) -> StageEngine:
    module = build_stage(GPT, 5, StageSpec(0, GPT.n_layer + 2))
    config = EngineConfig(
        stage=0, num_stages=1, num_micro_batches=micro, optimizer=AdamWConfig(lr=3e-3), max_grad_norm=clip
    )
    return StageEngine(module, InMemoryFabric([1]).links(0), config)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, GPT.vocab_size, (8, GPT.block_size + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


@pytest.mark.parametrize(("clip", "micro"), [(0.05, 2), (math.inf, 1), (None, 4)], ids=["clips", "inf", "none"])
def test_a_solo_step_equals_the_exchanging_path_to_the_bit(clip: float | None, micro: int) -> None:
    solo, exchanging = _engine(clip, micro), _engine(clip, micro)
    assert solo.solo
    exchanging.solo = False  # the path of a worker whose scalars cross a link (here: a link to itself)
    for step in range(4):
        a, b = solo.run_step(*_batch(step)), exchanging.run_step(*_batch(step))
        assert (a.step, a.loss, a.grad_norm, a.lr) == (b.step, b.loss, b.grad_norm, b.lr)
        assert a.grad_norm is None if clip is None else (a.grad_norm is not None and a.grad_norm > 0)
    if clip == 0.05:
        assert a.grad_norm is not None and a.grad_norm > 0.05  # it clipped
    for (name, p), q in zip(solo.module.named_parameters(), exchanging.module.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_a_launched_step_is_read_when_asked_and_once() -> None:
    engine = _engine(1.0, 2)
    first = engine.launch_step(*_batch(0))
    second = engine.launch_step(*_batch(1))  # queued before the first is read
    assert (first.step, second.step) == (0, 1) and engine.step == 2
    r0, r1 = first.result(), second.result()
    assert r0 is first.result()  # read once
    assert math.isfinite(r0.loss) and r0.loss != r1.loss and r0.grad_norm and r1.grad_norm


class DeviceWaits(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the operations that, on a GPU, wait for the device: a read back to the host (``item``, ``float``,
    ``bool`` of a tensor, ``nonzero``, ``equal``) or a tensor made from Python data (a copy from pageable
    memory). On the CPU they run as anywhere, so the count is the one a GPU run would wait on."""

    READS = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal", "lift_fresh", "lift_fresh_copy")

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ in self.READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("clip", [0.05, math.inf])
def test_a_solo_step_queues_without_waiting_for_the_device(clip: float) -> None:
    """Nothing in a launched step of the job's only worker waits for the device (forward, loss, backward, norm,
    clipping, AdamW: a step tensor made per parameter drained the GPU at every update): it waits only when its
    figures are read. An evaluation's eval mode does not outlive the next step."""
    engine = _engine(clip, 2)
    engine.run_step(*_batch(0))  # the first step makes the optimizer's state
    engine.module.eval()
    waits = DeviceWaits()
    with waits:
        pending = [engine.launch_step(*_batch(step)) for step in (1, 2)]
    assert waits.seen == []
    assert engine.module.training
    assert all(math.isfinite(p.result().loss) for p in pending)


def test_device_norm_and_clipping_match_the_host_functions() -> None:
    torch.manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(5, 7)) for _ in range(3)] + [torch.nn.Parameter(torch.randn(4))]
    for p in params[:3]:
        p.grad = torch.randn_like(p) * 10
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, twins, strict=True):
        q.grad = None if p.grad is None else p.grad.clone()
    sq = device_grad_sq_norm(params)
    assert sq is not None and float(sq) == local_grad_sq_norm(twins)
    norm = clip_grads_on_device(params, sq, 1.5)
    assert float(norm) == clip_grads(twins, local_grad_sq_norm(twins), 1.5)
    for p, q in zip(params, twins, strict=True):
        assert (p.grad is None and q.grad is None) or (
            p.grad is not None and q.grad is not None and torch.equal(p.grad, q.grad)
        )
    assert device_grad_sq_norm([params[3]]) is None


def test_a_whole_result_needs_no_read() -> None:
    whole = StepResult(step=3, loss=1.5, grad_norm=None, lr=0.1)
    assert PendingStep(whole).result() is whole
