"""Pipeline throughput: stage-worker processes over the real transport vs one process vs torch's pipelining.

A GPT of ~5M parameters (6 layers, width 256, 8 heads, context 128, vocab 65; batch 16 in 8 micro-batches,
AdamW, tiny Shakespeare), all measured in this run:

  (a) a plain single-process PyTorch loop, 1 thread (the baseline);
  (b) 2 ``python -m arceusd.worker`` processes x 1 thread over the authenticated gRPC transport, GPipe and
      1F1B, split [embedding + 3 blocks | 3 blocks + head], each worker pinned to its own core
      (``worker_cpus``; not pinned where the OS cannot, or with fewer than 2 cores);
  (c) ``torch.distributed.pipelining`` (``ScheduleGPipe`` / ``Schedule1F1B``, gloo backend) with the same
      split, micro-batches and threads.

Each run is a separate process (or two), so peak RSS (``ru_maxrss`` of the child) is per process. Tokens/s
counts the steady-state steps only (the first ``warmup`` steps are dropped), at their median step time (every
run alike; see ``_steady``); for (b) a step lasts as long as its slowest worker's, and each worker's mean wait
on its links (the pipeline's bubble) is printed beside it. Every run is repeated in rounds (default 3), each
round running all of them back to back: the machines here are shared, and their speed drifts by 10 % and more
over minutes, so a ratio is taken between runs of the same round, and the median of the rounds' ratios is
printed with their range. Prints ratios (b)/(a) (target >= 1.6 on 2 free cores) and (b)/(c) (target >= 1.0).

Usage: ``python bench/pipeline.py [--quick] [--rounds N]``. The worker processes are driven by the integration tests'
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
PLAIN = "(a) plain PyTorch, 1 process"
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

    from arceusd.jobs.procs.source import open_batch_source
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
            cpus=_worker_cpus(),
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


def _worker_cpus() -> list[tuple[int, ...]] | None:
    """One core per worker (``worker_cpus``, as a daemon on a dedicated machine sets it), when this process
    may use two; None (not pinned) otherwise."""
    from arceusd.worker.affinity import usable_cores

    cores = usable_cores()
    return [(cores[0],), (cores[1],)] if len(cores) >= 2 else None


# ------------------------------------------------------------------------------------- (c) torch pipelining


def pippy_child(rank: int, port: int, schedule: str, steps: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from arceusd.jobs.procs.source import open_batch_source
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
    parser.add_argument("--quick", action="store_true", help="few steps, one round (about 1 minute)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every run (default 3, about 4 minutes)")
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
    steps, warmup, rounds = (6, 2, 1) if args.quick else (20, 3, args.rounds)
    print(
        f"GPT {MODEL}, batch {BATCH} x {MICRO} micro-batches, {steps} steps ({warmup} warm-up), "
        f"1 thread/process, {rounds} round(s) of every run; load average at start {_load()}"
    )
    results: dict[str, list[dict[str, Any]]] = {}
    unusable: dict[str, str] = {}
    for r in range(rounds):
        for name, run in _runs(steps, warmup):
            if name in unusable:
                continue
            try:
                results.setdefault(name, []).append(run())
            except Exception as exc:  # (c) may be unusable here: report why and keep the other figures
                if not name.startswith("(c)"):
                    raise
                unusable[name] = str(exc)
        done = [f"{_short(n)} {rs[-1]['tokens_per_s']:.0f}" for n, rs in results.items() if len(rs) == r + 1]
        print(f"round {r + 1}/{rounds}, tokens/s: " + ", ".join(done), flush=True)
    for name, why in unusable.items():
        print(f"{name} unusable here: {why}")
    _report(results, rounds)
    print(f"load average at the end {_load()} (other work on the machine distorts these figures)")


def _runs(steps: int, warmup: int) -> list[tuple[str, Any]]:
    """One round: every run, named, as a thunk (a round runs them back to back, so a ratio is taken between
    runs minutes apart at most)."""
    plain_args = ["--plain-child", "--steps", str(steps), "--warmup", str(warmup)]
    runs: list[tuple[str, Any]] = [(PLAIN, lambda: _run_child(plain_args, timeout=600))]
    for schedule in ("gpipe", "1f1b"):
        runs.append((f"(b) arceus workers x2, {schedule}", lambda s=schedule: run_workers(s, steps, warmup)))
    for schedule in ("gpipe", "1f1b"):
        runs.append((f"(c) torch pipelining x2, {schedule}", lambda s=schedule: run_pippy(s, steps, warmup)))
    return runs


def _short(name: str) -> str:
    return name[:3] if name == PLAIN else f"{name[:3]} {name.rsplit(' ', 1)[1]}"


def _report(results: dict[str, list[dict[str, Any]]], rounds: int) -> None:
    """Median tokens/s over the rounds, and the ratios taken within each round (median, then the range)."""
    print(f"model parameters: {results[PLAIN][0]['params'] / 1e6:.2f} M")
    print(f"{'run (median of rounds)':40s} {'tokens/s':>10s}  peak RSS per process (MiB)")
    for name, rs in results.items():
        rss = ", ".join(f"{max(r['rss_kb'][i] for r in rs) / 1024:.0f}" for i in range(len(rs[0]["rss_kb"])))
        waits = ", ".join(
            f"{statistics.median(r['wait_s'][i] for r in rs) * 1000:.0f}" for i in range(len(rs[0].get("wait_s", [])))
        )
        note = f"  (waiting on links, ms/step: {waits})" if waits else ""
        print(f"{name:40s} {statistics.median(r['tokens_per_s'] for r in rs):10.0f}  {rss}{note}")
    for schedule in ("gpipe", "1f1b"):
        ours = results[f"(b) arceus workers x2, {schedule}"]
        line = f"{schedule}: (b)/(a) = {_ratios(ours, results[PLAIN])} (target >= 1.6)"
        torch_runs = results.get(f"(c) torch pipelining x2, {schedule}", [])
        if len(torch_runs) == rounds:
            line += f", (b)/(c) = {_ratios(ours, torch_runs)} (target >= 1.0)"
        print(line)


def _ratios(num: list[dict[str, Any]], den: list[dict[str, Any]]) -> str:
    """The round-by-round ratios of tokens/s: their median, and their range when there are several."""
    ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(num, den, strict=True)]
    text = f"{statistics.median(ratios):.2f}"
    return text + (f" ({min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} rounds)" if len(ratios) > 1 else "")


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
