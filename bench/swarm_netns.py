"""Swarm bench: job tokens/s of one device alone against two devices on a shaped link, as real worker processes.

Each "device" is a set of stage-worker processes (``python -m arceusd.worker``) in its own network namespace
(``tests/netns/lan.py``: veth pairs into a bridge) pinned to its own core (``taskset`` and the worker's ``cpus``);
the two namespaces' links are shaped with ``tc`` (a token bucket on each side's egress: 1 Gbit/s, or 50 Mbit/s).
netem is missing on this kind of machine, so latency comes from a small delaying forwarder of ours
(``--forward`` mode of this file: a TCP relay in the connecting side's namespace that holds each chunk for
the one-way delay, pipelined, so bandwidth is still the link's). Without root or ``ip netns`` everything runs
on 127.0.0.1 and the forwarder also paces the bytes to the link's rate (stated in the output).

Runs, all in this invocation (the same machine state), printed as tokens/s and the ratio against (a):
  (a) one device alone, the whole model and the whole global batch per step;
  (b) fast link, 2 replicas (data parallel, gradients all-reduced every step over the workers' ring streams);
  (c) fast link, 2-stage pipeline (today's plan over two devices), raw activations;
  (d) slow link, 2-stage pipeline, raw activations ("plain");
  (e) slow link, 2-stage pipeline, int8 activations and gradients ("compressed");
  (f) slow link, 2 replicas all-reduced every step;
  (g) slow link, 2 replicas with DiLoCo (int8 pseudo-gradients every H steps);
  (h) slow link, 2 replicas all-reduced every step with int8 gradients ("compressed" replicas).
Tokens/s counts the global batch's tokens of every step after the first (start-up and the first step's
warm-up excluded): (steps - 1) x batch x context / (arrival of the last step's events - the first's).

Targets (issue 22): two devices on the fast link >= 1.6x one; on the slow link the plan the planner would pick
never below 1.0x. The machine this was written on has 2 cores shared with other work: the figures are noisy
there; run under the shared lock. ``--quick``: a few steps of a small model (CI's bench smoke).

Measured on a quiet 2-core machine (GPT 2x128, global batch 128, the default): one device 28,099 tokens/s; fast
link, replicas all-reduced 1.76x, 2-stage pipeline 1.51x; slow link, pipeline 0.28x plain / 0.82x int8, replicas
all-reduced 0.63x, all-reduced int8 1.28x, DiLoCo H=10 1.80x. With a global batch of 32 (``--batch 32``) the
fast-link replicas reach 1.45x: each step's all-reduce of the whole model weighs more against a quarter of the
compute.

Usage (root, for namespaces and tc): ``python bench/swarm_netns.py [--steps N] [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from arceusd.base.identity import load_or_create_identity  # noqa: E402
from arceusd.jobs.spec.schema import JobSpec, parse_spec, to_dict  # noqa: E402
from arceusd.worker.protocol import (  # noqa: E402
    DoneEvent,
    ErrorEvent,
    Listening,
    MemberConfig,
    ReplicaSyncConfig,
    StageConfig,
    StartCommand,
    StepEvent,
    WorkerConfig,
    parse_event,
)
from tests.netns.lan import Host, netns_available, virtual_lan  # noqa: E402

FAST_BIT_S = 1e9
SLOW_BIT_S = 50e6
FAST_RTT_S = 0.0
"""The fast link's added round trip: none (the veth pair's ~0.05 ms is LAN-like already)."""
SLOW_RTT_S = 0.02
"""The slow link's round trip (a WAN-ish 20 ms), added by the forwarder."""


# -- the delaying forwarder (runs as ``python bench/swarm_netns.py --forward ...`` in a namespace) ------------


def forward_main(specs: Sequence[str], delay_s: float, rate_bytes_s: float) -> int:
    """Relay each ``listen_port=target_host:target_port`` (listening on 127.0.0.1; port 0: any), holding every
    chunk ``delay_s`` and, when ``rate_bytes_s`` > 0, pacing each direction to that rate. Prints the ports
    bound (one line, space-separated, in order), then serves until stdin closes."""
    listeners = []
    for spec in specs:
        port, _, target = spec.partition("=")
        host, _, tport = target.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", int(port)))
        sock.listen(64)
        listeners.append((sock, (host, int(tport))))
    print(" ".join(str(s.getsockname()[1]) for s, _ in listeners), flush=True)
    for sock, addr in listeners:
        threading.Thread(target=_accept, args=(sock, addr, delay_s, rate_bytes_s), daemon=True).start()
    sys.stdin.read()  # the bench closes our stdin when done
    return 0


def _accept(sock: socket.socket, target: tuple[str, int], delay_s: float, rate: float) -> None:
    while True:
        conn, _ = sock.accept()
        try:
            out = socket.create_connection(target, timeout=10)
        except OSError:
            conn.close()
            continue
        for s in (conn, out):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in ((conn, out), (out, conn)):
            q: queue.Queue[tuple[float, bytes]] = queue.Queue()
            threading.Thread(target=_read, args=(a, q), daemon=True).start()
            threading.Thread(target=_write, args=(b, q, delay_s, rate), daemon=True).start()


def _read(src: socket.socket, q: queue.Queue[tuple[float, bytes]]) -> None:
    while True:
        try:
            chunk = src.recv(1 << 16)
        except OSError:
            chunk = b""
        q.put((time.monotonic(), chunk))
        if not chunk:
            return


def _write(dst: socket.socket, q: queue.Queue[tuple[float, bytes]], delay_s: float, rate: float) -> None:
    free_at = 0.0  # when the paced link is free again
    while True:
        arrived, chunk = q.get()
        wait = arrived + delay_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if not chunk:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        if rate > 0:
            now = time.monotonic()
            free_at = max(free_at, now) + len(chunk) / rate
            if free_at > now:
                time.sleep(free_at - now)
        try:
            dst.sendall(chunk)
        except OSError:
            return


# -- worker sets ---------------------------------------------------------------------------------------------


@dataclass
class Device:
    """One device: a namespace (or None: this one) and a core."""

    host: Host | None
    core: int

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else "127.0.0.1"

    def wrap(self, cmd: list[str]) -> list[str]:
        pinned = ["taskset", "-c", str(self.core), *cmd]
        return self.host.wrap(pinned) if self.host is not None else pinned


@dataclass
class Proc:
    peer_id: str
    device: int
    popen: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    arrivals: dict[int, float] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    listening: queue.Queue[int] = field(default_factory=queue.Queue)

    def read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            ev = parse_event(line)
            if isinstance(ev, Listening):
                self.listening.put(ev.port)
            elif isinstance(ev, StepEvent):
                self.arrivals[ev.step] = time.monotonic()
            elif isinstance(ev, ErrorEvent):
                self.error = ev.message
                self.done.set()
            elif isinstance(ev, DoneEvent):
                self.done.set()
        self.done.set()


@dataclass(frozen=True)
class Run:
    name: str
    devices: int
    replicas: int = 1
    """1: one pipeline over ``devices`` stages; 2: two one-stage replicas."""
    slow: bool = False
    compression: str = "none"
    sync: str = "allreduce"
    grad_codec: str = "raw"


def run_one(
    run: Run,
    spec: JobSpec,
    devices: list[Device],
    tmp: Path,
    steps: int,
    diloco_h: int,
    netns: bool,
    timeout_s: float,
    bucket_bytes: int,
) -> float:
    """Tokens/s of ``run`` (see the module docstring)."""
    from arceusd.models.build import num_blocks

    work = Path(tempfile.mkdtemp(prefix=run.name.split()[0].strip("()") + "-", dir=tmp))
    doc = to_dict(spec)
    doc["training"]["compression"] = run.compression
    if run.devices > 1 and run.replicas == 1:
        doc["training"]["micro_batches"] = 4  # a pipeline needs micro-batches in flight
    blocks = num_blocks(spec.model)
    used = devices[: run.devices]
    ids = [load_or_create_identity(work / f"state-{i}").peer_id for i in range(run.devices)]
    reps: tuple[tuple[StageConfig, ...], ...] = ()
    own: dict[str, tuple[StageConfig, ...]]
    sync: ReplicaSyncConfig | None = None
    if run.replicas > 1:
        reps = tuple((StageConfig(0, blocks, (MemberConfig(ids[r]),)),) for r in range(run.replicas))
        own = {ids[r]: reps[r] for r in range(run.replicas)}
        sync = ReplicaSyncConfig(
            mode=run.sync, diloco_h=diloco_h, codec="int8", grad_codec=run.grad_codec, bucket_bytes=bucket_bytes
        )
    else:
        cuts = [round(blocks * i / run.devices) for i in range(run.devices + 1)]
        stages = tuple(StageConfig(cuts[i], cuts[i + 1], (MemberConfig(ids[i]),)) for i in range(run.devices))
        own = {p: stages for p in ids}
    procs: list[Proc] = []
    forwarders: list[subprocess.Popen[bytes]] = []
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    try:
        for i, pid in enumerate(ids):
            cfg = WorkerConfig(
                job_id="bench",
                term=1,
                epoch=1,
                spec=doc,
                stages=own[pid],
                replicas=reps,
                replica_sync=sync,
                micro_batches=doc["training"]["micro_batches"],
                schedule="1f1b",
                peer_id=pid,
                state_dir=str(work / f"state-{i}"),
                listen_host=used[i].address,
                owner=ids[0],
                checkpoint_dir=str(work / "ckpt"),
                checkpoint_interval=0,
                total_steps=steps,
                threads=1,
                link_timeout_s=timeout_s,
                cpus=(used[i].core,),
            )
            path = work / f"worker-{i}.json"
            path.write_text(cfg.to_json())
            log = work / f"worker-{i}.log"
            with log.open("wb") as err:
                popen = subprocess.Popen(
                    used[i].wrap([sys.executable, "-m", "arceusd.worker", "--config", str(path)]),
                    cwd=ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=env,
                )
            proc = Proc(pid, i, popen, log)
            threading.Thread(target=proc.read, daemon=True).start()
            procs.append(proc)
        for p in procs:
            try:
                p.port = p.listening.get(timeout=timeout_s)
            except queue.Empty:
                tail = p.log.read_text()[-2000:]
                raise RuntimeError(f"{run.name}: worker {p.device} never listened:\n{tail}") from None
        real = {p.peer_id: f"{used[p.device].address}:{p.port}" for p in procs}
        delay = (SLOW_RTT_S if run.slow else FAST_RTT_S) / 2
        rate = (SLOW_BIT_S if run.slow else FAST_BIT_S) / 8
        views = {}
        for p in procs:
            remote = [q for q in procs if q.device != p.device]
            if not remote or (netns and delay == 0):
                views[p.peer_id] = real
                continue
            args = [f"0={real[q.peer_id]}" for q in remote]
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--forward",
                *args,
                "--delay",
                str(delay),
                "--rate",
                "0" if netns else str(rate),
            ]
            fwd = subprocess.Popen(used[p.device].wrap(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            forwarders.append(fwd)
            assert fwd.stdout is not None
            ports = fwd.stdout.readline().decode().split()
            view = dict(real)
            for q, port in zip(remote, ports, strict=True):
                view[q.peer_id] = f"127.0.0.1:{port}"
            views[p.peer_id] = view
        for p in procs:
            assert p.popen.stdin is not None
            p.popen.stdin.write((StartCommand(views[p.peer_id]).to_line() + "\n").encode())
            p.popen.stdin.flush()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            if not p.done.wait(max(0.1, deadline - time.monotonic())):
                raise RuntimeError(f"{run.name}: worker {p.device} did not finish in {timeout_s:.0f} s")
            if p.error:
                raise RuntimeError(f"{run.name}: worker {p.device} failed: {p.error}\n{p.log.read_text()[-2000:]}")
        first = max(p.arrivals[0] for p in procs)
        last = max(p.arrivals[steps - 1] for p in procs)
        tokens = (steps - 1) * spec.training.batch_size * spec.model.block_size  # type: ignore[union-attr]
        return tokens / (last - first)
    finally:
        for p in procs:
            if p.popen.poll() is None:
                p.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=10)
        for f in forwarders:
            with contextlib.suppress(Exception):
                assert f.stdin is not None
                f.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                f.wait(timeout=5)
            if f.poll() is None:
                f.kill()


@contextlib.contextmanager
def shaped_devices(netns: bool, bit_s: float) -> Iterator[list[Device]]:
    """Two devices (cores 0 and 1 when the machine has them): namespaces whose eth0 egress is shaped to
    ``bit_s``, or two places on this host's loopback (the forwarder paces instead)."""
    cores = [0, 1 if (os.cpu_count() or 1) > 1 else 0]
    if not netns:
        yield [Device(None, c) for c in cores]
        return
    with virtual_lan(2, subnet=31) as hosts:
        for h in hosts:
            burst = max(64 * 1024, int(bit_s / 8 / 250))  # at least one timer tick's worth of bytes
            cmd = [
                "tc",
                "qdisc",
                "replace",
                "dev",
                h.interface,
                "root",
                "tbf",
                "rate",
                f"{int(bit_s)}bit",
                "burst",
                str(burst),
                "latency",
                "200ms",
            ]
            subprocess.run(h.wrap(cmd), check=True, capture_output=True, timeout=30)
        yield [Device(h, c) for h, c in zip(hosts, cores, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--diloco-h", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128, help="global batch (a multiple of 8)")
    parser.add_argument("--width", type=int, default=128, help="the GPT's width (a multiple of 4)")
    parser.add_argument("--bucket-kib", type=int, default=4096, help="the replicas' all-reduce bucket size")
    parser.add_argument("--quick", action="store_true", help="a few steps of a tiny model (CI's bench smoke)")
    parser.add_argument("--no-netns", action="store_true", help="loopback only, the forwarder shapes")
    parser.add_argument("--only", default="", help="comma-separated run letters, e.g. a,b,g")
    parser.add_argument("--forward", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.forward is not None:
        return forward_main(args.forward, args.delay, args.rate)
    steps = 4 if args.quick else args.steps
    h = 2 if args.quick else args.diloco_h
    width, layers, batch = (32, 2, 8) if args.quick else (args.width, 2, args.batch)
    spec = parse_spec(
        {
            "name": "swarm-bench",
            "seed": 1,
            "model": {
                "type": "gpt",
                "n_layer": layers,
                "n_head": 4,
                "n_embd": width,
                "block_size": 64,
                "vocab_size": "auto",
            },
            "data": {"kind": "text", "path": str(ROOT / "data" / "tinyshakespeare" / "input.txt"), "val_fraction": 0.1},
            "training": {
                "steps": steps,
                "batch_size": batch,
                "micro_batches": 1,
                "optimizer": "adamw",
                "lr": 1e-3,
                "eval_iters": 0,
            },
        },
        base_dir=ROOT,
        check_files=True,
    )
    why = None if not args.no_netns else "--no-netns"
    why = why or netns_available()
    netns = why is None
    where = (
        "network namespaces, tc tbf shaping, our delaying forwarder"
        if netns
        else (f"loopback ({why}): our forwarder delays and paces")
    )
    print(
        f"swarm bench: GPT {layers}x{width}, context 64, global batch {batch}, {steps} steps, DiLoCo H={h}; "
        f"{where}; cores {os.cpu_count()}"
    )
    runs = [
        ("a", Run("(a) one device alone", 1)),
        ("b", Run("(b) fast 1 Gbit/s: 2 replicas, all-reduce", 2, replicas=2)),
        ("c", Run("(c) fast 1 Gbit/s: 2-stage pipeline", 2)),
        ("d", Run("(d) slow 50 Mbit/s 20 ms: pipeline, plain", 2, slow=True)),
        ("e", Run("(e) slow 50 Mbit/s 20 ms: pipeline, int8", 2, slow=True, compression="int8")),
        ("f", Run("(f) slow 50 Mbit/s 20 ms: 2 replicas, all-reduce", 2, replicas=2, slow=True)),
        ("g", Run(f"(g) slow 50 Mbit/s 20 ms: 2 replicas, DiLoCo H={h}", 2, replicas=2, slow=True, sync="diloco")),
        (
            "h",
            Run("(h) slow 50 Mbit/s 20 ms: 2 replicas, all-reduce int8", 2, replicas=2, slow=True, grad_codec="int8"),
        ),
    ]
    chosen = set(args.only.split(",")) if args.only else {k for k, _ in runs}
    chosen.add("a")  # every ratio is against (a) of this run
    timeout_s = 120.0 if args.quick else 600.0
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="swarm-bench-") as tmp:
        for speed in (False, True):
            bit_s = SLOW_BIT_S if speed else FAST_BIT_S
            todo = [(k, r) for k, r in runs if k in chosen and r.slow == speed]
            if not todo:
                continue
            with shaped_devices(netns, bit_s) as devices:
                for key, run in todo:
                    tps = run_one(run, spec, devices, Path(tmp), steps, h, netns, timeout_s, args.bucket_kib * 1024)
                    results[key] = tps
                    base = results["a"]
                    print(f"{run.name:52s} {tps:9.0f} tokens/s  {tps / base:5.2f}x", flush=True)
    slow_best = max((results[k] for k in "defgh" if k in results), default=None)
    if "b" in results:
        print(
            f"fast link, best of two devices: {max(results[k] for k in 'bc' if k in results) / results['a']:.2f}x "
            "(target >= 1.6x)"
        )
    if slow_best is not None:
        pick = max(slow_best, results["a"])  # the planner never picks a plan predicted slower than one device
        print(
            f"slow link, best of two devices: {slow_best / results['a']:.2f}x; with the one-device floor "
            f"{pick / results['a']:.2f}x (target >= 1.0x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
