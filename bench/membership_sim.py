"""Membership core figures from the deterministic simulator (pure core, one process, no sockets, no sleeps).

For 100 and 1,000 simulated members under the ``lan`` preset it measures, and prints as ratios against the
textbook expectations computed in the same run:

* first detection: crash -> first member marks the victim SUSPECT. Baseline: SWIM's expected first detection
  ``T * e / (e - 1)`` (~1.58 probe periods; each of n-1 members probes one member per period, so the victim is
  missed by all with probability (1 - 1/(n-1))^(n-1) ~ 1/e, a geometric number of periods).
* full detection: crash -> every healthy member marks it DEAD (p50 and p99 over victims). Baseline:
  memberlist's ``1.58 * T + suspicion_mult * log10(max(1, n)) * T`` (first detection plus the suspicion
  timeout reached once the expected confirmations arrived; Lifeguard starts at 6x that and shrinks with
  confirmations).
* convergence: all members join through one seed at t=0 -> every member sees every other alive. Baseline: the
  push/pull interval (the slowest anti-entropy path), so a ratio < 1 means gossip did the work.
* gossip bytes/s per member in steady state and during detection, from the size model in
  ``arceusd.membership.events`` (checked against a msgpack encoding of the same message, ratio printed).

Run: ``python bench/membership_sim.py --quick`` (about a minute on 2 cores) or without ``--quick`` for more
victims and the 1,000-member convergence run.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack

from arceusd.membership import MembershipConfig, detection_bound, lan
from arceusd.membership.events import MemberState, SendPing, Update, UpdateKind, estimated_size
from arceusd.membership.sim import Cluster, NetworkModel, peer_name

LAN_NET = NetworkModel(delay_min=0.0002, delay_max=0.002, loss=0.0)
SWIM_FIRST = math.e / (math.e - 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def size_model_ratio() -> float:
    """estimated_size / msgpack size of a typical ping carrying three gossip updates."""
    gossip = tuple(Update(UpdateKind.ALIVE, "ab" * 16, 7, "ab" * 16, "192.168.1.20:7946", bytes(32)) for _ in range(3))
    ping = SendPing("cd" * 16, "192.168.1.21:7946", 12345, gossip)

    def plain(value: object) -> object:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [plain(getattr(value, f.name)) for f in dataclasses.fields(value)]
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, UpdateKind):
            return list(UpdateKind).index(value)
        return value

    return estimated_size(ping) / len(msgpack.packb(plain(ping)))


def detection(n: int, victims: int, cfg: MembershipConfig, seed: int) -> dict[str, float]:
    cluster = Cluster(n, cfg, seed=seed, net=LAN_NET)
    warm, window = 5.0, 10.0
    cluster.run_until(warm)
    bytes0, t0 = cluster.stats.bytes, cluster.now
    cluster.run_until(warm + window)
    steady = (cluster.stats.bytes - bytes0) / (n * (cluster.now - t0))
    gap = 2.0
    chosen = [peer_name(1 + i * (n - 1) // victims) for i in range(victims)]
    crash_at: dict[str, float] = {}
    bytes1, t1 = cluster.stats.bytes, cluster.now
    for i, victim in enumerate(chosen):
        cluster.run_until(t1 + i * gap)
        cluster.crash(victim)
        crash_at[victim] = cluster.now
    limit = cluster.now + 6 * cfg.suspicion_max_timeout(n) + 10 * cfg.probe_interval
    observers = {node.peer for node in cluster.up_nodes()}
    while cluster.now < limit:
        cluster.run_until(cluster.now + 1.0)
        if all(set(cluster.marks.get((v, MemberState.DEAD), {})) >= observers for v in chosen):
            break
    during = (cluster.stats.bytes - bytes1) / (n * (cluster.now - t1))
    first, full, missing = [], [], 0
    for victim in chosen:
        suspected = cluster.marks.get((victim, MemberState.SUSPECT), {})
        dead = cluster.marks.get((victim, MemberState.DEAD), {})
        if suspected:
            first.append(min(suspected.values()) - crash_at[victim])
        if set(dead) >= observers:
            full.append(max(dead[o] for o in observers) - crash_at[victim])
        else:
            missing += 1
    false_dead = sum(1 for (peer, state) in cluster.marks if state is MemberState.DEAD and peer not in chosen)
    return {
        "first_p50": statistics.median(first),
        "full_p50": statistics.median(full),
        "full_p99": percentile(full, 0.99),
        "missing": missing,
        "false_dead": false_dead,
        "steady_bps": steady,
        "during_bps": during,
        "messages": cluster.stats.messages,
    }


def convergence(n: int, cfg: MembershipConfig, seed: int) -> float:
    cluster = Cluster(n, cfg, seed=seed, net=LAN_NET, start_converged=False)
    everyone = {peer_name(i) for i in range(n)}
    step = 0.25
    for k in range(1, int(4 * cfg.push_pull_interval_for(n) / step) + 1):
        cluster.run_until(k * step)
        if all(node.membership.live_peers() == everyone for node in cluster.nodes.values()):
            return cluster.now
    return math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer victims, 1,000-member convergence skipped")
    args = parser.parse_args()
    cfg = lan()
    T = cfg.probe_interval
    plans = [(100, 10 if args.quick else 40), (1000, 3 if args.quick else 12)]
    print(
        f"lan preset: probe {T}s, timeout {cfg.probe_timeout}s, {cfg.indirect_checks} indirect, "
        f"suspicion x{cfg.suspicion_mult} (max x{cfg.suspicion_max_timeout_mult}), "
        f"retransmit x{cfg.retransmit_mult}"
    )
    print(f"size model vs msgpack (ping + 3 alive updates): {size_model_ratio():.2f}x")
    print()
    header = (
        f"{'n':>5} {'victims':>7} {'first p50':>9} {'/SWIM':>6} {'dead p50':>8} {'dead p99':>8} "
        f"{'p50,p99/memberlist':>18} "
        f"{'missed':>6} {'false':>5} {'B/s/member steady':>17} {'during':>7} {'wall s':>6}"
    )
    print(header)
    for n, victims in plans:
        start = time.perf_counter()
        r = detection(n, victims, cfg, seed=n)
        wall = time.perf_counter() - start
        swim_first = SWIM_FIRST * T
        memberlist_full = swim_first + cfg.suspicion_mult * math.log10(max(1, n)) * T
        print(
            f"{n:>5} {victims:>7} {r['first_p50']:>8.2f}s {r['first_p50'] / swim_first:>5.2f}x "
            f"{r['full_p50']:>7.2f}s {r['full_p99']:>7.2f}s "
            f"{r['full_p50'] / memberlist_full:>11.2f}x,{r['full_p99'] / memberlist_full:.2f}x "
            f"{int(r['missing']):>6} {int(r['false_dead']):>5} {r['steady_bps']:>17.0f} "
            f"{r['during_bps']:>7.0f} "
            f"{wall:>6.1f}"
        )
        print(
            f"      baselines: SWIM first detection {swim_first:.2f}s; memberlist full detection "
            f"{memberlist_full:.2f}s (= 1.58T + {cfg.suspicion_mult}*log10({n})*T); "
            f"detection_bound {detection_bound(cfg, n):.1f}s"
        )
    print()
    for n in [100] if args.quick else [100, 1000]:
        start = time.perf_counter()
        t = convergence(n, cfg, seed=7)
        pp = cfg.push_pull_interval_for(n)
        print(
            f"convergence n={n}: {t:.2f}s after all join one seed; push/pull interval {pp:.0f}s "
            f"-> {t / pp:.2f}x (wall {time.perf_counter() - start:.1f}s)"
        )


if __name__ == "__main__":
    main()
