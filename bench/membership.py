"""Membership and election figures from real daemons on loopback, beside the pure core's simulated figures.

Real daemons (separate processes, gRPC on loopback, ``local`` preset, static seeds; :class:`LocalSwarm`):

* detection after SIGKILL, over repeated kills (5 with ``--quick``, 20 without): first detection (some
  survivor marks the victim suspect or dead) and full detection (every survivor marks it dead), p50/p99.
  Each victim is the current leader of a tracked job, so the same kill also gives the election failover time
  (every survivor names one new leader at a higher term). The victim is then restarted from its state
  directory (same identity and port) and the swarm re-converges before the next kill.
* convergence of N=5 fresh daemons (all ready -> everyone sees everyone alive).
* bytes sent per member per second (status ``membership.bytes_sent``: whole signed frames) in steady state,
  without and with one tracked job (election heartbeats ride the same counter).

Baselines computed in the same run and printed as ratios:

* SWIM's expected first detection ``T * e / (e - 1)`` (T = probe interval);
* memberlist's full detection ``1.58 T + suspicion_mult * max(1, log10 n) * T`` (Lifeguard's suspicion timeout
  once the expected confirmations arrived);
* the pure core in the deterministic simulator (:mod:`bench.membership_sim`) at the same n and preset - real
  daemons vs. the model, for detection, convergence and bytes (the simulator's size model has no envelope or
  signatures, so the bytes ratio is the wire's overhead);
* failover vs. the mean detection time plus one election timeout (the listening period a follower waits).

Then the pure-core figures for 100 and 1,000 simulated members under the ``lan`` preset (from
``bench/membership_sim.py``), beside SWIM's and memberlist's expectations.

Run: ``python bench/membership.py --quick`` (about 2-3 minutes on 2 cores) or without ``--quick``. Timing
resolution of the real-daemon figures is the control-socket polling period (~10-30 ms on a loaded box).
"""

from __future__ import annotations

import argparse
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import membership_sim as sim

from arceusd.base.control import ControlError
from arceusd.cli.swarm import LocalSwarm
from arceusd.elections.core import election_local
from arceusd.membership.config import MembershipConfig, lan, local

N = 5
SWIM_FIRST = math.e / (math.e - 1)


class BenchSwarm(LocalSwarm):
    """A :class:`LocalSwarm` that can bring a killed daemon back from its state directory."""

    def restart(self, i: int, timeout: float = 60.0) -> dict[str, Any]:
        if self.procs[i].poll() is None:
            raise RuntimeError(f"daemon {i} is still running; kill it before restarting it")
        seeds: list[str] = []
        for j, port in enumerate(self.ports):
            if j != i:
                seeds += ["--peer", f"127.0.0.1:{port}"]
        state = self.state_dir(i)
        cmd = [
            sys.executable,
            "-m",
            "arceusd",
            "--state-dir",
            str(state),
            "start",
            "--foreground",
            "--preset",
            "local",
            "--port",
            str(self.ports[i]),
            "--log-file",
            str(state / "arceusd.log"),
            *seeds,
        ]
        self.procs[i] = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return self.wait_ready(i, timeout)


# ------------------------------------------------------------------------------------------------ polling
def views(s: LocalSwarm, members: list[int]) -> dict[int, dict[str, str]]:
    return {i: {p["peer_id"]: p["state"] for p in s.call(i, "peers")} for i in members}


def converged(s: LocalSwarm, ids: list[str]) -> bool:
    for i, view in views(s, list(range(len(ids)))).items():
        if {p for p, st in view.items() if st == "alive"} != set(ids) - {ids[i]}:
            return False
    return True


def agreed_leader(s: LocalSwarm, members: list[int], job: str) -> tuple[str, int] | None:
    pairs = {(v["leader"], v["term"]) for v in (s.call(i, "elections").get(job, {}) for i in members)}
    if len(pairs) != 1:
        return None
    leader, term = pairs.pop()
    return None if leader is None else (leader, term)


def wait(predicate: Any, timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except ControlError:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def bytes_rate(s: LocalSwarm, window: float) -> tuple[float, dict[str, float]]:
    """Mean bytes sent per member per second over ``window`` seconds, and frames/s per message type (all)."""
    before = [s.call(i, "status")["membership"] for i in range(N)]
    t0 = time.monotonic()
    time.sleep(window)
    after = [s.call(i, "status")["membership"] for i in range(N)]
    elapsed = time.monotonic() - t0
    sent = sum(a["bytes_sent"] - b["bytes_sent"] for a, b in zip(after, before, strict=True))
    frames: dict[str, float] = {}
    for a, b in zip(after, before, strict=True):
        for kind, count in a["sent"].items():
            frames[kind] = frames.get(kind, 0.0) + (count - b["sent"].get(kind, 0)) / elapsed
    return sent / (N * elapsed), frames


# ------------------------------------------------------------------------------------------------ real runs
def real_daemons(kills: int, window: float) -> dict[str, Any]:
    out: dict[str, Any] = {"first": [], "full": [], "failover": [], "rejoin": []}
    with tempfile.TemporaryDirectory(prefix="arceus-bench-") as root:
        swarm = BenchSwarm(Path(root), N)
        try:
            t_spawn = time.monotonic()
            swarm.start()
            t_ready = time.monotonic()
            ids = [swarm.call(i, "status")["peer_id"] for i in range(N)]
            wait(lambda: converged(swarm, ids), 60, "convergence")
            out["converge_from_ready"] = time.monotonic() - t_ready
            out["converge_from_spawn"] = time.monotonic() - t_spawn
            out["bps_gossip"], out["frames_gossip"] = bytes_rate(swarm, window)

            job = uuid.uuid4().hex
            for i in range(N):
                swarm.call(i, "track_job", {"job_id": job, "members": ids})
            t_track = time.monotonic()
            wait(lambda: agreed_leader(swarm, list(range(N)), job), 60, "first leader")
            out["first_election"] = time.monotonic() - t_track
            out["bps_with_job"], out["frames_with_job"] = bytes_rate(swarm, window)

            for k in range(kills):
                leader, term = wait(lambda: agreed_leader(swarm, list(range(N)), job), 60, "an agreed leader")
                victim = ids.index(leader)
                survivors = [i for i in range(N) if i != victim]
                swarm.signal(victim, signal.SIGKILL)
                t0 = time.monotonic()
                swarm.wait(victim, timeout=10)
                first = full = failover = None
                deadline = t0 + 60
                while time.monotonic() < deadline and (full is None or failover is None):
                    now_views = views(swarm, survivors)
                    now = time.monotonic() - t0
                    marks = [v.get(ids[victim]) for v in now_views.values()]
                    if first is None and any(m in ("suspect", "dead") for m in marks):
                        first = now
                    if full is None and all(m == "dead" for m in marks):
                        full = now
                    if failover is None:
                        found = agreed_leader(swarm, survivors, job)
                        if found is not None and found[0] != leader and found[1] > term:
                            failover = time.monotonic() - t0
                    time.sleep(0.01)
                if first is None or full is None or failover is None:
                    raise RuntimeError(f"kill {k}: no detection/failover within 60 s ({first}, {full}, {failover})")
                out["first"].append(first)
                out["full"].append(full)
                out["failover"].append(failover)
                t1 = time.monotonic()
                swarm.restart(victim)
                wait(lambda: converged(swarm, ids), 60, "re-convergence after restart")
                out["rejoin"].append(time.monotonic() - t1)
                swarm.call(victim, "track_job", {"job_id": job, "members": ids})
                print(
                    f"  kill {k + 1}/{kills}: first {first:.2f}s, all dead {full:.2f}s, "
                    f"new leader {failover:.2f}s, rejoin {out['rejoin'][-1]:.2f}s",
                    flush=True,
                )
        finally:
            swarm.close()
    return out


def model_small(cfg: MembershipConfig, runs: int) -> dict[str, float]:
    """The simulated core at n=N with the same preset: one victim per seeded run, medians over runs."""
    first, full, steady = [], [], []
    for seed in range(runs):
        r = sim.detection(N, 1, cfg, seed=1000 + seed)
        first.append(r["first_p50"])
        full.append(r["full_p50"])
        steady.append(r["steady_bps"])
    return {
        "first": statistics.median(first),
        "full": statistics.median(full),
        "steady_bps": statistics.median(steady),
        "converge": sim.convergence(N, cfg, seed=7),
    }


# ------------------------------------------------------------------------------------------------ printing
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 kills, short windows, fewer simulated victims")
    args = parser.parse_args()
    kills, window = (5, 3.0) if args.quick else (20, 10.0)
    cfg = local()
    T = cfg.probe_interval
    swim_first = SWIM_FIRST * T
    memberlist_full = 1.58 * T + cfg.suspicion_min_timeout(N)
    print(
        f"real daemons: N={N}, local preset (probe {T}s, timeout {cfg.probe_timeout}s, suspicion "
        f"x{cfg.suspicion_mult}, push/pull {cfg.push_pull_interval}s), election timeout "
        f"{election_local().election_timeout}s, {kills} SIGKILLs of the current leader"
    )
    t_wall = time.perf_counter()
    real = real_daemons(kills, window)
    model = model_small(cfg, runs=10 if args.quick else 40)
    print(f"  (real runs took {time.perf_counter() - t_wall:.0f}s wall)")
    print()
    print(f"{'figure':<34} {'real':>8} {'model(sim)':>10} {'real/model':>10} {'baseline':>9} {'real/base':>9}")

    def row(name: str, value: float, model_value: float | None, base: float | None, unit: str = "s") -> None:
        m = f"{model_value:>9.2f}{unit}" if model_value is not None else f"{'-':>10}"
        rm = f"{value / model_value:>9.2f}x" if model_value else f"{'-':>10}"
        b = f"{base:>8.2f}{unit}" if base is not None else f"{'-':>9}"
        rb = f"{value / base:>8.2f}x" if base else f"{'-':>9}"
        print(f"{name:<34} {value:>7.2f}{unit} {m} {rm} {b} {rb}")

    row("first detection p50 (vs SWIM)", statistics.median(real["first"]), model["first"], swim_first)
    row("first detection p99 (vs SWIM)", percentile(real["first"], 0.99), None, swim_first)
    row("all survivors dead p50 (vs ml)", statistics.median(real["full"]), model["full"], memberlist_full)
    row("all survivors dead p99 (vs ml)", percentile(real["full"], 0.99), None, memberlist_full)
    failover_base = statistics.mean(real["full"]) + election_local().election_timeout
    row("leader failover p50 (vs det+ET)", statistics.median(real["failover"]), None, failover_base)
    row("leader failover p99 (vs det+ET)", percentile(real["failover"], 0.99), None, failover_base)
    row(
        "convergence N=5 from ready (vs pp)",
        real["converge_from_ready"],
        model["converge"],
        cfg.push_pull_interval,
    )
    row("convergence N=5 from spawn", real["converge_from_spawn"], None, None)
    row("rejoin after restart p50 (vs pp)", statistics.median(real["rejoin"]), None, cfg.push_pull_interval)
    row("first election (vs 2 x ET)", real["first_election"], None, 2 * election_local().election_timeout)
    row("bytes/s per member, gossip only", real["bps_gossip"], model["steady_bps"], None, "B")
    row("bytes/s per member, + 1 job", real["bps_with_job"], real["bps_gossip"], None, "B")
    frames = ", ".join(f"{k} {v:.1f}" for k, v in sorted(real["frames_with_job"].items()))
    print(f"  frames/s (all {N} members together) with 1 job: {frames}")
    print(
        f"  baselines: SWIM first detection T*e/(e-1) = {swim_first:.3f}s; memberlist full detection "
        f"1.58T + suspicion_mult*max(1,log10 n)*T = {memberlist_full:.3f}s; det+ET = mean full detection "
        "+ election timeout; pp = push/pull interval; ml = memberlist; the '+1 job' row's model column is "
        "the gossip-only real figure"
    )
    print()

    lan_cfg = lan()
    LT = lan_cfg.probe_interval
    plans = [(100, 10 if args.quick else 40), (1000, 3 if args.quick else 12)]
    print(f"pure core in the simulator, lan preset (probe {LT:.1f}s):")
    print(
        f"{'n':>5} {'victims':>7} {'first p50':>9} {'/SWIM':>6} {'dead p50':>8} {'dead p99':>8} "
        f"{'/memberlist':>11} {'missed':>6} {'false':>5} {'B/s/member':>10} {'wall s':>6}"
    )
    for n, victims in plans:
        start = time.perf_counter()
        r = sim.detection(n, victims, lan_cfg, seed=n)
        swim = SWIM_FIRST * LT
        ml = 1.58 * LT + lan_cfg.suspicion_min_timeout(n)
        print(
            f"{n:>5} {victims:>7} {r['first_p50']:>8.2f}s {r['first_p50'] / swim:>5.2f}x "
            f"{r['full_p50']:>7.2f}s {r['full_p99']:>7.2f}s {r['full_p50'] / ml:>10.2f}x "
            f"{int(r['missing']):>6} {int(r['false_dead']):>5} {r['steady_bps']:>10.0f} "
            f"{time.perf_counter() - start:>6.1f}"
        )
    for n in [100] if args.quick else [100, 1000]:
        start = time.perf_counter()
        t = sim.convergence(n, lan_cfg, seed=7)
        pp = lan_cfg.push_pull_interval_for(n)
        print(
            f"  convergence n={n}: {t:.2f}s (push/pull interval {pp:.0f}s -> {t / pp:.2f}x; "
            f"wall {time.perf_counter() - start:.1f}s)"
        )


if __name__ == "__main__":
    main()
