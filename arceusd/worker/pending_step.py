"""A step's result and its figures on their way back from the device: :class:`StepResult`, :class:`PendingStep`.

Owns how a worker reads a step's scalars (loss, gradient norm) without stalling the device. A read of a GPU tensor
waits for everything queued before it, so a worker that read its loss at the end of every step left the GPU idle
while it prepared and launched the next step (Python-heavy: a Hugging Face forward), which a plain training loop
hides by queueing ahead. A worker alone in its job (``StageEngine.solo``) queues a copy of the step's scalars to
the host (``non_blocking``, into pinned memory, after the step's update) and records a CUDA event after the copy;
:meth:`PendingStep.result` waits for that event only, never for work queued later. So the worker
may queue step ``k + 1`` before it reports step ``k`` (``process.py``), and the read costs nothing once step ``k``
has finished. On the CPU, and for a worker whose scalars crossed the wire (already on the host), the values are
there at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepResult:
    step: int
    """The step just completed (0-based)."""
    loss: float
    """Full-batch mean loss of this step (before the update), identical on every stage."""
    grad_norm: float | None
    """Global gradient norm before clipping (``None`` when clipping is off)."""
    lr: float
    wait_s: float = 0.0
    """Seconds this stage spent blocked on its links (receiving activations or gradients, the step's scalar
    exchange): the pipeline's bubble plus any wait for a slower neighbour or a slow link."""
    wait_up_s: float = 0.0
    """Of ``wait_s``, the seconds spent waiting for the previous stage's activations."""
    wait_down_s: float = 0.0
    """Of ``wait_s``, the seconds spent waiting for the next stage's gradients. The leader sets these beside the
    neighbours' own figures: a stage both neighbours wait on is the slow one, whatever it says of itself."""
    group_wait_s: float = 0.0
    """Seconds inside the tensor-parallel group's all-reduces (not in ``wait_s``: they happen inside the forward
    and backward passes): waiting for the group's slowest rank. Zero without a group timer."""
    optimizer_s: float = 0.0
    """Seconds of the optimizer step (clipping included)."""


class PendingStep:
    """One step's :class:`StepResult`, its loss and gradient norm read when :meth:`result` is first called."""

    def __init__(self, template: StepResult, loss: torch.Tensor | None = None, norm: torch.Tensor | None = None):
        """``template``: the result with every figure but the ones still on the device; ``loss`` (and ``norm``,
        None when the step takes none): scalar tensors, or no ``loss`` when ``template`` is whole."""
        self._template = template
        self._has_norm = norm is not None
        self._host: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None
        self._result: StepResult | None = template if loss is None else None
        if loss is None:
            return
        values = torch.stack([loss.detach().double(), (loss if norm is None else norm).detach().double()])
        if values.device.type == "cuda":
            self._host = values.to("cpu", non_blocking=True)  # into pinned memory: queued, not waited for
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record(torch.cuda.current_stream(values.device))
        else:
            self._host = values

    @property
    def step(self) -> int:
        return self._template.step

    def result(self) -> StepResult:
        """The step's result: waits for its scalars' copy (not for anything queued after it), once."""
        if self._result is None:
            if self._ready is not None:
                self._ready.synchronize()
            assert self._host is not None
            loss, norm = self._host.tolist()
            self._result = dataclasses.replace(
                self._template, loss=float(loss), grad_norm=float(norm) if self._has_norm else None
            )
        return self._result
