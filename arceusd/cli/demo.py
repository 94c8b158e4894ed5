"""``arceusd demo``: the README's main job. A local swarm of daemons trains a character GPT on Tiny Shakespeare.

Two daemons (``--size``) start on loopback (own state directories, each other as seeds, auto-join on, each
daemon's stage worker pinned to its own core); the first one submits ``examples/shakespeare-gpt.toml`` (its step
count set by ``--steps``, 1,000 by default) for all of them; the demo shows the plan, a progress bar with an ETA
(a line per change when the output is not a terminal), and at the end loads the exported model into the plain
PyTorch GPT, prints a generated sample and where the model was saved. Ctrl-C stops every daemon and worker cleanly.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from arceusd.cli.swarm import LocalSwarm
from arceusd.jobs.record.view import contribution_lines, render_job
from arceusd.models.config import GPTConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shakespeare-gpt.toml"


def demo_spec(directory: Path, steps: int) -> Path:
    """The example spec with ``steps`` (and a matching checkpoint/eval interval), paths made absolute."""
    text = EXAMPLE.read_text()
    data = (EXAMPLE.parent / re.search(r'path = "([^"]+)"', text).group(1)).resolve()  # type: ignore[union-attr]
    interval = max(10, steps // 4)
    text = re.sub(r'path = "[^"]+"', f'path = "{data}"', text)
    text = re.sub(r"(?m)^steps = \d+", f"steps = {steps}", text)
    text = re.sub(r"(?m)^warmup_steps = \d+", f"warmup_steps = {max(1, min(100, steps // 10))}", text)
    text = re.sub(r"(?m)^eval_interval_steps = \d+", f"eval_interval_steps = {interval}", text)
    text = re.sub(r"(?m)^interval_steps = \d+", f"interval_steps = {interval}", text)
    path = directory / "shakespeare-gpt.toml"
    path.write_text(text)
    return path


def sample(model_path: Path, length: int = 400, seed: int = 0) -> str:
    import torch  # torch: only once the demo has trained
    from safetensors.torch import load_file  # torch

    from arceusd.models.build import build_reference_model  # torch
    from arceusd.models.generate import generate  # torch

    description = json.loads((model_path.parent / "model.json").read_text())
    fields = {k: v for k, v in description["model"].items() if k != "type"}
    config = GPTConfig(**fields)
    model = build_reference_model(config, seed=0)
    model.load_state_dict(load_file(str(model_path)), strict=True)
    vocab: str = description["vocab"]
    start = torch.tensor([[vocab.index("\n")]])
    out = generate(model, start, length, config.block_size, generator=torch.Generator().manual_seed(seed))
    return "".join(vocab[i] for i in out[0].tolist())


def run_demo(size: int, root: Path | None, steps: int) -> None:
    base = root or Path(tempfile.mkdtemp(prefix="arceus-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    swarm = LocalSwarm(base, size, ["--auto-join"], preset="lan", pin_workers=True)
    click.echo(f"starting a local swarm of {size} daemons in {base} ...")
    try:
        for i, status in enumerate(swarm.start()):
            click.echo(f"  node{i}: peer {status['peer_id']}  at {status['addresses'].get('peer')}")
        try:
            swarm.wait_converged(30)
        except TimeoutError as exc:
            click.echo(f"  note: {exc}; submitting anyway")
        spec = demo_spec(base, steps)
        result = swarm.call(0, "submit", {"spec_path": str(spec), "min_members": size}, timeout=120)
        job_id = result["job_id"]
        click.echo(f"submitted job {job_id}: a character GPT on Tiny Shakespeare, {steps} steps, {size} members")
        job = _follow(swarm, job_id)
        if job["state"] != "done":
            raise click.ClickException(f"the job ended {job['state']}: {job['error']}")
        for line in contribution_lines(job):
            click.echo(line)
        click.echo(f"model saved to {job['model_path']} (loads into the plain PyTorch GPT of model.json)")
        click.echo("\n--- a sample from the trained model ---")
        click.echo(sample(Path(job["model_path"])))
        click.echo("---")
    except KeyboardInterrupt:
        click.echo("\ninterrupted; stopping the swarm")
    finally:
        swarm.close()
        click.echo("swarm stopped")


def _follow(swarm: LocalSwarm, job_id: str) -> dict[str, Any]:
    """Show the plan once, then the job's progress until it ends: a progress bar with an ETA in a terminal (rich),
    a line per change otherwise (a log, a pipe). Returns the job's final record."""
    shown_plan = False
    last_line = ""
    tty = sys.stdout.isatty()
    progress = None
    task: Any = None
    try:
        while True:
            job: dict[str, Any] = swarm.call(0, "job", {"job_id": job_id})
            if job["plan"] and not shown_plan:
                shown_plan = True
                plan_lines = [line for line in render_job(job).splitlines() if "stage" in line or "plan" in line]
                click.echo("\n".join(plan_lines))
                if tty:
                    progress = _progress_bar()
                    progress.start()
                    task = progress.add_task("training", total=job["total_steps"] or None, stats="")
            if progress is not None:
                progress.update(task, completed=job["step"], total=job["total_steps"] or None, stats=_stats(job))
            elif not tty:
                line = _progress(job)
                if line != last_line:
                    click.echo(line)
                    last_line = line
            if job["state"] in ("done", "failed", "cancelled"):
                return job
            time.sleep(1.0 if progress is not None else 2.0)
    finally:
        if progress is not None:
            progress.stop()


def _progress_bar(console: Any = None) -> Any:
    from rich.progress import (  # rich: off the CLI's start
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("  step"),
        MofNCompleteColumn(),
        BarColumn(bar_width=16),
        TextColumn("ETA"),
        TimeRemainingColumn(compact=True),
        TextColumn("{task.fields[stats]}"),
        console=console,
    )


def _stats(job: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, int | float) else "-"

    return f"loss {num(job['loss'], '.2f')} val {num(job['val_loss'], '.2f')} {num(job['tokens_per_s'], '.0f')} tok/s"


def _progress(job: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return format(v, fmt) if isinstance(v, int | float) else "-"

    return (
        f"  [{job['state']:<8}] step {job['step']:>5}/{job['total_steps']}  loss {num(job['loss'], '.3f')}  "
        f"val {num(job['val_loss'], '.3f')}  {num(job['tokens_per_s'], '.0f')} tokens/s"
    )
