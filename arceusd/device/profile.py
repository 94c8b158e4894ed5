"""Measuring this device and the links to peers, for the planner.

Owns: a short matmul benchmark per available device kind (CPU always; CUDA / MPS when torch says available)
giving FLOP/s, free memory and thread count; the calibration that turns that figure into what a stage worker
really takes (``measure_calibration``); a JSON cache of those figures with a maximum age; the conversion to
``partitioner.DeviceProfile``. The links to peers are measured by :mod:`arceusd.device.link_probe`.

Calibration, all measured on the device with the model's own blocks (``arceusd.models``) and the worker's own
optimizers (``arceusd.worker.optim``), so nothing in it is a constant fitted to one machine:
- dispatch: forward + backward of a chain of blocks of a *tiny* model of the job's family (negligible
  FLOPs), per block: the fixed Python/autograd cost every block pays per micro-batch;
- block efficiency: forward + backward of the same chain of the job's model (embedding, a few transformer
  blocks, head, through the loss: a stage as the worker runs it; ``chain_blocks``) at its micro-batch size;
  the FLOPs the cost model counts for them over (time - dispatch), as a fraction of the matmul benchmark's
  FLOP/s;
- optimizer: one AdamW and one SGD step over the chain's parameters, per parameter.
Without a job (the daemon's probe) a reference model (:data:`REFERENCE_MODEL`) stands in for it.

This module reads clocks and imports torch; the planner itself does neither. Torch is imported lazily so the
daemon can import this module without paying for torch until it actually measures.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.models.costs import block_costs
from partitioner.inputs import MAX_BLOCK_EFFICIENCY, DeviceProfile

ModelConfig = MLPConfig | GPTConfig
"""The model families a device is calibrated on (the built-in ones; a stock LM's blocks cost like a GPT's)."""

if TYPE_CHECKING:
    import torch

REFERENCE_MODEL = GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=64, vocab_size=65)
"""The block shapes the daemon's probe calibrates on while it does not know a job's (a small GPT)."""
REFERENCE_MICRO_BATCH = 4

CACHE_FILE = "device_profile.json"
CACHE_MAX_AGE_S = 24 * 3600.0
"""How long a measurement of this device is used before the daemon measures it again."""
CACHE_VERSION = 2
"""2: calibration fields; a version-1 cache is measured again (it would plan uncalibrated for a day)."""


@dataclass(frozen=True)
class Calibration:
    """What the matmul benchmark misses, measured on this device (see the module docstring). The defaults
    mean "uncalibrated": the cost model then is the benchmark's FLOP/s alone."""

    block_efficiency: float = 1.0
    dispatch_s: float = 0.0
    adamw_s_per_param: float = 0.0
    sgd_s_per_param: float = 0.0
    model: str = ""
    """The model shape it was measured on ("" when uncalibrated)."""


@dataclass(frozen=True)
class DeviceMeasurement:
    """One device kind on this machine: measured matmul FLOP/s (float32), free memory in bytes, and the
    calibration (defaults: uncalibrated, as a profile older than these fields)."""

    kind: str
    flops_per_s: float
    memory_bytes: int
    threads: int
    name: str
    measured_at: float
    block_efficiency: float = 1.0
    dispatch_s: float = 0.0
    adamw_s_per_param: float = 0.0
    sgd_s_per_param: float = 0.0
    calibrated_on: str = ""

    def with_calibration(self, c: Calibration) -> DeviceMeasurement:
        return replace(
            self,
            block_efficiency=c.block_efficiency,
            dispatch_s=c.dispatch_s,
            adamw_s_per_param=c.adamw_s_per_param,
            sgd_s_per_param=c.sgd_s_per_param,
            calibrated_on=c.model,
        )


# --- memory -----------------------------------------------------------------------------------------------
def parse_meminfo_available(text: str) -> int | None:
    """MemAvailable from /proc/meminfo text, in bytes (None if absent)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                scale = 1024 if (len(parts) < 3 or parts[2].lower() == "kb") else 1
                return int(parts[1]) * scale
    return None


def cpu_free_memory(meminfo_path: str = "/proc/meminfo") -> int:
    """Available RAM: /proc/meminfo's MemAvailable, else free pages x page size via os.sysconf."""
    try:
        with open(meminfo_path) as f:
            found = parse_meminfo_available(f.read())
        if found is not None:
            return found
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


# --- compute ----------------------------------------------------------------------------------------------
def available_kinds() -> tuple[str, ...]:
    import torch  # torch: only to measure

    kinds = ["cpu"]
    if torch.cuda.is_available():
        kinds.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        kinds.append("mps")
    return tuple(kinds)


def _sync(kind: str) -> None:
    import torch  # torch: only to measure

    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()


def measure_device(
    kind: str,
    size: int = 512,
    repeats: int = 4,
    clock: Callable[[], float] = time.perf_counter,
    now: Callable[[], float] = time.time,
) -> DeviceMeasurement:
    """Time ``repeats`` float32 matmuls of ``size`` x ``size`` (after a warm-up) on ``kind``; best of 3.

    Error handling: raises ``ValueError`` for an unknown or unavailable kind.
    """
    import torch  # torch: only to measure

    if kind not in available_kinds():
        raise ValueError(f"device kind {kind!r} is not available here (available: {available_kinds()})")
    if size <= 0 or repeats <= 0:
        raise ValueError("size and repeats must be positive")
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(kind)
    b = torch.randn(size, size, generator=gen).to(kind)
    (a @ b).sum().item()  # warm-up (kernel selection, lazy init)
    best = float("inf")
    for _ in range(3):
        _sync(kind)
        start = clock()
        for _ in range(repeats):
            c = a @ b
        _sync(kind)
        best = min(best, clock() - start)
        del c
    flops = 2.0 * size**3 * repeats / max(best, 1e-9)
    if kind == "cuda":
        free, _total = torch.cuda.mem_get_info()
        memory = int(free)
        name = torch.cuda.get_device_name()
    else:
        memory = cpu_free_memory()  # MPS shares the unified memory with the CPU
        name = kind
    return DeviceMeasurement(kind, flops, memory, torch.get_num_threads(), name, now())


MAX_CHAIN_LAYERS = 4
"""At most this many transformer blocks (MLP: 4 x as many layers) in the calibration's chain."""


def chain_blocks(model: ModelConfig) -> tuple[int, ...]:
    """The block indices the calibration runs as one stage would: a GPT's embedding, its first
    ``MAX_CHAIN_LAYERS`` transformer blocks and its head; an MLP's first ``4 x MAX_CHAIN_LAYERS`` layers.
    Several distinct blocks in a row, not one block over and over: a stage's weights do not all stay in cache
    between its blocks, and the calibration should pay for that as the stage does."""
    from arceusd.models.build import num_blocks  # torch

    n = num_blocks(model)
    if isinstance(model, GPTConfig):
        return (0, *range(1, 1 + min(model.n_layer, MAX_CHAIN_LAYERS)), n - 1)
    return tuple(range(min(n, 4 * MAX_CHAIN_LAYERS)))


def _tiny_like(model: ModelConfig) -> ModelConfig:
    """A model of the same family and chain length with negligible FLOPs: what is left is dispatch."""
    if isinstance(model, GPTConfig):
        return GPTConfig(n_layer=min(model.n_layer, MAX_CHAIN_LAYERS), n_head=1, n_embd=4, block_size=2, vocab_size=4)
    return MLPConfig(tuple(4 for _ in model.layer_sizes))


def _chain_input(model: ModelConfig, micro_batch: int, device: str, gen: torch.Generator) -> torch.Tensor:
    import torch  # torch: only to measure

    if isinstance(model, GPTConfig):
        return torch.randint(0, model.vocab_size, (micro_batch, model.block_size), generator=gen).to(device)
    return torch.randn(micro_batch, model.layer_sizes[0], generator=gen).to(device)


def _time_chain(
    model: ModelConfig, kind: str, micro_batch: int, repeats: int, clock: Callable[[], float]
) -> tuple[list[float], list[torch.nn.Parameter]]:
    """Seconds of one forward + backward of ``chain_blocks(model)`` at ``micro_batch`` samples, as a stage
    runs it (through the loss when the chain ends with the model's last block, else from a gradient of the
    output's shape), once per repeat after a warm-up; and the chain's parameters (their gradients set)."""
    import torch  # torch: only to measure

    from arceusd.models.build import build_block, loss_sum, num_blocks  # torch

    gen = torch.Generator().manual_seed(0)
    indices = chain_blocks(model)
    chain = torch.nn.Sequential(*(build_block(model, i, seed=0) for i in indices)).to(kind)
    x = _chain_input(model, micro_batch, kind, gen)
    targets: torch.Tensor | None = None
    if indices[-1] == num_blocks(model) - 1:
        n_out = model.vocab_size if isinstance(model, GPTConfig) else model.layer_sizes[-1]
        shape = (micro_batch, model.block_size) if isinstance(model, GPTConfig) else (micro_batch,)
        targets = torch.randint(0, n_out, shape, generator=gen).to(kind)
    grad: torch.Tensor | None = None

    def one() -> None:
        nonlocal grad
        for p in chain.parameters():
            p.grad = None
        y = chain(x)
        if targets is not None:
            torch.autograd.backward(loss_sum(y, targets))
            return
        if grad is None:
            grad = torch.randn(y.shape, generator=gen).to(kind)
        torch.autograd.backward(y, grad)

    one()  # warm-up: allocations, kernel choice
    samples = []
    for _ in range(repeats):
        _sync(kind)
        start = clock()
        one()
        _sync(kind)
        samples.append(clock() - start)
    return samples, list(chain.parameters())


def _optimizer_s_per_param(
    params: Sequence[torch.nn.Parameter],
    kind: str,
    repeats: int,
    pick: Callable[[list[float]], float],
    clock: Callable[[], float],
) -> tuple[float, float]:
    """(AdamW, SGD) seconds per parameter of the worker's own optimizers stepping ``params`` (with grads)."""
    from arceusd.worker.optim import AdamWConfig, SGDConfig, make_optimizer  # torch

    numel = sum(p.numel() for p in params) or 1
    out = []
    for config in (AdamWConfig(), SGDConfig()):
        opt = make_optimizer(((f"p{i}", p) for i, p in enumerate(params)), config)
        opt.step(1e-9)  # warm-up: creates the state buffers
        samples = []
        for _ in range(repeats):
            _sync(kind)
            start = clock()
            opt.step(1e-9)
            _sync(kind)
            samples.append(clock() - start)
        out.append(pick(samples) / numel)
    return out[0], out[1]


def measure_calibration(
    kind: str,
    flops_per_s: float,
    model: ModelConfig = REFERENCE_MODEL,
    micro_batch: int = REFERENCE_MICRO_BATCH,
    repeats: int = 5,
    stat: str = "min",
    clock: Callable[[], float] = time.perf_counter,
) -> Calibration:
    """Calibrate ``flops_per_s`` (this device's matmul benchmark, measured under the same conditions) for
    ``model`` at ``micro_batch`` samples per micro-batch; see the module docstring. ``stat``: ``"min"``
    (the least disturbed of ``repeats``: a device measured alone) or ``"median"`` (a device sharing its
    machine with others at work).

    Error handling: ``ValueError`` for an unavailable kind, a non-positive speed, micro-batch or repeat count,
    or an unknown ``stat``.
    """
    import torch  # torch: only to measure

    if kind not in available_kinds():
        raise ValueError(f"device kind {kind!r} is not available here (available: {available_kinds()})")
    if not flops_per_s > 0 or micro_batch <= 0 or repeats <= 0:
        raise ValueError("flops_per_s, micro_batch and repeats must be positive")
    picks: dict[str, Callable[[list[float]], float]] = {"min": min, "median": statistics.median}
    if stat not in picks:
        raise ValueError(f"stat must be one of {sorted(picks)}, got {stat!r}")
    pick = picks[stat]
    with torch.enable_grad():
        tiny, _ = _time_chain(_tiny_like(model), kind, 1, repeats, clock)
        real, params = _time_chain(model, kind, micro_batch, repeats, clock)
        adamw, sgd = _optimizer_s_per_param(params, kind, repeats, pick, clock)
    return calibration_from_timings(model, micro_batch, flops_per_s, pick(tiny), pick(real), adamw, sgd)


def calibration_from_timings(
    model: ModelConfig,
    micro_batch: int,
    flops_per_s: float,
    tiny_s: float,
    real_s: float,
    adamw_s_per_param: float,
    sgd_s_per_param: float,
) -> Calibration:
    """The calibration from a timed forward + backward of ``chain_blocks(model)``: ``tiny_s`` for the tiny
    model of its family (dispatch), ``real_s`` for the model itself at ``micro_batch`` samples.

    Fits the cost model's compute term, (FLOPs x micro_batch) / (flops_per_s x efficiency) + dispatch per
    block, to the chain. Pure (tested with made-up timings)."""
    if not (tiny_s >= 0 and real_s >= 0):
        raise ValueError(f"timings must be >= 0, got {tiny_s} and {real_s}")
    indices = chain_blocks(model)
    dispatch = tiny_s / len(indices)
    costs = block_costs(model)
    flops = sum(costs[i].forward_flops_per_sample + costs[i].backward_flops_per_sample for i in indices)
    busy = real_s - len(indices) * dispatch
    # compute hidden under dispatch (a model of tiny blocks): no efficiency can be read from it
    efficiency = flops * micro_batch / (busy * flops_per_s) if busy > 0.1 * tiny_s and busy > 0 else 1.0
    efficiency = min(max(efficiency, 1e-3), MAX_BLOCK_EFFICIENCY)
    return Calibration(efficiency, dispatch, adamw_s_per_param, sgd_s_per_param, model_label(model, micro_batch))


def model_label(model: ModelConfig, micro_batch: int) -> str:
    """A short text naming the shape a calibration was measured on (stored with it, shown in logs)."""
    if isinstance(model, GPTConfig):
        return (
            f"gpt n_layer={model.n_layer} n_head={model.n_head} n_embd={model.n_embd} "
            f"block_size={model.block_size} vocab_size={model.vocab_size} micro_batch={micro_batch}"
        )
    return f"mlp {list(model.layer_sizes)} micro_batch={micro_batch}"


def measure_all(size: int = 512, repeats: int = 4) -> tuple[DeviceMeasurement, ...]:
    """Every available kind: the matmul benchmark, calibrated on :data:`REFERENCE_MODEL`."""
    found = []
    for k in available_kinds():
        m = measure_device(k, size, repeats)
        found.append(m.with_calibration(measure_calibration(k, m.flops_per_s)))
    return tuple(found)


# --- cache ------------------------------------------------------------------------------------------------
def load_or_measure(
    cache_dir: Path,
    max_age_s: float = CACHE_MAX_AGE_S,
    now: float | None = None,
    measure: Callable[[], Sequence[DeviceMeasurement]] = measure_all,
    threads: int | None = None,
) -> tuple[DeviceMeasurement, ...]:
    """Cached measurements from ``cache_dir/device_profile.json`` if younger than ``max_age_s`` (and, with
    ``threads``, taken at that many torch threads), else measure and write the cache (atomically: temp file +
    rename). A corrupt or foreign cache is remeasured."""
    t = time.time() if now is None else now
    path = Path(cache_dir) / CACHE_FILE
    try:
        cached = fresh_measurements(json.loads(path.read_text()), t, max_age_s, threads)
    except (OSError, ValueError):
        cached = None
    if cached is not None:
        return cached
    found = tuple(measure())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"version": CACHE_VERSION, "measured_at": t, "devices": [asdict(d) for d in found]}, sort_keys=True)
    )
    os.replace(tmp, path)
    return found


def fresh_measurements(
    data: Any, now: float, max_age_s: float = CACHE_MAX_AGE_S, threads: int | None = None
) -> tuple[DeviceMeasurement, ...] | None:
    """The measurements a cache's contents ``data`` hold, when :func:`load_or_measure` would use them at ``now``
    (this version, younger than ``max_age_s``, taken at ``threads`` torch threads when given); None: it measures."""
    try:
        if data.get("version") != CACHE_VERSION or not 0 <= now - float(data["measured_at"]) <= max_age_s:
            return None
        cached = tuple(DeviceMeasurement(**d) for d in data["devices"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return cached if threads is None or all(d.threads == threads for d in cached) else None


def is_measured(cache_dir: Path, now: float | None = None) -> bool:
    """Whether ``cache_dir`` holds a measurement of this device the daemon uses as it is (nothing waits on one)."""
    try:
        data = json.loads((Path(cache_dir) / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return fresh_measurements(data, time.time() if now is None else now) is not None


MEASURING_NOTE = "the daemon is measuring this device first (once a day; about half a minute)..."


def measuring_note(measured: bool, daemon_running: bool) -> str | None:
    """What a command that asks the daemon about this device (``market``, ``submit`` and its ``--quote``,
    ``join``) says before it waits (issue 31: the first ``market`` took 23 s with no word): the daemon measures
    the device first when no fresh measurement is cached. Nothing once measured, nor without a daemon (nothing
    waits then)."""
    return MEASURING_NOTE if daemon_running and not measured else None


def best_measurement(found: Sequence[DeviceMeasurement]) -> DeviceMeasurement:
    """The fastest device (ties: cuda, mps, cpu order by name). Raises ``ValueError`` when empty."""
    if not found:
        raise ValueError("no device measurements")
    return max(found, key=lambda d: (d.flops_per_s, d.kind))


def chosen_measurement(found: Sequence[DeviceMeasurement], kinds: Sequence[str] = ()) -> DeviceMeasurement:
    """The device a daemon lends: the fastest of ``found`` whose kind is in ``kinds`` (the config's ``devices``;
    empty: any). Raises ``ValueError`` naming the kinds when none of them was measured on this machine."""
    allowed = [d for d in found if not kinds or d.kind in kinds]
    if not allowed:
        measured = ", ".join(d.kind for d in found) or "none"
        raise ValueError(
            f"devices = {list(kinds)} names no device of this machine (measured: {measured}); "
            "fix `devices` in config.toml"
        )
    return best_measurement(allowed)


def to_device_profile(
    m: DeviceMeasurement, peer_id: str, memory_fraction: float = 0.8, optimizer: str = "adamw"
) -> DeviceProfile:
    """The planner's view of a measured device, offering ``memory_fraction`` of its free memory, with its
    calibration (the optimizer cost of ``optimizer``: ``"adamw"`` or ``"sgd"``)."""
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    per_param = {"adamw": m.adamw_s_per_param, "sgd": m.sgd_s_per_param}
    if optimizer not in per_param:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(per_param)}")
    return DeviceProfile(
        peer_id,
        m.flops_per_s,
        int(m.memory_bytes * memory_fraction),
        m.kind,
        block_efficiency=m.block_efficiency,
        dispatch_s=m.dispatch_s,
        optimizer_s_per_param=per_param[optimizer],
    )
