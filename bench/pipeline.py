"""Pipeline throughput: stage-worker processes over the real transport vs one process vs torch's pipelining.

A GPT of ~5M parameters (6 layers, width 256, 8 heads, context 128, vocab 65; batch 16 in 8 micro-batches,
AdamW, tiny Shakespeare), all measured in this run:

  (a) a plain single-process PyTorch loop, 1 thread (the baseline);
  (b) 2 ``python -m arceusd.worker`` processes x 1 thread over the authenticated gRPC transport, GPipe and
      1F1B, split [embedding + 3 blocks | 3 blocks + head];
  (c) ``torch.distributed.pipelining`` (``ScheduleGPipe`` / ``Schedule1F1B``, gloo backend) with the same
      split, micro-batches and threads.

Each run is a separate process (or two), so peak RSS (``ru_maxrss`` of the child) is per process. Tokens/s
counts the steady-state steps only (the first ``warmup`` steps are dropped), at their median step time (every
run alike; see ``_steady``); for (b) a step lasts as long as its slowest worker's, and each worker's mean wait
on its links (the pipeline's bubble) is printed beside it. Prints ratios (b)/(a) (target
>= 1.6 on 2 free cores) and (b)/(c) (target >= 1.0).

Usage: ``python bench/pipeline.py [--quick]``. The worker processes are driven by the integration tests'
daemon stand-in (``tests/integration/worker_harness.py``), so this script runs from the project root.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODEL = {"n_layer": 6, "n_head": 8, "n_embd": 256, "block_size": 128, "vocab_size": 65}
BATCH, MICRO = 16, 8
SPLIT = 4  # blocks [0, 4) = embedding + 3 transformer blocks; [4, 8) = 3 blocks + head


def _spec(steps: int) -> Any:
    from tests.integration.worker_harness import gpt_spec

    return gpt_spec(
        steps,
        n_layer=MODEL["n_layer"],
        n_head=MODEL["n_head"],
        n_embd=MODEL["n_embd"],
        block=MODEL["block_size"],
        batch=BATCH,
        micro=MICRO,
        eval_iters=0,
        lr=1e-3,
    )


def _child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")


def _run_child(args: list[str], timeout: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, *args], env=_child_env(), capture_output=True, timeout=timeout, check=False
    )
    lines = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed ({out.returncode}):\n{out.stderr.decode()[-3000:]}")
    return dict(json.loads(lines[-1]))


# ---------------------------------------------------------------------------------------------- (a) plain


def plain_child(steps: int, warmup: int) -> None:
    import torch

    from arceusd.jobs.source import open_batch_source
    from arceusd.models.build import build_reference_model, loss_mean

    torch.set_num_threads(1)
    spec = _spec(steps)
    model = build_reference_model(spec.model, spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    source = open_batch_source(spec)
    times = []
    for step in range(steps):
        x, y = source.batch(step)
        began = time.perf_counter()
        opt.zero_grad()
        loss_mean(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        times.append(time.perf_counter() - began)
    params = sum(p.numel() for p in model.parameters())
    tokens = BATCH * MODEL["block_size"] * (steps - warmup)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"tokens_per_s": tokens / _steady(times, warmup), "rss_kb": [rss], "params": params}))


# ---------------------------------------------------------------------------------------------- (b) workers


def run_workers(schedule: str, steps: int, warmup: int) -> dict[str, Any]:
    from arceusd.worker.protocol import StepEvent
    from tests.integration.worker_harness import WorkerJob

    spec = _spec(steps)
    with (
        tempfile.TemporaryDirectory() as tmp,
        WorkerJob(
            Path(tmp),
            spec,
            [(0, SPLIT, None), (SPLIT, MODEL["n_layer"] + 2, None)],
            schedule=schedule,
            threads=1,
        ) as job,
    ):
        job.start()
        job.run_events(timeout=600)
        rss = []
        for w in job.workers:
            assert w.proc is not None
            _, _, usage = os.wait4(w.proc.pid, 0)
            rss.append(usage.ru_maxrss)
        per_step = [max(w.of(StepEvent)[i].seconds for w in job.workers) for i in range(steps)]
        waits = [sum(e.wait_seconds for e in w.of(StepEvent)[warmup:]) / (steps - warmup) for w in job.workers]
    tokens = BATCH * MODEL["block_size"] * (steps - warmup)
    return {"tokens_per_s": tokens / _steady(per_step, warmup), "rss_kb": rss, "wait_s": waits}


# ------------------------------------------------------------------------------------- (c) torch pipelining


def pippy_child(rank: int, port: int, schedule: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from arceusd.jobs.source import open_batch_source
    from arceusd.models.build import build_blocks, loss_mean

    torch.set_num_threads(1)
    _patch_object_exchange_without_numpy()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = _spec(steps)
    n = MODEL["n_layer"] + 2
    start, end = (0, SPLIT) if rank == 0 else (SPLIT, n)
    module = nn.Sequential(*build_blocks(spec.model, spec.seed, start, end))
    mb = BATCH // MICRO
    example = (
        torch.zeros(mb, MODEL["block_size"], dtype=torch.long)
        if rank == 0
        else torch.zeros(mb, MODEL["block_size"], MODEL["n_embd"])
    )
    stage = PipelineStage(module, rank, 2, torch.device("cpu"), input_args=(example,))
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = kind(stage, MICRO, loss_fn=loss_mean)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    source = open_batch_source(spec)
    times = []
    for step in range(steps):
        x, y = source.batch(step)
        dist.barrier()
        began = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y)
        opt.step()
        times.append(time.perf_counter() - began)
    dist.barrier()
    dist.destroy_process_group()
    tokens = BATCH * MODEL["block_size"] * (steps - warmup)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"tokens_per_s": tokens / _steady(times, warmup), "rss_kb": [rss]}))


def _patch_object_exchange_without_numpy() -> None:
    """torch's pipelining exchanges shape metadata with ``recv_object_list``, whose ``_tensor_to_object``
    calls ``tensor.numpy()``; numpy is not installed here, so read the byte tensor without it (same bytes)."""
    import io
    import pickle

    import torch.distributed.distributed_c10d as c10d

    def tensor_to_object(tensor: Any, tensor_size: int, group: Any) -> Any:
        data = bytes(tensor.cpu()[:tensor_size].tolist())
        return pickle.Unpickler(io.BytesIO(data)).load()

    c10d._tensor_to_object = tensor_to_object


def run_pippy(schedule: str, steps: int, warmup: int) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--pippy-rank",
                str(r),
                "--port",
                str(port),
                "--schedule",
                schedule,
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
            ],
            env=_child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for p, (out, err) in zip(procs, outs, strict=True):
        lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise RuntimeError(f"torch pipelining rank failed ({p.returncode}):\n{err.decode()[-3000:]}")
        results.append(json.loads(lines[-1]))
    return {
        "tokens_per_s": min(r["tokens_per_s"] for r in results),
        "rss_kb": [r["rss_kb"][0] for r in results],
    }


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few steps (about 2 minutes)")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pippy-rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--schedule", default="gpipe", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_child:
        plain_child(args.steps, args.warmup)
        return
    if args.pippy_rank >= 0:
        pippy_child(args.pippy_rank, args.port, args.schedule, args.steps, args.warmup)
        return
    steps, warmup = (6, 2) if args.quick else (20, 3)
    print(
        f"GPT {MODEL}, batch {BATCH} x {MICRO} micro-batches, {steps} steps ({warmup} warm-up), "
        f"1 thread/process; load average at start {_load()}"
    )
    plain = _run_child(["--plain-child", "--steps", str(steps), "--warmup", str(warmup)], timeout=600)
    print(f"model parameters: {plain['params'] / 1e6:.2f} M")
    rows: list[tuple[str, dict[str, Any]]] = [("(a) plain PyTorch, 1 process", plain)]
    for schedule in ("gpipe", "1f1b"):
        rows.append((f"(b) arceus workers x2, {schedule}", run_workers(schedule, steps, warmup)))
    pippy: dict[str, dict[str, Any]] = {}
    for schedule in ("gpipe", "1f1b"):
        try:
            pippy[schedule] = run_pippy(schedule, steps, warmup)
            rows.append((f"(c) torch pipelining x2, {schedule}", pippy[schedule]))
        except Exception as exc:  # report why (c) is unusable here and keep the other figures
            print(f"(c) torch.distributed.pipelining {schedule} unusable here: {exc}")
    print(f"{'run':40s} {'tokens/s':>10s}  peak RSS per process (MiB)")
    for name, r in rows:
        rss = ", ".join(f"{kb / 1024:.0f}" for kb in r["rss_kb"])
        waits = ", ".join(f"{w * 1000:.0f}" for w in r.get("wait_s", []))
        note = f"  (waiting on links, ms/step: {waits})" if waits else ""
        print(f"{name:40s} {r['tokens_per_s']:10.0f}  {rss}{note}")
    base = plain["tokens_per_s"]
    for name, r in rows[1:3]:
        schedule = name.rsplit(" ", 1)[1]
        line = f"{schedule}: (b)/(a) = {r['tokens_per_s'] / base:.2f} (target >= 1.6)"
        if schedule in pippy:
            line += f", (b)/(c) = {r['tokens_per_s'] / pippy[schedule]['tokens_per_s']:.2f} (target >= 1.0)"
        print(line)
    print(f"load average at the end {_load()} (other work on the machine distorts these figures)")


def _steady(times: list[float], warmup: int) -> float:
    """Seconds of the steady steps: their count times their median. The machines here are shared: another
    tenant's burst stretches a few steps by 20-40 %, and the median keeps those out of every run alike."""
    steady = times[warmup:]
    if not steady:
        raise ValueError(f"no steady steps: {len(times)} steps with {warmup} warm-up")
    return statistics.median(steady) * len(steady)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
