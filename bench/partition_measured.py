"""Planner calibration: the partitioner's predicted step time against real stage workers' measured step time.

For each configuration, measured in this run:
  1. profile every device with ``arceusd.device.profile.measure_device`` (the daemon's own 512x512 matmul benchmark)
     and ``measure_calibration`` (block efficiency, dispatch and optimizer cost, on the job's own model shape
     and micro-batch size) in a child process pinned to the thread count its worker will use, and measure the
     link between workers (rtt, bandwidth, cost per message) with ``arceusd.device.link_probe.measure_link`` over the
     real authenticated transport (unary echo). The "devices"
     share this machine, so by default all devices' children measure at once from a common start (median of
     15 calls: what each gets while the others work); ``--isolated`` measures each alone (best of 5), as a
     daemon on its own machine would;
  2. build the plan inputs as the daemon does (``arceusd.jobs.plans.planning.plan_inputs`` on the job spec and the
     offers) with the measured link, and plan (``partitioner.plan``);
  3. run ``python -m arceusd.worker`` processes for that plan (driven by the integration tests' daemon
     stand-in, ``tests/integration/worker_harness.py``), drop the warm-up steps, and take per step the slowest
     worker's duration (``StepEvent.seconds``); the figure is the median steady step (with ``--isolated``, the
     best one, matching the best-of profile: on a shared box other load only adds time);
  4. print measured / predicted, and whether it is within the issue's 25 %; also measured / uncalibrated,
     the same plan's step time under the cost model without the calibration (what it predicted before).

Configurations: ``1x1t`` (one worker, the whole model: isolates the worker's own overhead from the
pipeline's), ``2x1t`` (two workers x 1 thread), ``1t+2t`` (one worker with 1 thread, one with 2: a faster
device), ``cap`` (two workers x 1 thread with every link capped by ``tc`` and the planner told the measured
capped bandwidth). Bandwidth caps: the workers of that configuration run inside a network namespace created
(and removed) here, whose loopback carries a ``tbf`` rate limit (plus a ``netem`` delay when a config asks for
one and the kernel has ``sch_netem``; this one does not, so no config asks); no traffic leaves it.
Without root or iproute2 the ``cap`` configuration is skipped and says why.

Also printed, for the calibration: each worker's compute share at the *measured* speed (FLOP/s the stage
actually reached = predicted FLOPs / measured seconds), i.e. how far the matmul benchmark is from the model's
own kernels at this size, and the prediction with that efficiency folded in.

    python bench/partition_measured.py [--quick] [--only NAME ...]

On this 2-core box (load ~2, 2026-11-21) every configuration came within 25 % once the cost model charged the
measured calibration (measured/predicted 1x1t 1.05-1.12, 2x1t 1.10-1.22, 1t+2t 0.79-0.88, cap 0.98-1.00;
without it 1.46-1.77). 1t+2t runs 3 compute threads on 2 cores: profiled beside the other device, the
2-thread device's blocks read 0.2-0.65 of its matmul figure from run to run (its threads wait on each other
when one is descheduled), more pessimistic than the pipeline, where the two stages partly take turns.

Runs from the project root (it imports the integration tests' harness). The box may be shared and noisy:
figures are medians (best-of with ``--isolated``), and every ratio is against a prediction made from devices and links
measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 0.25
"""|measured / predicted - 1| the issue asks for."""

# A small GPT on tiny Shakespeare: ~1 s steps on one core, so a dozen steps fit the --quick budget.
MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 192, "block": 64}
BATCH, MICRO = 16, 4
MATMUL_WINDOW_S, PROFILE_WINDOW_S = 3.0, 10.0
"""When devices profile together, every child runs the matmul benchmark until this many seconds after the
common start, then calibration rounds until the second (see ``profile_child``)."""


# ---------------------------------------------------------------------------------------------- pure logic


@dataclass(frozen=True)
class Config:
    """One comparison: worker thread counts (one device each) and an optional link cap."""

    name: str
    threads: tuple[int, ...]
    cap_mbit: float = 0.0
    delay_ms: float = 0.0


@dataclass(frozen=True)
class Outcome:
    name: str
    predicted_s: float
    measured_s: float
    steps: int
    detail: str
    calibrated_s: float | None = None
    """The cost model's formula with each stage's compute time measured in a plain loop and the optimizer
    step added (None where a stage is tensor-parallel: the plain loop does not model it)."""
    uncalibrated_s: float | None = None
    """The same plan's step time under the cost model with the calibration left out (efficiency 1, no
    dispatch, optimizer or message cost): the prediction before calibration existed."""

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s

    @property
    def within(self) -> bool:
        return within_target(self.measured_s, self.predicted_s)


def within_target(measured_s: float, predicted_s: float, target: float = TARGET) -> bool:
    """True when the measured time is within ``target`` (a fraction) of the prediction, either way."""
    if predicted_s <= 0 or measured_s <= 0:
        raise ValueError(f"times must be positive, got measured {measured_s} predicted {predicted_s}")
    return abs(measured_s / predicted_s - 1.0) <= target


def steady_step_seconds(per_worker: Sequence[Sequence[float]], warmup: int) -> list[float]:
    """Per step after ``warmup``: the slowest worker's duration (the pipeline's step is paced by it).

    ``per_worker[w][k]`` is worker w's duration of step k. Raises ``ValueError`` when the workers report
    different step counts or nothing is left after the warm-up."""
    if not per_worker:
        raise ValueError("no workers reported steps")
    counts = {len(x) for x in per_worker}
    if len(counts) != 1:
        raise ValueError(f"workers reported different numbers of steps: {sorted(counts)}")
    n = counts.pop()
    if n <= warmup:
        raise ValueError(f"{n} steps leave nothing after {warmup} warm-up steps; run more steps")
    return [max(w[k] for w in per_worker) for k in range(warmup, n)]


def calibrated_step_s(stage_times_s: Sequence[float], micro_batches: int, optimizer_s: float) -> float:
    """The partitioner's step formula, ``(m - 1) * max t_s + sum t_s``, plus one optimizer step."""
    if not stage_times_s or micro_batches < 1:
        raise ValueError("need at least one stage and one micro-batch")
    return (micro_batches - 1) * max(stage_times_s) + sum(stage_times_s) + optimizer_s


def tc_commands(cap_mbit: float, delay_ms: float, mtu: int = 16384) -> list[list[str]]:
    """``ip``/``tc`` argument lists that cap a namespace's loopback: a ``netem`` delay (each way) under a
    ``tbf`` rate limit. The MTU is lowered so a packet never exceeds the token bucket's burst."""
    if cap_mbit <= 0:
        raise ValueError(f"cap_mbit must be positive, got {cap_mbit}")
    burst = max(4 * mtu, int(cap_mbit * 1e6 / 8 / 250))  # >= 4 ms worth of tokens, >= 4 packets
    cmds = [["ip", "link", "set", "lo", "mtu", str(mtu)], ["ip", "link", "set", "lo", "up"]]
    parent = ["root"]
    if delay_ms > 0:
        cmds.append(["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem", "delay", f"{delay_ms}ms"])
        parent = ["parent", "1:1"]
    cmds.append(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            *parent,
            "handle",
            "10:",
            "tbf",
            "rate",
            f"{cap_mbit}mbit",
            "burst",
            str(burst),
            "latency",
            "200ms",
        ]
    )
    return cmds


# ---------------------------------------------------------------------------------------------- namespace


def netns_problem() -> str | None:
    """None when a capped namespace can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root for ip netns / tc"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    return None


@contextlib.contextmanager
def capped_namespace(cap_mbit: float, delay_ms: float) -> Iterator[list[str]]:
    """A fresh network namespace whose loopback is capped; yields the command prefix that runs inside it."""
    name = f"arcbw{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    prefix = ["ip", "netns", "exec", name]
    try:
        for cmd in tc_commands(cap_mbit, delay_ms):
            proc = subprocess.run(prefix + cmd, capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
        yield prefix
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


# ---------------------------------------------------------------------------------------------- children


def _child_env(threads: int = 1) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(threads))


def _run_children(jobs: Sequence[tuple[list[str], int]], together: bool, timeout: float = 180) -> list[Any]:
    """Run measuring children ((args, threads) each): one after another (each alone on the machine), or all at
    once with a common start time after their imports (``--at``), so each sees the others' load as its worker
    will during training, and reports the median instead of the best repetition."""
    if not together:
        return [_run_child([*args, "--stat", "min"], threads=t, timeout=timeout) for args, t in jobs]
    at = time.time() + 4.0  # after every child's torch import
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *args, "--stat", "median", "--at", f"{at:.3f}"],
            env=_child_env(t),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for args, t in jobs
    ]
    out = []
    try:
        for (args, _), p in zip(jobs, procs, strict=True):
            stdout, stderr = p.communicate(timeout=timeout)
            lines = [ln for ln in stdout.decode().splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"child {args} failed ({p.returncode}):\n{stderr.decode()[-3000:]}")
            out.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return out


def _wait_until(at: float) -> None:
    if at > 0:
        time.sleep(max(0.0, at - time.time()))


def _run_child(args: list[str], prefix: Sequence[str] = (), threads: int = 1, timeout: float = 120) -> Any:
    out = subprocess.run(
        [*prefix, sys.executable, __file__, *args],
        env=_child_env(threads),
        cwd=ROOT,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    lines = [ln for ln in out.stdout.decode().splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed ({out.returncode}):\n{out.stderr.decode()[-3000:]}")
    return json.loads(lines[-1])


def profile_child(threads: int, stat: str, at: float, window_s: float = PROFILE_WINDOW_S) -> None:
    """Print this device's measurement (JSON) with torch pinned to ``threads`` threads, as a worker is,
    calibrated on the job's model at the planned micro-batch size."""
    from arceusd.device.profile import measure_calibration, measure_device
    from arceusd.worker.threads import pin_threads

    pin_threads(threads)
    measure_device("cpu", size=64, repeats=1)  # import-time and first-call costs before the common start
    model = _spec(1).model
    micro_batch = BATCH // MICRO
    _wait_until(at)
    if stat == "min":
        # alone, as a daemon measures (once; here the best of 5 calls, so a momentary spike of other load on
        # a shared box does not misstate the device: one call once read 11 GFLOP/s for a 90 GFLOP/s core),
        # then the calibration's least disturbed repetitions against that figure
        m = max((measure_device("cpu") for _ in range(5)), key=lambda d: d.flops_per_s)
        cal = measure_calibration("cpu", m.flops_per_s, model, micro_batch, repeats=5, stat="min")
        print(json.dumps(dataclasses.asdict(m.with_calibration(cal))))
        return
    # together with the other devices' children: what the device gets while the others work. Every child runs
    # the same two phases on the same clock, the benchmark until at + MATMUL_WINDOW_S, then calibration rounds
    # (against the benchmark's median) until at + PROFILE_WINDOW_S, so each is measured while the others do
    # the same kind of work (a fixed count would let a faster child finish early and the others measure alone;
    # a 2-thread device's blocks run 2.8x slower beside another device's blocks than alone, its matmul 1.6x);
    # then the medians.
    flops: list[float] = []
    m = measure_device("cpu")
    while len(flops) < 3 or (time.time() < at + MATMUL_WINDOW_S and len(flops) < 200):
        m = measure_device("cpu")
        flops.append(m.flops_per_s)
    m = dataclasses.replace(m, flops_per_s=statistics.median(flops))
    rounds: list[Any] = []
    while len(rounds) < 3 or (time.time() < at + window_s and len(rounds) < 100):
        rounds.append(measure_calibration("cpu", m.flops_per_s, model, micro_batch, repeats=3, stat="median"))
    fields = ("block_efficiency", "dispatch_s", "adamw_s_per_param", "sgd_s_per_param")
    cal = dataclasses.replace(rounds[0], **{f: statistics.median(getattr(r, f) for r in rounds) for f in fields})
    print(json.dumps(dataclasses.asdict(m.with_calibration(cal))))


def link_child() -> None:
    """Print the link measured between two transports of this process (JSON): the daemon's echo method."""
    import trio

    from arceusd.base.identity import Identity
    from arceusd.device.link_probe import measure_link
    from arceusd.transport import Stream, open_transport

    async def echo(request: bytes) -> bytes:
        return request

    async def no_stream(stream: Stream) -> None:
        return

    async def main() -> None:
        async with (
            open_transport(Identity.generate(), "127.0.0.1", 0, unary_handler=echo, stream_handler=no_stream) as server,
            open_transport(Identity.generate(), "127.0.0.1", 0, unary_handler=echo, stream_handler=no_stream) as client,
        ):
            address = f"127.0.0.1:{server.port}"

            async def call(payload: bytes) -> bytes:
                return await client.call(address, payload, 30.0)

            await measure_link(call, small_count=3)  # warm the channel (connection set-up)
            found = [await measure_link(call, small_count=7) for _ in range(3)]
            best = max(found, key=lambda m: m.bandwidth_bytes_per_s)
            rtt = statistics.median(m.rtt_s for m in found)
            message = statistics.median(m.message_s for m in found)
            print(json.dumps({"rtt_s": rtt, "bandwidth_bytes_per_s": best.bandwidth_bytes_per_s, "message_s": message}))

    trio.run(main)


def stage_child(start: int, end: int, micro_batch: int, threads: int, reps: int, stat: str, at: float) -> None:
    """Print (JSON) one stage's forward+backward time per micro-batch and its optimizer step time, measured in
    a plain loop (no transport, no pipeline) with the worker's own blocks and optimizer at ``threads``."""
    import torch

    from arceusd.models.build import build_blocks, loss_mean, num_blocks
    from arceusd.models.config import GPTConfig
    from arceusd.worker.optim import AdamWConfig, make_optimizer
    from arceusd.worker.threads import pin_threads

    pin_threads(threads)
    spec = _spec(1)
    cfg = spec.model
    if not isinstance(cfg, GPTConfig):
        raise TypeError("the stage calibration is written for the GPT spec")
    module = torch.nn.Sequential(*build_blocks(cfg, spec.seed, start, end))
    optimizer = make_optimizer(module.named_parameters(), AdamWConfig(lr=1e-3))
    gen = torch.Generator().manual_seed(0)
    last = end == num_blocks(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.block_size), generator=gen)

    def one() -> None:
        if start == 0:
            out = module(tokens)
        else:
            out = module(torch.randn(micro_batch, cfg.block_size, cfg.n_embd, generator=gen).requires_grad_())
        if last:
            loss_mean(out, tokens).backward()  # type: ignore[no-untyped-call]
        else:
            out.backward(torch.randn(out.shape, generator=gen))

    one()  # warm-up before the common start
    _wait_until(at)
    fb, opt = [], []
    for _ in range(reps + 2):
        began = time.perf_counter()
        one()
        fb.append(time.perf_counter() - began)
        began = time.perf_counter()
        optimizer.step(1e-3)
        opt.append(time.perf_counter() - began)
        optimizer.zero_grad()
    # alone: the least disturbed repetition (the box may be shared; the device profile is a best-of too);
    # together with the other stages' children: the median, what the stage gets while the others work
    pick = min if stat == "min" else statistics.median
    print(json.dumps({"fwd_bwd_s": pick(fb[2:]), "optim_s": pick(opt[2:])}))


# ---------------------------------------------------------------------------------------------- one config


def _spec(steps: int) -> Any:
    from tests.integration.worker_harness import gpt_spec

    return gpt_spec(
        steps,
        n_layer=MODEL["n_layer"],
        n_head=MODEL["n_head"],
        n_embd=MODEL["n_embd"],
        block=MODEL["block"],
        batch=BATCH,
        micro=MICRO,
        eval_iters=0,
        lr=1e-3,
    )


def _spawn(job: Any, threads_of: Mapping[str, int], prefix: Sequence[str]) -> None:
    """``WorkerJob.spawn`` with a per-worker thread count and an optional namespace prefix."""
    from arceusd.worker.protocol import WorkerConfig

    for w in job.workers:
        cfg: WorkerConfig = dataclasses.replace(job.configs[w.peer_id], threads=threads_of[w.peer_id])
        w.config_path.write_text(cfg.to_json())
        with w.log_path.open("wb") as log:
            w.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "arceusd.worker", "--config", str(w.config_path)],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=_child_env(threads_of[w.peer_id]),
            )
        threading.Thread(target=w._read, daemon=True).start()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``), 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def collect_steps(job: Any, warmup: int, steps: int, timeout: float) -> tuple[float, float]:
    """Collect every worker's events until all said done (``WorkerJob.run_events``'s checks), snapshotting the
    workers' CPU time when the first worker reports the last warm-up step and the last step.

    Returns (CPU seconds all workers used, wall seconds) over the steady steps."""
    from arceusd.worker.protocol import DoneEvent, ErrorEvent, StepEvent

    deadline = time.monotonic() + timeout
    marks: dict[int, tuple[float, float]] = {}
    done: set[int] = set()
    lead = job.workers[0]
    while len(done) < len(job.workers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers did not finish {steps} steps in {timeout:.0f} s")
        for i, w in enumerate(job.workers):
            if i in done:
                continue
            try:
                ev = w.next_event(time.monotonic() + 0.02)
            except TimeoutError:
                continue
            if ev is None:
                raise RuntimeError(f"worker {w.stage}/{w.rank} ended without 'done':\n{w.log()}")
            if isinstance(ev, ErrorEvent):
                raise RuntimeError(f"worker {w.stage}/{w.rank} failed: {ev.message}\n{w.log()}")
            if isinstance(ev, DoneEvent):
                done.add(i)
            if w is lead and isinstance(ev, StepEvent) and ev.step in (warmup - 1, steps - 1):
                marks[ev.step] = (time.monotonic(), sum(_cpu_s(x.proc.pid) for x in job.workers))
    (t0, c0), (t1, c1) = marks[warmup - 1], marks[steps - 1]
    return c1 - c0, t1 - t0


def run_config(config: Config, steps: int, warmup: int, together: bool = True) -> Outcome:
    from arceusd.device.profile import DeviceMeasurement
    from arceusd.jobs.plans.planning import Offer, plan_inputs, worker_stages
    from arceusd.worker.protocol import StartCommand, StepEvent
    from partitioner import Link, LinkMatrix, plan
    from tests.integration.worker_harness import WorkerJob

    with contextlib.ExitStack() as stack:
        prefix: list[str] = []
        if config.cap_mbit > 0:
            prefix = stack.enter_context(capped_namespace(config.cap_mbit, config.delay_ms))
        # 1. devices (each alone, at its worker's thread count) and the link (inside the same namespace)
        ids = [f"dev{i}-{t}t" for i, t in enumerate(config.threads)]
        profiles = _run_children([(["--profile-child", str(t)], t) for t in config.threads], together)
        found = {pid: DeviceMeasurement(**got) for pid, got in zip(ids, profiles, strict=True)}
        link = _run_child(["--link-child"], prefix=prefix)
        # 2. plan, as the daemon's leader does, with the measured link
        spec = _spec(steps)
        offers = [
            Offer(
                pid,
                "",
                m.flops_per_s,
                int(m.memory_bytes * 0.8),
                block_efficiency=m.block_efficiency,
                dispatch_s=m.dispatch_s,
                adamw_s_per_param=m.adamw_s_per_param,
                sgd_s_per_param=m.sgd_s_per_param,
                message_s=link["message_s"],
            )
            for pid, m in found.items()
        ]
        inputs = plan_inputs(spec, offers, {})
        lk = Link(round(link["rtt_s"], 6), link["bandwidth_bytes_per_s"], link["message_s"])
        inputs = dataclasses.replace(
            inputs, links=LinkMatrix.symmetric((a, b, lk) for i, a in enumerate(ids) for b in ids[i + 1 :])
        )
        the_plan = plan(inputs)
        uncalibrated = uncalibrated_step_s(inputs, the_plan)
        stages = worker_stages(the_plan)
        # 3. workers for that plan; the harness names its own identities, mapped from the plan's by position
        layout = [(st.start, st.end, st.split()) for st in stages]
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        job = stack.enter_context(
            WorkerJob(
                Path(tmp),
                spec,
                layout,
                micro_batches=the_plan.micro_batches,
                schedule=the_plan.schedule,
                total_steps=steps,
            )
        )
        planned = {(s, r): m.peer_id for s, st in enumerate(stages) for r, m in enumerate(st.members)}
        threads_of = {w.peer_id: config.threads[ids.index(planned[(w.stage, w.rank)])] for w in job.workers}
        _spawn(job, threads_of, prefix)
        real = job.wait_listening(60)
        for w in job.workers:
            w.send(StartCommand(real).to_line())
        cpu = collect_steps(job, warmup, steps, timeout=900)
        per_worker = [[e.seconds for e in w.of(StepEvent)] for w in job.workers]
    steady = steady_step_seconds(per_worker, warmup)
    median = statistics.median(steady)
    # devices profiled alone: the best steady step (like the best-of profile: other load only adds time);
    # profiled together: the median, like the profile's median under the same sharing
    measured = median if together else min(steady)
    parts = []
    local: list[dict[str, float]] = []
    simple = all(len(st.devices) == 1 for st in the_plan.stages)
    if simple:
        threads_at = [config.threads[ids.index(st.devices[0])] for st in the_plan.stages]
        local = _run_children(
            [
                (
                    [
                        "--stage-child",
                        str(st.start),
                        str(st.end),
                        str(the_plan.micro_batch_size),
                        str(t),
                        "10" if together else "5",
                    ],
                    t,
                )
                for st, t in zip(the_plan.stages, threads_at, strict=True)
            ],
            together,
        )
    for s, st in enumerate(the_plan.stages):
        who = "+".join(d.split("-")[0] + f"({found[d].flops_per_s / 1e9:.1f} GF/s)" for d in st.devices)
        text = (
            f"[{st.start},{st.end}) on {who}: compute {st.compute_s * 1e3:.0f} ms, "
            f"allreduce {st.allreduce_s * 1e3:.0f} ms, transfer {st.transfer_s * 1e3:.0f} ms"
        )
        if simple:
            got = local[s]
            text += (
                f" | plain loop: fwd+bwd {got['fwd_bwd_s'] * 1e3:.0f} ms (benchmark efficiency "
                f"{st.compute_s / got['fwd_bwd_s']:.2f}), optimizer {got['optim_s'] * 1e3:.1f} ms"
            )
        parts.append(text)
    calibrated = None
    if len(local) == len(the_plan.stages):
        calibrated = calibrated_step_s(
            [g["fwd_bwd_s"] + st.allreduce_s + st.transfer_s for g, st in zip(local, the_plan.stages, strict=True)],
            the_plan.micro_batches,
            max(g["optim_s"] for g in local),
        )
    cpu_s, wall_s = cpu
    calib_cpu = sum(the_plan.micro_batches * g["fwd_bwd_s"] + g["optim_s"] for g in local)
    load = Path("/proc/loadavg").read_text().split()[0]
    cal = "; ".join(
        f"{d.split('-')[0]}: efficiency {m.block_efficiency:.2f}, dispatch "
        f"{m.dispatch_s * 1e3:.2f} ms/block, AdamW {m.adamw_s_per_param * 1e9:.2f} ns/param"
        for d, m in found.items()
    )
    detail = (
        f"load {load}; {cal}; link message {link['message_s'] * 1e3:.2f} ms; "
        f"workers' CPU over steady steps {cpu_s / wall_s:.2f} cores busy, "
        f"{cpu_s / len(steady) * 1e3:.0f} ms CPU/step"
        + (f" vs {calib_cpu * 1e3:.0f} ms in the plain loop" if calib_cpu else "")
        + "; "
        f"link rtt {link['rtt_s'] * 1e3:.2f} ms, {link['bandwidth_bytes_per_s'] / 1e6:.1f} MB/s; "
        f"{the_plan.schedule}, {the_plan.micro_batches} x {the_plan.micro_batch_size}; "
        + "; ".join(parts)
        + f"; steady steps {', '.join(f'{s:.2f}' for s in steady)} s (median {median:.3f})"
    )
    return Outcome(config.name, the_plan.predicted_step_time_s, measured, len(steady), detail, calibrated, uncalibrated)


def uncalibrated_step_s(inputs: Any, the_plan: Any) -> float:
    """``the_plan``'s step time under the cost model with the calibration stripped from ``inputs`` (block
    efficiency 1, no dispatch, optimizer or per-message cost): what the planner predicted before it."""
    from partitioner import DeviceProfile, Link, LinkMatrix
    from partitioner.cost import CostModel

    bare = dataclasses.replace(
        inputs,
        devices=tuple(DeviceProfile(d.peer_id, d.flops_per_s, d.memory_bytes, d.kind) for d in inputs.devices),
        links=LinkMatrix(tuple((a, b, Link(lk.rtt_s, lk.bandwidth_bytes_per_s)) for a, b, lk in inputs.links.links)),
    )
    cm = CostModel(bare)
    stages = [(tuple(cm.index[d] for d in st.devices), st.start, st.end) for st in the_plan.stages]
    again = cm.evaluate(stages, the_plan.micro_batches)
    if again is None:
        raise RuntimeError("the plan is infeasible without calibration, yet it was feasible with it (a bug)")
    return float(again.predicted_step_time_s)


# ---------------------------------------------------------------------------------------------- main


CONFIGS = (
    Config("1x1t", (1,)),
    Config("2x1t", (1, 1)),
    Config("1t+2t", (1, 2)),
    Config("cap", (1, 1), cap_mbit=20.0),
)


def run(quick: bool, only: Sequence[str], together: bool) -> int:
    steps, warmup = (7, 2) if quick else (16, 3)
    chosen = [c for c in CONFIGS if not only or c.name in only]
    print(
        f"GPT {MODEL}, batch {BATCH} (micro-batch count as planned), {steps} steps ({warmup} warm-up), "
        f"target |measured/predicted - 1| <= {TARGET:.0%}; devices profiled "
        + ("all at once (they share this machine)" if together else "each alone")
    )
    outcomes: list[Outcome] = []
    for config in chosen:
        if config.cap_mbit > 0 and (why := netns_problem()) is not None:
            print(f"{config.name}: skipped ({why})")
            continue
        began = time.monotonic()
        out = run_config(config, steps, warmup, together)
        outcomes.append(out)
        print(f"{config.name}: {out.detail} ({time.monotonic() - began:.0f} s)", flush=True)
    print(
        f"{'config':<8} {'predicted s':>12} {'measured s':>11} {'measured/predicted':>19}  within 25%"
        f"  {'measured/uncalibrated':>21}  {'measured/plain-loop':>19}"
    )
    for o in outcomes:
        cal = f"{o.measured_s / o.calibrated_s:>19.2f}" if o.calibrated_s else f"{'n/a':>19}"
        unc = f"{o.measured_s / o.uncalibrated_s:>21.2f}" if o.uncalibrated_s else f"{'n/a':>21}"
        print(
            f"{o.name:<8} {o.predicted_s:>12.3f} {o.measured_s:>11.3f} {o.ratio:>19.2f}  "
            f"{'yes' if o.within else 'NO':<10}  {unc}  {cal}"
        )
    print(
        "predicted = the planner's calibrated cost model; uncalibrated = the same plan without the measured "
        "calibration (as before it); plain-loop = the same formula with stage compute timed in a plain loop + the "
        "optimizer step: what is left above it is worker/pipeline overhead the cost model does not charge"
    )
    met = all(o.within for o in outcomes)
    print(f"target (every config within {TARGET:.0%}): {'met' if met and outcomes else 'NOT met'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer steps (about 2 minutes)")
    parser.add_argument("--only", nargs="*", default=[], help=f"configs to run, of {[c.name for c in CONFIGS]}")
    parser.add_argument("--profile-child", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--link-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage-child", type=int, nargs=5, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stat", default="min", help=argparse.SUPPRESS)
    parser.add_argument("--at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="profile each device alone (as a daemon on its own machine does) instead of all at once",
    )
    args = parser.parse_args()
    if args.stage_child:
        start, end, micro_batch, threads, reps = args.stage_child
        stage_child(start, end, micro_batch, threads, reps, args.stat, args.at)
        return 0
    if args.profile_child:
        profile_child(args.profile_child, args.stat, args.at)
        return 0
    if args.link_child:
        link_child()
        return 0
    return run(args.quick, args.only, not args.isolated)


if __name__ == "__main__":
    raise SystemExit(main())
