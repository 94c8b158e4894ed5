"""The demo's job for a fixed wall-clock budget, against a plain PyTorch loop given the same time and cores.

Issue #7 asks what ``arceusd demo``'s job (a character GPT on Tiny Shakespeare, ``examples/shakespeare-gpt.toml``)
reaches in 20 minutes across 3 local daemons, next to a plain single-process loop. Both parts here train the
same model config on the same batches with the same optimizer and learning-rate schedule (the spec's, with a
step count the budget cannot reach, so neither run decays to the end), evaluate on the same validation batches,
and stop when the budget is spent; the plain loop gets every core of this machine (torch threads = cores), the
swarm's workers one thread each (the daemon's default). Prints validation loss and tokens/s of each and their
ratios. The two parts run one after the other, not at the same time.

    python bench/demo_vs_plain.py [--minutes 20] [--quick]     (--quick: 2 minutes each)
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from arceusd.cli.demo import demo_spec
from arceusd.cli.swarm import LocalSwarm
from arceusd.jobs.procs.source import open_batch_source
from arceusd.jobs.spec.schema import JobSpec, load_spec
from arceusd.models.build import build_reference_model, loss_mean
from arceusd.models.config import GPTConfig

EVAL_EVERY = 100
HUGE_STEPS = 200_000


def budget_spec(directory: Path) -> Path:
    path = demo_spec(directory, HUGE_STEPS)
    text = path.read_text()
    text = re.sub(r"(?m)^eval_interval_steps = \d+", f"eval_interval_steps = {EVAL_EVERY}", text)
    text = re.sub(r"(?m)^interval_steps = \d+", "interval_steps = 1000", text)
    text = re.sub(r"(?m)^warmup_steps = \d+", "warmup_steps = 100", text)
    path.write_text(text)
    return path


def gpt_of(spec: JobSpec) -> GPTConfig:
    """The spec's model config; the demo's job is a GPT (tokens per step = batch * block_size)."""
    if not isinstance(spec.model, GPTConfig):
        raise ValueError(f"expected the demo's GPT model, got {type(spec.model).__name__}; is the spec the demo's?")
    return spec.model


def run_swarm(spec_path: Path, root: Path, seconds: float) -> dict[str, Any]:
    swarm = LocalSwarm(root, 3, ["--auto-join"], preset="lan")
    try:
        swarm.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(sum(p["state"] == "alive" for p in swarm.call(i, "peers")) == 2 for i in range(3)):
                break
            time.sleep(0.2)
        began = time.monotonic()
        submit = [
            sys.executable,
            "-m",
            "arceusd",
            "--state-dir",
            str(swarm.state_dir(0)),
            "submit",
            str(spec_path),
            "--members",
            "3",
        ]
        out = subprocess.run(submit, capture_output=True, text=True, timeout=300)
        job_id = out.stdout.split()[2]
        job: dict[str, Any] = {}
        first_step_at = None
        while time.monotonic() - began < seconds:
            job = swarm.call(0, "job", {"job_id": job_id})
            if first_step_at is None and job["step"] >= 1:
                first_step_at = time.monotonic()
            if job["state"] in ("failed", "cancelled"):
                raise RuntimeError(f"the job {job['state']}: {job['error']}")
            time.sleep(1.0)
        job = swarm.call(0, "job", {"job_id": job_id})
        elapsed = time.monotonic() - began
        swarm.call(0, "cancel", {"job_id": job_id}, timeout=60)
        spec = load_spec(spec_path)
        tokens = job["step"] * spec.training.batch_size * gpt_of(spec).block_size
        return {
            "steps": job["step"],
            "val_loss": job["val_loss"],
            "tokens_per_s": tokens / elapsed,
            "startup_s": (first_step_at or time.monotonic()) - began,
            "devices": len(job["members"]),
        }
    finally:
        swarm.close()


def evaluate(model: torch.nn.Module, spec: JobSpec) -> float:
    source = open_batch_source(spec)
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for x, y in source.eval_batches():
            total += float(loss_mean(model(x), y)) * y.numel()
            count += y.numel()
    model.train()
    return total / count


def run_plain(spec_path: Path, seconds: float) -> dict[str, Any]:
    torch.set_num_threads(os.cpu_count() or 1)
    spec = load_spec(spec_path)
    t = spec.training
    model = build_reference_model(spec.model, spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay)
    source = open_batch_source(spec)
    began = time.monotonic()
    step, val = 0, math.nan
    while time.monotonic() - began < seconds:
        x, y = source.batch(step)
        for g in optimizer.param_groups:
            g["lr"] = t.lr_at(step)
        optimizer.zero_grad()
        loss = loss_mean(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        if t.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        step += 1
        if step % EVAL_EVERY == 0:
            val = evaluate(model, spec)
    elapsed = time.monotonic() - began
    return {"steps": step, "val_loss": val, "tokens_per_s": step * t.batch_size * gpt_of(spec).block_size / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="2 minutes each")
    args = parser.parse_args()
    seconds = 120.0 if args.quick else args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="arceus-demo-bench-") as tmp:
        spec_path = budget_spec(Path(tmp))
        swarm = run_swarm(spec_path, Path(tmp) / "swarm", seconds)
        plain = run_plain(spec_path, seconds)
    cores = os.cpu_count()
    print(
        f"budget {seconds / 60:.1f} min each, one after the other, on {cores} cores "
        f"(model and batches of examples/shakespeare-gpt.toml, evaluated every {EVAL_EVERY} steps)"
    )
    print(
        f"  swarm: 3 daemons, {swarm['devices']} devices: {swarm['steps']} steps, val loss {swarm['val_loss']:.3f}, "
        f"{swarm['tokens_per_s']:.0f} tokens/s over the budget (first step after {swarm['startup_s']:.0f} s)"
    )
    print(
        f"  plain: 1 process, {cores} threads: {plain['steps']} steps, val loss {plain['val_loss']:.3f}, "
        f"{plain['tokens_per_s']:.0f} tokens/s"
    )
    print(
        f"  swarm/plain: tokens/s {swarm['tokens_per_s'] / plain['tokens_per_s']:.2f}x, "
        f"val loss {swarm['val_loss'] / plain['val_loss']:.3f}x (lower is better)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
