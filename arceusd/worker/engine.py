"""``StageEngine``: runs one stage's schedule against ``Links``, holding only its slice and optimizer state.

Per step (``run_step``): the first stage gets the batch's inputs, the last stage its targets (the job owner
serves them; middle stages get neither). Both are split into micro-batches the same way (``microbatch.py``);
each micro-batch's loss is ``loss_sum / targets.numel()`` so the accumulated gradient is the full-batch
gradient. Then the action list from ``schedule.py`` runs; ``OptimizerStep`` all-reduces the squared gradient
norm (if ``max_grad_norm`` is set) together with the loss in one ``allreduce_scalars`` exchange (so every
stage reports the loss, and no stage waits for another's optimizer step), clips globally, and steps the
optimizer with the step's learning rate. The job's only worker (``solo``: one stage, no tensor-parallel group, no
replicas) has no one to exchange with: its norm, clipping and loss stay on the device, and ``launch_step`` returns
before they are read back (``pending_step.py``), so its caller can queue the next step first.

Blocking and single-threaded: a trio worker runs ``launch_step`` in a thread (``trio.to_thread.run_sync``) and
implements ``Links`` with ``trio.from_thread.run``. Tensor-parallel ranks of a stage run identical action
lists; only rank 0 sends. Optional: bf16 autocast for the forward, a ``Compression`` codec pair applied to
every sent tensor (encode before ``send_*``, decode after ``recv_*``), and the torch device (``"cpu"``,
``"cuda"``, ``"cuda:1"``, ``"mps"``). With dropout > 0 results differ from a single process (per-process RNG
streams).

Replicas (``replicas.py``): with a ``ReplicaSync`` the stage is one replica's copy of its stage. In all-reduce
mode its gradients and loss report are averaged with the other replicas' before clipping (so the loss, the norm
and the update are the global batch's); in DiLoCo mode every ``h``-th optimizer step is followed by the outer
step. The step's scalar exchange stays inside the replica's own pipeline.

Tied weights (``tied.py``): a stage holding one end of a weight the first and the last stage share (a stock LM's
tied embedding and head) swaps its gradient of it with the other end over a ``TiedLink`` after the replicas'
average and before clipping, and both use the sum. DiLoCo replicas with such a stage are refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from arceusd.files.outer_witness import OUTER_ANCHOR, OUTER_MOMENTUM
from arceusd.models.build import loss_sum
from arceusd.worker.collective import TimedCollective
from arceusd.worker.links import Links
from arceusd.worker.microbatch import split_micro_batches
from arceusd.worker.optim import (
    LRSchedule,
    OptimizerConfig,
    SGDConfig,
    clip_grad_norm_global,
    clip_grads_on_device,
    device_grad_sq_norm,
    make_optimizer,
)
from arceusd.worker.pending_step import PendingStep, StepResult
from arceusd.worker.replicas import ReplicaSync, SyncMode
from arceusd.worker.schedule import (
    DEFER_WEIGHTS,
    Action,
    Backward,
    ComputeLoss,
    Forward,
    OptimizerStep,
    RecvActivation,
    RecvGrad,
    ScheduleKind,
    SendActivation,
    SendGrad,
    WeightGrad,
    build_schedule,
)
from arceusd.worker.split_backward import PendingWeights, backward_input
from arceusd.worker.stage import StageModule
from arceusd.worker.tied import TiedLink, sum_tied_grad

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Compression:
    """A lossy or lossless codec pair for tensors crossing a stage boundary (e.g. fp32 <-> bf16).

    ``encode`` runs on the sender, ``decode`` on the receiver; codecs needing side data pack
    it into the tensor.
    """

    encode: Callable[[torch.Tensor], torch.Tensor]
    decode: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EngineConfig:
    stage: int
    num_stages: int
    num_micro_batches: int
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B
    optimizer: OptimizerConfig = field(default_factory=SGDConfig)
    lr_schedule: LRSchedule | None = None
    """Learning rate per step; ``None`` uses the optimizer config's constant ``lr``."""
    max_grad_norm: float | None = None
    autocast_bf16: bool = False
    device: str = "cpu"
    defer_weights: bool = DEFER_WEIGHTS
    """Some backwards send the input's gradient before computing the weights' gradients (``schedule.py``)."""
    max_in_flight: int = 0
    """1F1B: at most this many micro-batches stashed at once (the plan's ``in_flight_cap``); 0: no cap."""

    def __post_init__(self) -> None:
        if not 0 <= self.stage < self.num_stages:
            raise ValueError(f"stage {self.stage} out of range for {self.num_stages} stages")
        if self.num_micro_batches < 1:
            raise ValueError(f"num_micro_batches must be >= 1, got {self.num_micro_batches}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive or None, got {self.max_grad_norm}")


class StageEngine:
    """One pipeline stage (or one tensor-parallel rank of it)."""

    def __init__(
        self,
        module: StageModule,
        links: Links,
        config: EngineConfig,
        compression: Compression | None = None,
        loss_fn: LossFn = loss_sum,
        replicas: ReplicaSync | None = None,
        group_timer: TimedCollective | None = None,
        tied: TiedLink | None = None,
    ) -> None:
        if module.tied is not None and tied is None:
            raise ValueError(
                f"stage {config.stage} holds one end of a tied weight ({module.tied.name}) whose other end is on "
                "another stage, but has no link to it: pass the TiedLink to the other end"
            )
        if module.tied is not None and replicas is not None and replicas.mode is SyncMode.DILOCO:
            raise ValueError(
                "DiLoCo replicas cannot train a tied embedding split across stages (each copy would be averaged "
                'on its own ring and drift apart): set training.sync = "every_step", or tie_word_embeddings '
                "to false"
            )
        self.tied = tied if module.tied is not None else None
        self.config = config
        self.group_timer = group_timer
        self.device = torch.device(config.device)
        self.module = module.to(self.device)
        self.links = links
        self.compression = compression
        self.loss_fn = loss_fn
        self.optimizer = make_optimizer(self.module.named_parameters(), config.optimizer)
        self._params = tuple(self.module.parameters())
        """The stage's parameters, its norm's share and whether it is split, read once: walking the module tree
        for them (and for ``train()``) cost milliseconds a step on a 12-layer model."""
        self._norm_params = tuple(self.module.norm_parameters())
        self._tensor_parallel = module.tensor_parallel
        self.step = 0
        self.is_first = config.stage == 0
        self.is_last = config.stage == config.num_stages - 1
        self.sends = module.rank == 0
        self.replicas = replicas
        if replicas is not None and replicas.mode is SyncMode.DILOCO:
            replicas.start(list(self._params))
        if replicas is not None and replicas.mode is SyncMode.ALLREDUCE:  # overlap the all-reduce with backward
            replicas.attach(list(self._params), config.num_micro_batches)
        self.solo = config.num_stages == 1 and replicas is None and self.tied is None and not self._tensor_parallel
        """The only worker of its job: its step's scalars never cross a link, so they stay on the device until the
        caller reads them (:meth:`launch_step`, ``pending_step.py``)."""

    # -- public API ------------------------------------------------------------------------------------------

    def run_step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> StepResult:
        """One training step. First stage: pass ``inputs``; last stage: ``targets``; others: nothing."""
        return self.launch_step(inputs, targets).result()

    def launch_step(self, inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None) -> PendingStep:
        """:meth:`run_step` that returns once the step is queued on the device: a :attr:`solo` worker's loss and
        gradient norm are read when it asks for :meth:`PendingStep.result` (after queueing the next step, say);
        every other worker's result is read already (its scalars crossed a link)."""
        m = self.config.num_micro_batches
        if self.is_first != (inputs is not None):
            raise ValueError(f"stage {self.config.stage}: inputs go to the first stage and only there")
        if self.is_last != (targets is not None):
            raise ValueError(f"stage {self.config.stage}: targets go to the last stage and only there")
        run = _StepState(
            inputs=split_micro_batches(inputs, m) if inputs is not None else [],
            targets=split_micro_batches(targets, m) if targets is not None else [],
            num_targets=targets.numel() if targets is not None else 0,
        )
        if not self.module.training:  # an evaluation left it in eval mode (it sets train() back itself)
            self.module.train()
        self.optimizer.zero_grad()
        if self.group_timer is not None:
            self.group_timer.take()
        actions = self._schedule()
        result: PendingStep | None = None
        for action in actions:
            if isinstance(action, RecvActivation | RecvGrad):
                began = time.perf_counter()
                self._execute(action, run)
                waited = time.perf_counter() - began
                run.wait_s += waited
                if isinstance(action, RecvActivation):
                    run.wait_up_s += waited
                else:
                    run.wait_down_s += waited
            else:
                result = self._execute(action, run) or result
        if result is None:
            raise RuntimeError("schedule ended without an OptimizerStep")  # pragma: no cover - schedule bug
        return result

    def _schedule(self) -> tuple[Action, ...]:
        """This stage's action list for one step."""
        c = self.config
        return build_schedule(
            c.schedule,
            c.stage,
            c.num_stages,
            c.num_micro_batches,
            defer_weights=c.defer_weights,
            max_in_flight=c.max_in_flight,
        )

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.module.parameters())

    def optimizer_state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.optimizer.state_tensors().values())

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Parameters (``param.<name>``) and optimizer state (``optim.<name>.<buffer>``), for a shard."""
        out = {f"param.{n}": p.detach() for n, p in self.module.named_parameters()}
        out.update({f"optim.{k}": v for k, v in self.optimizer.state_tensors().items()})
        if self.replicas is not None:
            names = [n for n, _ in self.module.named_parameters()]
            out.update({f"optim.{k}": v for k, v in self.replicas.outer_state(names).items()})
        return out

    def load_state_tensors(self, state: dict[str, torch.Tensor], step: int) -> None:
        """Restore a shard written from ``state_tensors`` (same slice and split) and resume at ``step``."""
        params = dict(self.module.named_parameters())
        optim: dict[str, torch.Tensor] = {}
        outer: dict[str, torch.Tensor] = {}
        seen = set()
        with torch.no_grad():
            for key, tensor in state.items():
                kind, _, name = key.partition(".")
                if kind == "param" and name in params:
                    if tensor.shape != params[name].shape:
                        raise ValueError(
                            f"checkpoint tensor {key!r} has shape {tuple(tensor.shape)}, "
                            f"this stage expects {tuple(params[name].shape)}"
                        )
                    params[name].copy_(tensor)
                    seen.add(name)
                elif kind == "optim" and name.endswith((f".{OUTER_ANCHOR}", f".{OUTER_MOMENTUM}")):
                    outer[name] = tensor
                elif kind == "optim":
                    optim[name] = tensor
                else:
                    raise ValueError(f"checkpoint tensor {key!r} does not belong to this stage")
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} parameter(s) of this stage, e.g. {missing[0]!r}")
        self.optimizer.load_state_tensors(optim, step)
        self.step = step
        if self.replicas is not None and self.replicas.mode is SyncMode.DILOCO:
            names, values = zip(*self.module.named_parameters(), strict=True)
            self.replicas.load_outer_state(list(values), list(names), outer)
        elif outer:
            raise ValueError("checkpoint holds DiLoCo state but this stage does not run DiLoCo")

    # -- execution
    # ---------------------------------------------------------------------------------------------

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.autocast_bf16)

    def _encode(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return self.compression.encode(t) if self.compression is not None else t

    def _decode(self, t: torch.Tensor) -> torch.Tensor:
        t = self.compression.decode(t) if self.compression is not None else t
        return t.to(self.device)

    def _local(self, t: torch.Tensor) -> torch.Tensor:
        """A batch's tensor on this stage's device; to a GPU through pinned memory, without waiting for the work
        queued before it (a plain copy waits for the whole queue: the previous step's update, this forward)."""
        if self.device.type == "cuda" and t.device.type == "cpu":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _execute(self, action: Action, run: _StepState) -> PendingStep | None:
        if isinstance(action, RecvActivation):
            x = self._decode(self.links.recv_activation(action.micro_batch))
            if x.is_floating_point():
                x.requires_grad_(True)
            run.received[action.micro_batch] = x
        elif isinstance(action, Forward):
            i = action.micro_batch
            x = self._local(run.inputs[i]) if self.is_first else run.received.pop(i)
            with self._autocast():
                y = self.module(x)
            run.stash[i] = (x, y)
        elif isinstance(action, SendActivation):
            if self.sends:
                self.links.send_activation(action.micro_batch, self._encode(run.stash[action.micro_batch][1]))
        elif isinstance(action, ComputeLoss):
            i = action.micro_batch
            y = run.stash[i][1]
            run.losses[i] = self.loss_fn(y, self._local(run.targets[i])) / run.num_targets
        elif isinstance(action, RecvGrad):
            run.grads[action.micro_batch] = self._decode(self.links.recv_grad(action.micro_batch))
        elif isinstance(action, Backward):
            if action.defer_weights and not self._tensor_parallel:
                self._backward_input(action.micro_batch, run)
            else:  # a tensor-parallel stage runs its backwards whole: the split is untested with its collectives
                self._backward(action.micro_batch, run)
        elif isinstance(action, WeightGrad):
            self._weight_grad(action.micro_batch, run)
        elif isinstance(action, SendGrad):
            g = run.input_grads.pop(action.micro_batch)
            if self.sends:
                self.links.send_grad(action.micro_batch, self._encode(g))
        elif isinstance(action, OptimizerStep):
            return self._optimizer_step(run)
        return None

    def _backward(self, i: int, run: _StepState) -> None:
        root, grad = self._root(i, run)
        if root.requires_grad:  # else a frozen first stage (LoRA: no adapter in it): nothing to differentiate
            torch.autograd.backward(root, grad)
        x, _ = run.stash.pop(i)
        if self.is_last:
            run.add_loss(run.losses.pop(i))
        if not self.is_first:
            run.input_grads[i] = self._input_grad(i, x.grad)

    def _root(self, i: int, run: _StepState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where micro-batch ``i``'s backward starts: its loss (last stage) or its output and the received
        gradient."""
        if self.is_last:
            return run.losses[i], None
        y = run.stash[i][1]
        return y, run.grads.pop(i).to(y.dtype)

    def _backward_input(self, i: int, run: _StepState) -> None:
        """Only the gradient of the stage's input (sent at once); the parameters' wait for ``WeightGrad``."""
        x, _ = run.stash[i]
        root, grad = self._root(i, run)
        gx, pending = backward_input(root, grad, x, list(self._params))
        run.deferred[i] = pending
        run.input_grads[i] = self._input_grad(i, gx)
        if self.is_last:
            run.add_loss(run.losses.pop(i))

    def _input_grad(self, i: int, gx: torch.Tensor | None) -> torch.Tensor:
        if gx is None:
            raise RuntimeError(f"stage {self.config.stage}: no gradient reached the input of micro-batch {i}")
        return gx

    def _weight_grad(self, i: int, run: _StepState) -> None:
        """The parameters' gradients of a micro-batch whose backward was deferred (a no-op when it was not)."""
        pending = run.deferred.pop(i, None)
        if pending is None:
            return
        pending.run()
        run.stash.pop(i)

    def _optimizer_step(self, run: _StepState) -> PendingStep:
        lr = self.config.lr_schedule(self.step) if self.config.lr_schedule else self.config.optimizer.lr
        began, waited = time.perf_counter(), run.wait_s
        if self.solo:
            return self._solo_update(run, lr, began)

        def exchange(values: tuple[float, ...]) -> list[float]:  # the step's one scalar all-reduce, timed
            t0 = time.perf_counter()
            sums = self.links.allreduce_scalars(values)
            run.wait_s += time.perf_counter() - t0
            return sums

        grad_norm = None
        report = float(run.loss_acc) if (self.is_last and self.sends and run.loss_acc is not None) else 0.0
        if self.replicas is not None and self.replicas.mode is SyncMode.ALLREDUCE:
            began_sync = time.perf_counter()
            report = self.replicas.average_grads(list(self._params), report)
            run.wait_s += time.perf_counter() - began_sync
        if self.tied is not None and self.module.tied is not None:  # one weight: both ends use the summed gradient
            began_tied = time.perf_counter()
            sum_tied_grad(self.module.tied_parameter(), self.tied, self.module.tied.copy)
            run.wait_s += time.perf_counter() - began_tied
        if self.config.max_grad_norm is not None:
            losses: list[float] = []

            def reduce_with_loss(sq_norm: float) -> float:  # one exchange for the norm and the loss
                total_sq, loss_total = exchange((sq_norm, report))
                losses.append(loss_total)
                return total_sq

            grad_norm = clip_grad_norm_global(
                list(self._params),
                self._norm_params,
                self.config.max_grad_norm,
                reduce_with_loss,
            )
            (loss,) = losses
        else:
            (loss,) = exchange((report,))
        self.optimizer.step(lr)
        if self.replicas is not None:  # DiLoCo's outer sync every h steps: a wait on the ring, not compute
            began_outer = time.perf_counter()
            self.replicas.after_step(list(self._params), self.step + 1)
            run.wait_s += time.perf_counter() - began_outer
        spent = time.perf_counter() - began - (run.wait_s - waited)
        result = StepResult(
            step=self.step,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            wait_s=run.wait_s,
            wait_up_s=run.wait_up_s,
            wait_down_s=run.wait_down_s,
            optimizer_s=spent,
            group_wait_s=self.group_timer.take() if self.group_timer is not None else 0.0,
        )
        self.step += 1
        return PendingStep(result)

    def _solo_update(self, run: _StepState, lr: float, began: float) -> PendingStep:
        """The update of the job's only worker: its sums are its own (no exchange), so the gradient norm, the
        clipping and the loss stay on the device (``optim.clip_grads_on_device``: the same gradients as the
        exchanging path's, to the bit) and are read when the caller asks (``pending_step.py``)."""
        if run.loss_acc is None:
            raise RuntimeError("a one-stage step ended without a loss")  # pragma: no cover - schedule bug
        norm = None
        if self.config.max_grad_norm is not None:
            sq = device_grad_sq_norm(self._norm_params)
            if sq is None:  # no parameter has a gradient (a frozen base without adapters here)
                sq = torch.zeros((), dtype=torch.float64, device=self.device)
            norm = clip_grads_on_device(self._params, sq, self.config.max_grad_norm)
        self.optimizer.step(lr)
        template = StepResult(
            step=self.step, loss=math.nan, grad_norm=None, lr=lr, optimizer_s=time.perf_counter() - began
        )
        self.step += 1
        return PendingStep(template, run.loss_acc, norm)


@dataclass
class _StepState:
    """Per-step scratch: micro-batch inputs/targets, stashed activations, pending gradients, losses."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    num_targets: int
    received: dict[int, torch.Tensor] = field(default_factory=dict)
    stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    grads: dict[int, torch.Tensor] = field(default_factory=dict)
    input_grads: dict[int, torch.Tensor] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    deferred: dict[int, PendingWeights] = field(default_factory=dict)
    """Micro-batches whose parameters' gradients wait for ``WeightGrad``."""
    loss_acc: torch.Tensor | None = None
    """The micro-batches' losses summed in float64 on the device (last stage), read once per step: the sum of their
    Python floats to the bit."""
    wait_s: float = 0.0
    wait_up_s: float = 0.0
    wait_down_s: float = 0.0

    def add_loss(self, loss: torch.Tensor) -> None:
        value = loss.detach().double()
        self.loss_acc = value if self.loss_acc is None else self.loss_acc + value
