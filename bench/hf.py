"""Hugging Face models in Arceus against the same models elsewhere, on this machine's cores (issue 30, item 8).

Part 1, one process, the same threads, one after the other (tokens/s of training steps: forward, backward, AdamW):
  - Arceus's blocks of a stock architecture (``arceusd.models.hf``, as a stage worker holds them) against the plain
    ``transformers`` model of the same config: the per-block build costs nothing (goal: about 1.0x);
  - a GPT-2 of the built-in GPT's size (same layers, width, heads, context, vocabulary) against the built-in GPT
    (``arceusd.models.gpt``): goal at most 10 % slower.
Part 2 (skipped with ``--no-swarm``): the swarm against the plain loop: 2 local daemons train
``examples/llama-shakespeare.toml``'s model for a fixed time (tokens/s from ``status``, the job's one rate:
``arceusd.jobs.record.throughput``) against a plain ``transformers`` loop of the same model and batch given every core.

With ``--device cuda`` (bf16 autocast, as a worker of a ``precision = "bf16"`` job trains): part 1 on the GPU
with larger models; part 2 is one GPU daemon alone (a Llama of :data:`GPU_LLAMA`'s shape, ``precision = "bf16"``)
against a plain ``transformers`` loop of the same model and batch on that GPU: goal at least 0.9x. About three
minutes on an H100 (``bench/gpu_check.sh`` runs it).

``--overhead``: only the engine's fixed cost per step: the solo engine against a plain loop of the same tiny model
(:data:`OVERHEAD_MODEL`), batch, AdamW, clipping and precision, alternating rounds in one process (half a minute
on two CPU cores; ``bench/gpu_check.sh`` runs it on the GPU too, where the model is launch-bound).

    python bench/hf.py [--quick] [--no-swarm | --swarm-only | --overhead] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from arceusd.cli.swarm import LocalSwarm
from arceusd.jobs.procs.source import open_batch_source
from arceusd.jobs.spec.schema import load_spec
from arceusd.models.build import build_reference_model, loss_mean
from arceusd.models.config import GPTConfig
from arceusd.models.hf.blocks import build_hf_block, tie_hf_blocks, transformers_config
from arceusd.models.hf.config import HFModelConfig, hf_config_from_dict, num_hf_blocks
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import InMemoryFabric
from arceusd.worker.optim import AdamWConfig, LRSchedule, OptimizerConfig
from arceusd.worker.pending_step import PendingStep
from arceusd.worker.process import SpecLR, optimizer_config
from arceusd.worker.stage import StageSpec, build_stage

ROOT = Path(__file__).resolve().parent.parent
LLAMA_EXAMPLE = ROOT / "examples" / "llama-shakespeare.toml"


def llama_config(layers: int, width: int, heads: int, context: int, vocab: int) -> HFModelConfig:
    return hf_config_from_dict(
        {
            "model_type": "llama",
            "vocab_size": vocab,
            "hidden_size": width,
            "intermediate_size": 4 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "max_position_embeddings": context,
            "tie_word_embeddings": False,
        },
        context,
    )


def gpt2_config(layers: int, width: int, heads: int, context: int, vocab: int) -> HFModelConfig:
    return hf_config_from_dict(
        {
            "model_type": "gpt2",
            "vocab_size": vocab,
            "n_embd": width,
            "n_layer": layers,
            "n_head": heads,
            "n_positions": context,
            "n_inner": 4 * width,
            "tie_word_embeddings": False,
        },
        context,
    )


class Blocks(nn.Module):
    """Every block of a stock config as Arceus builds them, in one process (the stages of a one-device plan)."""

    def __init__(self, config: HFModelConfig) -> None:
        super().__init__()
        blocks = {i: build_hf_block(config, i, seed=0) for i in range(num_hf_blocks(config))}
        tie_hf_blocks(config, blocks, seed=0)
        self.blocks = nn.ModuleList(blocks[i] for i in sorted(blocks))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = ids
        for block in self.blocks:
            x = block(x)
        return x


class Plain(nn.Module):
    """``AutoModelForCausalLM`` of the same config, giving logits."""

    def __init__(self, config: HFModelConfig) -> None:
        super().__init__()
        self.model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            transformers_config(config), attn_implementation="sdpa"
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits  # type: ignore[no-any-return]


DEVICE = "cpu"
"""Where the bench trains (``--device``); on ``cuda`` every step runs under bf16 autocast."""


@contextlib.contextmanager
def precision() -> Iterator[None]:
    """bf16 autocast on a GPU (the worker's ``precision = "bf16"``), nothing on the CPU."""
    if DEVICE == "cpu":
        yield
    else:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            yield


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def plain_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, clip: float | None = None
) -> None:
    """One step of a plain training loop: forward (bf16 autocast on a GPU), cross-entropy, backward, clipping
    (foreach) when ``clip`` is given, the optimizer. ``x``/``y`` may be on the CPU (copied without blocking)."""
    optimizer.zero_grad()
    with precision():
        logits = model(x.to(DEVICE, non_blocking=True))
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), y.to(DEVICE, non_blocking=True).reshape(-1)
        )
    loss.backward()  # type: ignore[no-untyped-call]
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)
    optimizer.step()


class Trainer:
    """AdamW training steps of one model on fixed random ids."""

    def __init__(self, model: nn.Module, batch: int, context: int, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, context + 1), generator=gen).to(DEVICE)
        self.x, self.y = ids[:, :-1], ids[:, 1:]
        self.model = model.to(DEVICE)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.tokens = batch * context
        self.step()  # warm-up
        self.step()

    def step(self) -> None:
        plain_step(self.model, self.optimizer, self.x, self.y)

    def timed(self, steps: int) -> float:
        sync()
        began = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync()
        return steps * self.tokens / (time.perf_counter() - began)


def compare(
    a: nn.Module, b: nn.Module, batch: int, context: int, vocab: int, steps: int, rounds: int
) -> tuple[float, float]:
    """Tokens/s of ``a`` and ``b``, alternating ``rounds`` times (the best round of each: the machine is shared)."""
    ta, tb = Trainer(a, batch, context, vocab), Trainer(b, batch, context, vocab)
    best_a = best_b = 0.0
    for _ in range(rounds):
        best_a = max(best_a, ta.timed(steps))
        best_b = max(best_b, tb.timed(steps))
    del ta, tb
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return best_a, best_b


def part_one(quick: bool) -> None:
    if DEVICE == "cuda":  # a GPT-2-small-like shape: the GPU busy, not launch-bound
        layers, width, heads, context, vocab, batch = (
            (4, 512, 8, 256, 8192, 16) if quick else (12, 768, 12, 512, 16384, 16)
        )
        steps, rounds = (5, 3) if quick else (10, 3)
    else:
        layers, width, heads, context, vocab, batch = (2, 256, 4, 128, 4096, 8) if quick else (6, 384, 6, 256, 8192, 8)
        steps, rounds = (3, 3) if quick else (5, 5)
    torch.set_num_threads(os.cpu_count() or 1)
    where = (
        f"{torch.cuda.get_device_name()}, bf16 autocast" if DEVICE == "cuda" else f"{torch.get_num_threads()} threads"
    )
    print(
        f"part 1: one process, {where}; {layers} layers x {width} wide, {heads} heads, "
        f"context {context}, vocabulary {vocab}, batch {batch}; best of {rounds} alternating rounds of {steps} "
        f"AdamW steps"
    )
    for name, config in (
        ("llama", llama_config(layers, width, heads, context, vocab)),
        ("gpt2", gpt2_config(layers, width, heads, context, vocab)),
    ):
        ours, plain = compare(Blocks(config), Plain(config), batch, context, vocab, steps, rounds)
        print(
            f"  {name}: Arceus's blocks {ours:,.0f} tokens/s, plain transformers {plain:,.0f}: "
            f"{ours / plain:.2f}x (goal about 1.0x)"
        )
    built_in = GPTConfig(n_layer=layers, n_head=heads, n_embd=width, block_size=context, vocab_size=vocab)
    hf, gpt = compare(
        Blocks(gpt2_config(layers, width, heads, context, vocab)),
        build_reference_model(built_in, seed=0),
        batch,
        context,
        vocab,
        steps,
        rounds,
    )
    print(
        f"  GPT-2 blocks {hf:,.0f} tokens/s against the built-in GPT of the same size {gpt:,.0f}: "
        f"{hf / gpt:.2f}x (goal at least 0.90x)"
    )


def swarm_tokens_per_s(spec: Path, root: Path, seconds: float, size: int = 2) -> dict[str, Any]:

    swarm = LocalSwarm(root, size, ["--auto-join"], preset="lan")
    try:
        swarm.start()
        swarm.wait_converged(120)
        submit = [
            sys.executable,
            "-m",
            "arceusd",
            "--state-dir",
            str(swarm.state_dir(0)),
            "submit",
            str(spec),
            "--members",
            str(size),
        ]
        out = subprocess.run(submit, capture_output=True, text=True, timeout=300, check=True)
        job_id = out.stdout.split()[2]
        deadline = time.monotonic() + 600
        job: dict[str, Any] = swarm.call(0, "job", {"job_id": job_id})
        while time.monotonic() < deadline and job["step"] < 2:  # timed from the first steps, not the start-up
            time.sleep(0.5)
            job = swarm.call(0, "job", {"job_id": job_id})
        began, first = time.monotonic(), job["step"]
        while time.monotonic() - began < seconds:
            time.sleep(1.0)
            job = swarm.call(0, "job", {"job_id": job_id})
            if job["state"] in ("failed", "cancelled", "done"):
                break
        steps = job["step"] - first
        elapsed = time.monotonic() - began
        swarm.call(0, "cancel", {"job_id": job_id}, timeout=60)
        return {
            "status": job.get("tokens_per_s"),
            "engine_step_s": (job.get("stage_timing") or {}).get("step_time_s"),
            "counted_steps": steps,
            "elapsed": elapsed,
            "devices": len(job["members"]),
            "device_line": swarm.call(0, "status").get("device"),
        }
    finally:
        swarm.close()


def part_two(quick: bool) -> None:

    seconds = 60.0 if quick else 300.0
    spec = load_spec(str(LLAMA_EXAMPLE))
    assert isinstance(spec.model, HFModelConfig)
    tokens_per_step = spec.training.batch_size * spec.model.block_size
    with tempfile.TemporaryDirectory(prefix="arceus-hf-bench-") as tmp:
        swarm = swarm_tokens_per_s(LLAMA_EXAMPLE, Path(tmp) / "swarm", seconds)
    counted = swarm["counted_steps"] * tokens_per_step / swarm["elapsed"]
    torch.set_num_threads(os.cpu_count() or 1)
    model = build_reference_model(spec.model, spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.training.lr)
    source = open_batch_source(spec)
    began, step = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        x, y = source.batch(step)
        optimizer.zero_grad()
        loss_mean(model(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        step += 1
    plain = step * tokens_per_step / (time.perf_counter() - began)
    status = swarm["status"]
    print(f"part 2: {LLAMA_EXAMPLE.name}'s model, {seconds:.0f} s each, one after the other")
    print(
        f"  swarm: 2 daemons, {swarm['devices']} devices: {counted:,.0f} tokens/s from its step counter, "
        f"{status if status is None else format(status, ',.0f')} from status"
    )
    print(f"  plain: 1 process, {torch.get_num_threads()} threads: {plain:,.0f} tokens/s")
    print(f"  swarm/plain: {counted / plain:.2f}x")


GPU_LLAMA = {
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
}
"""Part 2's model on a GPU: about 85 M parameters, the shipped tokenizer's vocabulary (a GPU step of batch
:data:`GPU_BATCH` x 512 tokens is tens of milliseconds: the daemon's per-step work must not show)."""
GPU_BATCH = 32
GPU_CONTEXT = 512


def gpu_spec(folder: Path, quick: bool) -> Path:
    """A ``precision = "bf16"`` job of :data:`GPU_LLAMA` on Tiny Shakespeare, long enough to outlast the timing."""
    config = {**GPU_LLAMA, "num_hidden_layers": 4} if quick else GPU_LLAMA
    (folder / "config.json").write_text(json.dumps(config))
    spec = folder / "gpu-llama.toml"
    spec.write_text(
        f"""name = "gpu-llama"
seed = 7

[model]
type = "hf"
config = "config.json"
block_size = {GPU_CONTEXT}

[data]
kind = "tokens"
path = "{ROOT / "data/tinyshakespeare/input.txt"}"
tokenizer = "{ROOT / "data/tokenizers/shakespeare-bpe.json"}"
format = "text"
val_fraction = 0.1

[training]
steps = 100000
batch_size = {GPU_BATCH}
micro_batches = 1
optimizer = "adamw"
lr = 3e-4
precision = "bf16"
eval_interval_steps = 0

[checkpoint]
interval_steps = 100000
"""
    )
    return spec


def timed_loop(step: Callable[[int], None], seconds: float) -> float:
    """Steps per second of ``step(0), step(1), ...`` for about ``seconds``, after three untimed warm-up steps (the
    swarm's timing, too, starts after its first steps)."""
    for i in range(3):
        step(i)
    sync()
    began, done = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        step(done)
        done += 1
        if done % 10 == 0:
            sync()
    sync()
    return done / (time.perf_counter() - began)


def solo_engine(
    model: HFModelConfig,
    seed: int,
    optimizer: OptimizerConfig,
    lr_schedule: LRSchedule,
    max_grad_norm: float,
    bf16: bool,
) -> StageEngine:
    """The engine of a job's only worker, as ``process.py`` builds it: one stage holding every block on
    :data:`DEVICE` (``max_grad_norm``: ``inf`` when the spec does not clip: the worker always takes the norm)."""
    module = build_stage(model, seed, StageSpec(0, num_hf_blocks(model)))
    config = EngineConfig(
        stage=0,
        num_stages=1,
        num_micro_batches=1,
        optimizer=optimizer,
        lr_schedule=lr_schedule,
        max_grad_norm=max_grad_norm,
        autocast_bf16=bf16,
        device=DEVICE,
    )
    return StageEngine(module, InMemoryFabric([1]).links(0), config)


def lagged_steps(engine: StageEngine, lag: bool = True) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A step function running ``engine.launch_step`` as the worker does: a step's figures read once the next is
    queued (``lag``), else at once (the worker before ``pending_step.py``)."""
    queued: list[PendingStep] = []

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        queued.append(engine.launch_step(x, y))
        if len(queued) > (1 if lag else 0):
            queued.pop(0).result()

    return step


def engine_steps_per_s(spec: Any, seconds: float, lag: bool = True) -> float:
    """The stage worker's engine (``StageEngine.launch_step``: one stage holding every block, bf16 autocast, the
    spec's AdamW and learning rate, the grad norm the worker always takes) on the spec's batches, in this process:
    what a GPU daemon alone would train at if its worker loop and the daemon cost nothing. ``lag``: a step's
    figures read once the next is queued, as the worker reads them; else read at once (the worker before
    ``pending_step.py``), the baseline the lag is measured against in the same run."""

    t = spec.training
    engine = solo_engine(
        spec.model,
        spec.seed,
        optimizer_config(t),
        SpecLR(max_lr=t.lr, training=t),
        t.grad_clip if t.grad_clip > 0 else math.inf,
        bf16=True,
    )
    source = open_batch_source(spec)
    run = lagged_steps(engine, lag)
    return timed_loop(lambda i: run(*source.batch(i)), seconds)


def plain_steps_per_s(spec: Any, seconds: float) -> tuple[float, int]:
    """A plain ``transformers`` training loop of the spec's model on its batches: steps per second, parameters."""

    trainer = Plain(spec.model).to(DEVICE)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=spec.training.lr)
    source = open_batch_source(spec)

    return timed_loop(lambda i: plain_step(trainer, optimizer, *source.batch(i)), seconds), sum(
        p.numel() for p in trainer.parameters()
    )


OVERHEAD_MODEL = (12, 32, 2, 16, 128, 2)
"""``--overhead``'s Llama: layers, width, heads, context, vocabulary, batch: a step of a few milliseconds on one CPU
thread (and launch-bound on a GPU), so what the engine adds per step is most of what differs."""


def plain_adamw(params: Iterator[nn.Parameter], c: AdamWConfig) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` as a tuned plain loop sets it: the fused kernel (foreach where there is none)."""
    kwargs: dict[str, Any] = {"lr": c.lr, "betas": (c.beta1, c.beta2), "eps": c.eps, "weight_decay": c.weight_decay}
    try:
        return torch.optim.AdamW(list(params), fused=True, **kwargs)
    except RuntimeError:  # pragma: no cover - no fused kernel for this device or torch
        return torch.optim.AdamW(list(params), foreach=True, **kwargs)


def ms_per_step(
    step: Callable[[torch.Tensor, torch.Tensor], None], batches: list[Any], steps: int
) -> tuple[float, float]:
    """Milliseconds a step of ``step`` over ``batches``: wall-clock, and this process's CPU time (what a busy
    shared machine's other processes do not inflate: the fixed cost measured on the CPU)."""
    sync()
    began, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(*batches[i % len(batches)])
    sync()
    return (time.perf_counter() - began) * 1000 / steps, (time.process_time() - cpu) * 1000 / steps


def part_overhead(quick: bool) -> tuple[float, float]:
    """The engine's fixed cost per step (``--overhead``): the solo engine (as part 2 runs it alone: one stage,
    ``launch_step`` with the lagged read, AdamW, clipping at 1.0) against a plain ``transformers`` loop of the same
    model, batch, AdamW (torch's fused kernel), clipping (``clip_grad_norm_``, foreach) and precision (bf16 autocast
    on a GPU), in one process, on a model so small that a step is a few milliseconds: alternating rounds (the
    machine is shared: medians, and each round's ratio; on the CPU also in CPU time, which the neighbours do not
    inflate). Returns the medians in ms (engine, plain): wall-clock on a GPU, CPU time on the CPU."""
    layers, width, heads, context, vocab, batch = OVERHEAD_MODEL
    rounds, steps = (5, 10) if quick else (9, 25)
    threads = torch.get_num_threads()
    if DEVICE == "cpu":
        torch.set_num_threads(1)  # the per-step work is one thread's; fewer threads, less noise from the neighbours
    config = llama_config(layers, width, heads, context, vocab)
    optimizer, clip = AdamWConfig(lr=1e-3), 1.0
    engine = lagged_steps(solo_engine(config, 0, optimizer, LRSchedule(max_lr=optimizer.lr), clip, DEVICE == "cuda"))
    model = Plain(config).to(DEVICE)
    plain_optimizer = plain_adamw(model.parameters(), optimizer)

    def plain(x: torch.Tensor, y: torch.Tensor) -> None:
        plain_step(model, plain_optimizer, x, y, clip)

    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, vocab, (batch, context + 1), generator=gen) for _ in range(8)]
    batches = [(t[:, :-1], t[:, 1:]) for t in ids]  # on the CPU, as the worker gets them
    # the plain loop's already pinned on a GPU (a DataLoader's pin_memory): the engine pins its own every step
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in batches] if DEVICE == "cuda" else batches
    ms_per_step(engine, batches, 5)  # warm-up
    ms_per_step(plain, pinned, 5)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(ms_per_step(engine, batches, steps))
        theirs.append(ms_per_step(plain, pinned, steps))
    where = (
        f"{torch.cuda.get_device_name()}, bf16 autocast" if DEVICE == "cuda" else f"{torch.get_num_threads()} thread"
    )
    torch.set_num_threads(threads)
    print(
        f"overhead: a Llama of {layers} layers x {width} wide, context {context}, vocabulary {vocab}, batch {batch} "
        f"({where}); {rounds} alternating rounds of {steps} steps; the solo engine against a plain loop"
    )
    medians = []
    for kind, k in (("wall-clock", 0), ("CPU time", 1)):
        a = sorted(o[k] for o in ours)[rounds // 2]
        b = sorted(t[k] for t in theirs)[rounds // 2]
        ratios = sorted(t[k] / o[k] for o, t in zip(ours, theirs, strict=True))
        medians.append((a, b))
        print(
            f"  {kind}: the engine {a:.2f} ms/step, the plain loop {b:.2f} (medians): {a - b:+.2f} ms a step; "
            f"the engine's rate {b / a:.2f}x the plain loop's (rounds: {ratios[0]:.2f}x-{ratios[-1]:.2f}x)"
        )
    med_ours, med_theirs = medians[0] if DEVICE == "cuda" else medians[1]
    return med_ours, med_theirs


def part_two_cuda(quick: bool) -> None:
    """One GPU daemon alone against a plain ``transformers`` loop of the same model and batch on that GPU."""

    seconds = 15.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="arceus-hf-bench-") as tmp:
        spec_path = gpu_spec(Path(tmp), quick)
        spec = load_spec(str(spec_path))
        assert isinstance(spec.model, HFModelConfig)
        tokens_per_step = spec.training.batch_size * spec.model.block_size
        swarm = swarm_tokens_per_s(spec_path, Path(tmp) / "swarm", seconds, size=1)
        counted = swarm["counted_steps"] * tokens_per_step / swarm["elapsed"]
        plain_rate, params = plain_steps_per_s(spec, seconds)
        plain = plain_rate * tokens_per_step
        engine_alone = engine_steps_per_s(spec, seconds) * tokens_per_step
        engine_at_once = engine_steps_per_s(spec, seconds, lag=False) * tokens_per_step
    status = swarm["status"]
    print(
        f"part 2: a Llama of {params / 1e6:.0f} M parameters, batch {spec.training.batch_size} x "
        f"{spec.model.block_size} tokens, bf16; {seconds:.0f} s each, one after the other"
    )
    print(f"  the GPU daemon: {swarm['device_line']}")
    print(
        f"  one GPU daemon alone: {counted:,.0f} tokens/s from its step counter, "
        f"{status if status is None else format(status, ',.0f')} from status"
    )
    print(f"  plain transformers loop on the same GPU: {plain:,.0f} tokens/s")
    print(
        f"  the worker's engine in one process (no daemon, no worker loop): {engine_alone:,.0f} tokens/s, "
        f"{engine_alone / plain:.2f}x the plain loop; reading each step's loss at once instead (the baseline): "
        f"{engine_at_once:,.0f}, {engine_at_once / plain:.2f}x; the lag gains {engine_alone / engine_at_once:.2f}x"
    )
    print(f"  daemon/plain: {counted / plain:.2f}x (goal at least 0.90x)")
    # Where a gap lies: the worker's own step (its engine's run_step, median) against the daemon's interval
    # between steps (the worker loop: data, events, the thread hop) and the plain loop's step.
    engine = swarm["engine_step_s"]
    between = swarm["elapsed"] / max(1, swarm["counted_steps"])
    print(
        f"  per step: plain loop {tokens_per_step / plain * 1000:.1f} ms; the daemon's engine "
        f"{'-' if engine is None else format(engine * 1000, '.1f')} ms (its median), between its steps "
        f"{between * 1000:.1f} ms"
    )


def main() -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small models, short runs")
    parser.add_argument("--no-swarm", action="store_true", help="part 1 only (no daemons)")
    parser.add_argument("--swarm-only", action="store_true", help="part 2 only")
    parser.add_argument(
        "--overhead", action="store_true", help="only the engine's fixed cost per step against a plain loop"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (cuda: bf16)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run on a GPU machine or use --device cpu")
    DEVICE = args.device
    if args.overhead:
        part_overhead(args.quick)
        return 0
    if not args.swarm_only:
        part_one(args.quick)
    if not args.no_swarm:
        (part_two_cuda if DEVICE == "cuda" else part_two)(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
