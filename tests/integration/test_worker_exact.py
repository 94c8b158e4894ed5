"""Stage workers as real processes over real gRPC equal a plain single-process PyTorch loop
on the same batches.

Per-step losses (reported by every worker, all-reduced) and the final parameters (gathered from the workers'
final checkpoint shards, tensor-parallel slices included) match within 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arceusd.jobs.spec.schema import JobSpec
from arceusd.worker.protocol import CheckpointEvent, EvalEvent, StepEvent
from arceusd.worker.tensor_parallel import TPSplit
from tests.integration.worker_harness import Layout, WorkerJob, gpt_spec, mnist_spec, reference_run

pytestmark = pytest.mark.slow


def _check_exact(job: WorkerJob, spec: JobSpec, steps: int) -> None:
    ref_losses, ref_params = reference_run(spec, steps)
    for w in job.workers:
        losses = [e.loss for e in w.of(StepEvent)]
        assert [e.step for e in w.of(StepEvent)] == list(range(steps))
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=1e-5)
        assert [e.step for e in w.of(CheckpointEvent)][-1] == steps
        assert w.of(EvalEvent), "every worker reports the all-reduced evaluation"
    params = job.gathered_params(steps)
    assert set(params) == set(ref_params)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=f"parameter {name}")


@pytest.mark.parametrize(
    ("schedule", "layout"),
    [("gpipe", [(0, 1, None), (1, 3, None)]), ("1f1b", [(0, 1, None), (1, 2, None), (2, 3, None)])],
    ids=["2-workers-gpipe", "3-workers-1f1b"],
)
def test_mlp_on_mnist_equals_plain_loop(tmp_path: Path, schedule: str, layout: Layout) -> None:
    steps = 4
    spec = mnist_spec([784, 32, 16, 10], steps, batch=32, micro=4)
    with WorkerJob(tmp_path, spec, layout, schedule=schedule, checkpoint_interval=2, owner=(len(layout) - 1, 0)) as job:
        job.start()
        job.run(timeout=60)
        _check_exact(job, spec, steps)
        evals = job.workers[0].of(EvalEvent)
        assert [e.step for e in evals] == [2, 4]
        assert all(e.val_accuracy is not None and 0.0 <= e.val_accuracy <= 1.0 for e in evals)
        assert len({(e.val_loss, e.val_accuracy) for w in job.workers for e in w.of(EvalEvent) if e.step == 4}) == 1


def test_gpt_with_a_tensor_parallel_stage_equals_plain_loop(tmp_path: Path) -> None:
    steps = 3
    # SGD: with AdamW an embedding row that sees a ~1e-9 gradient turns micro-batch summation-order noise
    # into a full-size update (m / sqrt(v)), so per-element 1e-5 is not a fair bound there (the engine's
    # unit tests cover AdamW exactness on data without such rows).
    spec = gpt_spec(
        steps,
        n_layer=2,
        n_head=4,
        n_embd=32,
        block=16,
        batch=8,
        micro=4,
        grad_clip=0.5,
        optimizer="sgd",
        lr=0.1,
        momentum=0.9,
        weight_decay=0.0,
    )
    layout: Layout = [(0, 2, None), (2, 4, TPSplit(heads=(3, 1), columns=(96, 32)))]
    with WorkerJob(tmp_path, spec, layout, schedule="1f1b") as job:
        job.start()
        job.run(timeout=60)
        _check_exact(job, spec, steps)
        norms = [e.grad_norm for e in job.workers[0].of(StepEvent)]
        assert all(n > 0 for n in norms)


def test_a_worker_alone_equals_plain_loop_and_reports_each_step_before_its_checkpoint(tmp_path: Path) -> None:
    """The job's only worker reports a step after queueing the next (``pending_step.py``): still every step, in
    order, each before the checkpoint or evaluation that follows it, with the plain loop's losses (clipping on)."""
    steps = 5
    spec = gpt_spec(
        steps, micro=2, grad_clip=0.5, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0, eval_interval_steps=3
    )
    with WorkerJob(tmp_path, spec, [(0, 4, None)], checkpoint_interval=2) as job:
        job.start()
        job.run(timeout=60)
        _check_exact(job, spec, steps)
        (w,) = job.workers
        order = [(type(e).__name__, e.step) for e in w.events if isinstance(e, StepEvent | CheckpointEvent | EvalEvent)]
        for kind, step in order:
            if kind != "StepEvent":  # a checkpoint or an evaluation after `step` steps: that step reported first
                assert ("StepEvent", step - 1) in order[: order.index((kind, step))], order
        assert [e.step for e in w.of(CheckpointEvent)] == [2, 4, 5]
        assert [e.step for e in w.of(EvalEvent)] == [2, 3, 4, 5]
        assert all(e.seconds > 0 and e.grad_norm > 0 for e in w.of(StepEvent))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_worker_on_cuda_and_one_on_cpu_equal_plain_loop(tmp_path: Path, schedule: str) -> None:
    """A job mixing devices: the first stage's worker trains on CUDA, the second on the CPU."""
    steps = 3
    spec = gpt_spec(
        steps,
        n_layer=2,
        n_head=4,
        n_embd=32,
        block=16,
        batch=8,
        micro=4,
        optimizer="sgd",
        lr=0.1,
        momentum=0.9,
        weight_decay=0.0,
    )
    with WorkerJob(tmp_path, spec, [(0, 2, None), (2, 4, None)], schedule=schedule, devices=["cuda", "cpu"]) as job:
        job.start()
        job.run(timeout=120)
        _check_exact(job, spec, steps)
