"""Optimizers over one stage's own parameters, global gradient clipping, and the LR schedule.

``SGD`` (momentum, dampening, nesterov, weight decay) and ``AdamW`` reproduce ``torch.optim.SGD`` /
``torch.optim.AdamW`` update rules (single param group) while keeping their state as a flat, named tensor dict
(``state_tensors``) that checkpoints as safetensors and reloads into a re-planned slice: SGD's rule is written
out here; AdamW hands its tensors to torch's functional ``adamw`` (the fused kernel).

Global clipping: every stage (and tensor-parallel rank) computes the squared L2 norm of the gradients it owns
(``local_grad_sq_norm``; replicated tensor-parallel parameters are counted on one rank only), a ``reduce``
callable sums those across all stages, and ``clip_grads`` scales by ``min(1, max_norm / (total_norm + 1e-6))``
like ``torch.nn.utils.clip_grad_norm_``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.adamw import adamw as torch_adamw


@dataclass(frozen=True)
class SGDConfig:
    lr: float = 0.01
    momentum: float = 0.9
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False


@dataclass(frozen=True)
class AdamWConfig:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


OptimizerConfig = SGDConfig | AdamWConfig


class StageOptimizer:
    """Common part: the named parameters this stage owns and the step counter."""

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]]) -> None:
        self.params: dict[str, nn.Parameter] = {n: p for n, p in named_params if p.requires_grad}
        self.step_count = 0

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def step(self, lr: float) -> None:
        raise NotImplementedError

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Optimizer state as ``{"<param name>.<buffer>": tensor}`` (no step counter: see ``step_count``)."""
        raise NotImplementedError

    def buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        """Buffer kind -> {param name -> tensor}; the live dicts that ``load_state_tensors`` fills."""
        raise NotImplementedError

    def load_state_tensors(self, state: dict[str, torch.Tensor], step_count: int) -> None:
        """Restore what ``state_tensors`` returned (e.g. from a checkpoint shard) and the step counter."""
        kinds = self.buffers()
        for key, tensor in state.items():
            name, _, kind = key.rpartition(".")
            if kind not in kinds or name not in self.params:
                raise ValueError(f"optimizer state {key!r} does not belong to this stage's parameters")
            if tensor.shape != self.params[name].shape:
                raise ValueError(
                    f"optimizer state {key!r} has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(self.params[name].shape)}"
                )
            kinds[kind][name] = tensor.detach().to(self.params[name].device, self.params[name].dtype).clone()
        self.step_count = step_count


class SGD(StageOptimizer):
    """``torch.optim.SGD`` with one param group."""

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]], config: SGDConfig) -> None:
        super().__init__(named_params)
        if config.nesterov and (config.momentum <= 0 or config.dampening != 0):
            raise ValueError("nesterov momentum requires momentum > 0 and dampening = 0")
        self.config = config
        self.momentum_buffer: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, lr: float) -> None:
        c = self.config
        for name, p in self.params.items():
            if p.grad is None:
                continue
            d_p = p.grad
            if c.weight_decay != 0:
                d_p = d_p.add(p, alpha=c.weight_decay)
            if c.momentum != 0:
                buf = self.momentum_buffer.get(name)
                if buf is None:
                    buf = torch.clone(d_p).detach()
                    self.momentum_buffer[name] = buf
                else:
                    buf.mul_(c.momentum).add_(d_p, alpha=1 - c.dampening)
                d_p = d_p.add(buf, alpha=c.momentum) if c.nesterov else buf
            p.add_(d_p, alpha=-lr)
        self.step_count += 1

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {f"{n}.momentum_buffer": b for n, b in self.momentum_buffer.items()}

    def buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"momentum_buffer": self.momentum_buffer}


class AdamW(StageOptimizer):
    """``torch.optim.AdamW`` (no amsgrad) with one param group, stepped by torch's fused kernel.

    The update is torch's own functional ``adamw`` over this stage's tensors: ``fused=True`` (one pass over
    each parameter's memory: 1.4 ms instead of 9.1 ms for the 2.4M parameters of a ``bench/pipeline.py``
    stage on one CPU thread, and the first stage's optimizer step is on the pipeline's critical path), or
    ``foreach=True`` where this torch or device has no fused kernel (torch < 2.4 on CPU). Either agrees with
    ``torch.optim.AdamW``'s default loop to rounding (``tests/unit/test_optim.py``)."""

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]], config: AdamWConfig) -> None:
        super().__init__(named_params)
        self.config = config
        self.exp_avg: dict[str, torch.Tensor] = {}
        self.exp_avg_sq: dict[str, torch.Tensor] = {}
        self.fused: bool | None = None
        """Whether the fused kernel ran (None before the first step)."""
        self._steps: dict[str, torch.Tensor] = {}
        """Each parameter's step count as the kernel reads it (a float32 scalar on the parameter's device), kept
        from step to step as ``torch.optim.AdamW``'s ``state["step"]`` is: the kernel increments it itself."""
        self._held: dict[str, int] = {}
        """The count each of :attr:`_steps` holds; one that is not :attr:`step_count` is set before the update
        (after ``load_state_tensors``, or for a parameter that had no gradient on a step)."""

    @torch.no_grad()
    def step(self, lr: float) -> None:
        names = [n for n, p in self.params.items() if p.grad is not None]
        for name in names:
            if name not in self.exp_avg:
                self.exp_avg[name] = torch.zeros_like(self.params[name])
                self.exp_avg_sq[name] = torch.zeros_like(self.params[name])
        if names and self.fused is not False:
            try:
                self._update(names, lr, fused=True)
                self.fused = True
            except RuntimeError:  # no fused kernel for this device or torch: fall back, once and for all
                self.fused = False
        if names and not self.fused:
            self._update(names, lr, fused=False)
        self.step_count += 1

    def _step_tensors(self, names: list[str]) -> list[torch.Tensor]:
        """The step count of each of ``names``' parameters, as a tensor on its device holding
        :attr:`step_count` (every parameter of a stage has taken every step: a checkpoint restores
        ``step_count``). Kept from step to step and set on the device (``fill_``, a kernel): a tensor made from a
        Python number on a GPU (``torch.tensor(n, device=...)``) is a copy from pageable memory, which waits for
        every kernel queued before it: one wait per parameter per step drained the GPU at each update."""
        out = []
        for n in names:
            t = self._steps.get(n)
            if t is None:
                p = self.params[n]
                t = self._steps[n] = torch.full((), float(self.step_count), dtype=torch.float32, device=p.device)
            elif self._held.get(n) != self.step_count:
                t.fill_(float(self.step_count))
            out.append(t)
        return out

    def _update(self, names: list[str], lr: float, *, fused: bool) -> None:
        c = self.config
        params: list[torch.Tensor] = [self.params[n] for n in names]
        steps = self._step_tensors(names)
        for n in names:  # unknown until the kernel has counted the step (a failed call may have counted some)
            self._held.pop(n, None)
        torch_adamw(
            params,
            [p.grad for p in params if p.grad is not None],
            [self.exp_avg[n] for n in names],
            [self.exp_avg_sq[n] for n in names],
            [],
            steps,
            foreach=not fused,
            fused=fused,
            amsgrad=False,
            beta1=c.beta1,
            beta2=c.beta2,
            lr=lr,
            weight_decay=c.weight_decay,
            eps=c.eps,
            maximize=False,
        )
        self._held.update(dict.fromkeys(names, self.step_count + 1))  # torch's kernel incremented them

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"{n}.exp_avg": t for n, t in self.exp_avg.items()}
        out.update({f"{n}.exp_avg_sq": t for n, t in self.exp_avg_sq.items()})
        return out

    def buffers(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}


def make_optimizer(named_params: Iterable[tuple[str, nn.Parameter]], config: OptimizerConfig) -> StageOptimizer:
    """The optimizer named by ``config`` over ``named_params``."""
    if isinstance(config, SGDConfig):
        return SGD(named_params, config)
    if isinstance(config, AdamWConfig):
        return AdamW(named_params, config)
    raise TypeError(f"unknown optimizer config {type(config).__name__}; expected SGDConfig or AdamWConfig")


def device_grad_sq_norm(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """:func:`local_grad_sq_norm` of parameters on **one** device, left there: a float64 scalar tensor (None when
    no parameter has a gradient), read back by the caller when it suits it (a worker alone on a GPU reads it with
    the step's loss, after the next step is queued: ``engine.py``). The same operations as
    :func:`local_grad_sq_norm`, so the same value to the bit."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return None
    if len({g.device for g in grads}) != 1:
        raise ValueError("device_grad_sq_norm takes parameters on one device; use local_grad_sq_norm")
    grads = [g if g.dtype == torch.float32 else g.float() for g in grads]
    return torch.stack(torch._foreach_norm(grads, 2.0)).double().square().sum()


def clip_grads_on_device(params: Sequence[torch.Tensor], sq_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """:func:`clip_grads` without reading the norm back: the coefficient ``min(1, max_norm / (norm + 1e-6))`` is
    computed on the device in float64 (as :func:`clip_grads` does in Python) and every gradient is multiplied by it
    (a product by exactly 1 changes nothing), so the gradients match :func:`clip_grads`' to the bit. Returns the
    norm, a float64 scalar tensor on the device."""
    if max_norm <= 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    norm = sq_norm.sqrt()
    if math.isfinite(max_norm):
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            with torch.no_grad():
                torch._foreach_mul_(grads, coef.float())  # float32, as the Python scalar becomes
    return norm


def local_grad_sq_norm(params: Iterable[torch.Tensor]) -> float:
    """Sum of squared gradient entries over ``params`` (those without a gradient count as zero).

    Each gradient's norm is taken in float32 on its own device (torch's multi-tensor ``_foreach_norm``, as
    ``clip_grad_norm_`` does), and the squares are summed in float64 with **one** read back to the host: a read
    per tensor stalled a GPU stage once per parameter every step (a job reports its gradient norm every step).
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            g = p.grad.detach()
            by_device.setdefault(g.device, []).append(g if g.dtype == torch.float32 else g.float())
    total = 0.0
    for grads in by_device.values():
        norms = torch.stack(torch._foreach_norm(grads, 2.0))  # (n,) float32 on that device
        total += float(norms.double().square().sum().item())
    return total


def clip_grads(params: Sequence[torch.Tensor], total_sq_norm: float, max_norm: float) -> float:
    """Scale ``params``' gradients so the global norm is at most ``max_norm``; returns the global norm.

    ``total_sq_norm`` is the sum of ``local_grad_sq_norm`` over every stage (the caller's ``reduce``).
    """
    if max_norm <= 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    total_norm = math.sqrt(total_sq_norm)
    coef = min(1.0, max_norm / (total_norm + 1e-6))
    if coef < 1.0:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            with torch.no_grad():
                torch._foreach_mul_(grads, coef)
    return total_norm


def clip_grad_norm_global(
    params: Sequence[torch.Tensor],
    norm_params: Iterable[torch.Tensor],
    max_norm: float,
    reduce: Callable[[float], float],
) -> float:
    """Global clipping across stages: local squared norm of ``norm_params``, ``reduce`` sums it over all
    stages,
    then every gradient in ``params`` is scaled. Returns the global norm (before clipping)."""
    return clip_grads(params, reduce(local_grad_sq_norm(norm_params)), max_norm)


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up then cosine decay to ``min_lr`` (nanoGPT's ``get_lr``), a pure function of the step.

    step < warmup_steps: ``max_lr * (step + 1) / (warmup_steps + 1)``; step > decay_steps: ``min_lr``;
    in between: cosine from ``max_lr`` down to ``min_lr``. ``warmup_steps = 0, decay_steps = 0`` is constant.
    """

    max_lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    decay_steps: int = 0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError("warmup_steps and decay_steps must be >= 0")
        if self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"decay_steps ({self.decay_steps}) must exceed warmup_steps ({self.warmup_steps})")

    def __call__(self, step: int) -> float:
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.decay_steps)


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Learning rate at ``step`` (0-based). See ``LRSchedule``."""
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if decay_steps <= warmup_steps:
        return max_lr
    if step > decay_steps:
        return min_lr
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (max_lr - min_lr)
