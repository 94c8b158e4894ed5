"""Adversarial bench: what each attack of issue #19 costs a real daemon, against the same daemon with no attack.

Usage: ``python bench/adversarial.py [--quick]``

One daemon (``local`` preset, loopback, its own process) is started once. For each attack, the daemon is first
watched for a quiet window (the no-attack baseline, right before), then while the attack runs from its own process
(``tests/adversarial/hostile_peer.py``: its own key, the real protocol). Watching samples the daemon every
0.1 s: RSS from /proc, and the latency of ``status`` over the control socket. Printed per attack: peak RSS and
status latency (median and max) without and with the attack, and the ratios with/without measured in this
run, and the attack's outcome (the answers it got). Attacks: 48 silent streams (item 8), 40 unauthenticated
60 MiB calls (item 9), a JobAnnounce flood of 300 KiB specs from 100 keys (item 6), a member with a hostile
device string (item 10), mutated handshakes and stream frames, and forty 4 MiB frames of densely packed empty
msgpack maps from a key that only said hello (issue 29; each refused by its first byte).

``--fair`` measures issue 29's announce flood against a daemon that sees two honest jobs, beside the same daemons
with no flood, and counts the honest jobs ``arceusd market`` still lists (``bench/adversarial_fair.py``).

``--fds`` measures issue 29's descriptor flood (1,100 silent connections from one host, 1,124 from 32 hosts)
against a daemon at 1,024 open files beside a no-attack run, and what the peer port's gate costs a call
(``bench/adversarial_fds.py``).

``--jobs`` measures the job attacks instead (items 1, 3 and 4: ``tests/adversarial/hostile_job.py``, a real daemon
as a member of a 3-daemon MLP training job whose reports and shards lie from checkpoint step 40 on; issue 29's
1e30 in the final shard, a shard served as 16 GiB, every checkpoint answered with an error, an 8 TiB offer, and a
made-up witness in a job of two replicas (with its own honest run); and a member offering 100 times its speed
whose reports cover it, or that forges its speed challenges, on a job of 2048-wide layers): per attack a fresh
swarm trains the job; the owner's peak RSS and ``status`` latency over the whole
job, the job's wall time and its end (state, who was excluded or discounted), beside the same job with an honest
member (``none``).

``--market`` measures issue 29's marketplace attacks beside their no-attack runs (``bench/adversarial_market.py``):
what a member offering 1,000 times its speed earns against an honest member, and when members leave an owner that
withholds their receipts or prices them at $0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.adversarial.victim import Report, Watch, hostile, peer_address, start_daemon  # noqa: E402


def attacks(quick: bool) -> list[tuple[str, list[str]]]:
    seconds = "3" if quick else "8"
    flood = "600" if quick else "3000"
    frames, hellos = ("300", "30") if quick else ("2000", "120")
    return [
        ("silent streams x48", ["silent-streams", "--count", "48", "--seconds", seconds]),
        ("60 MiB calls x40", ["big-calls", "--count", "40", "--mib", "60"]),
        ("JobAnnounce flood", ["announce-flood", "--count", flood, "--identities", "100", "--spec-kib", "300"]),
        ("hostile device", ["device", "--seconds", seconds]),
        ("frame fuzz", ["frame-fuzz", "--frames", frames, "--hellos", hellos, "--batch", "50"]),
        ("dense maps 4 MiB x40", ["dense-maps", "--count", "40", "--mib", "4", "--batch", "4"]),
    ]


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a is not None and b else "     -"


def _p50(report: Report) -> float | None:
    lat = sorted(report.status_latencies)
    return lat[len(lat) // 2] if lat else None


def _row(name: str, b: Report, a: Report, took: float) -> str:
    bp, ap = _p50(b), _p50(a)
    rss = f"{b.peak_rss_mib:12.1f} {a.peak_rss_mib:8.1f} {_ratio(a.peak_rss_mib, b.peak_rss_mib)}"
    p50 = f"{(bp or 0) * 1e3:18.2f} {(ap or 0) * 1e3:7.2f} {_ratio(ap, bp)}"
    top = f"{b.status_max_s * 1e3:11.2f} {a.status_max_s * 1e3:7.2f} {_ratio(a.status_max_s, b.status_max_s)}"
    failures = f"  status failures: {a.status_failures}" if a.status_failures else ""
    return f"{name:<20} {rss}   {p50}   {top}  {took:5.1f} s{failures}"


def _converged(s: Any) -> bool:
    return all(sum(p["state"] == "alive" for p in s.call(i, "peers")) == 2 for i in range(3))


def job_attacks(quick: bool) -> int:
    """The job attacks, each against a fresh 3-daemon swarm training the same job (see the module docstring)."""
    from types import SimpleNamespace
    from typing import cast

    from tests.adversarial.hostile_job import HostileSwarm
    from tests.harness import Daemon, wait_for
    from tests.integration.test_recovery import submit, wait_end, write_spec

    steps = 60 if quick else 100
    base: Report | None = None
    print(f"{'attack':<24} {'RSS MiB':>8} {'ratio':>6} {'status p50 ms':>14} {'max ms':>8} {'job s':>6}  end")
    # (attack, job): the claims attacks train 2048-wide layers on batches of 1024 (a lie about speed shows
    # above the overheads only there), against an honest run of that job; the witness attack two replicas of a
    # smaller MLP (issue 29 item 6), against an honest run of it; the others the small MLP
    for attack, job in (
        ("none", "small"),
        ("path", "small"),
        ("huge", "small"),
        ("nan", "small"),
        ("finite", "small"),
        ("serve-big", "small"),
        ("checkpoint-error", "small"),
        ("bigmem", "small"),
        ("none", "big"),
        ("overclaim-hidden", "big"),
        ("challenge-forge", "big"),
        ("none", "replicas"),
        ("witness", "replicas"),
    ):
        heavy = job == "big"
        if attack == "none":
            base = None
        with tempfile.TemporaryDirectory(prefix="arceus-adv-job-") as tmp:
            spec = write_spec(Path(tmp), steps=steps, interval=20)
            if heavy:
                text = spec.read_text().replace("[784, 64, 32, 10]", "[784, 2048, 2048, 2048, 10]")
                spec.write_text(text.replace("batch_size = 64", "batch_size = 1024"))
            if job == "replicas":
                text = spec.read_text().replace("[training]\n", '[training]\nreplicas = 2\nsync = "every_step"\n')
                spec.write_text(text.replace("[784, 64, 32, 10]", "[784, 64, 10]"))
            outside = Path(tmp) / "outside" / "x.safetensors"
            arg = {"finite": "1e30", "witness": "3"}.get(attack, "100" if heavy else str(outside))
            after = {"finite": steps, "witness": 0, "bigmem": 0}.get(attack, 0 if heavy else 40)
            s = HostileSwarm(Path(tmp) / "swarm", attack, arg, after=after)
            try:
                s.start()
                wait_for(partial(_converged, s), 30, 0.2, "swarm converged")
                hostile = str(s.call(2, "status")["peer_id"])
                owner = cast(Daemon, SimpleNamespace(pid=s.procs[0].pid, state_dir=s.state_dir(0), proc=s.procs[0]))
                began = time.monotonic()
                with Watch(owner) as w:
                    job_id = submit(s, spec)
                    end = wait_end(s, job_id, timeout=300)
                took = time.monotonic() - began
            finally:
                s.close()
            base = base or w.report
            excluded = ",".join(p[:8] for p in end.get("excluded", {}))
            discounted = ",".join(f"{p[:8]}:{f:g}" for p, f in end.get("discounted", {}).items())
            name = f"{attack}{'' if job == 'small' else f' ({job})'}"
            print(
                f"{name:<24} {w.report.peak_rss_mib:8.1f} {_ratio(w.report.peak_rss_mib, base.peak_rss_mib)} "
                f"{(_p50(w.report) or 0) * 1e3:14.2f} {w.report.status_max_s * 1e3:8.2f} {took:6.1f}  "
                f"{end['state']} excluded={excluded or '-'} discounted={discounted or '-'} "
                f"refused={end.get('refused_reports')} escaped={outside.exists()} "
                f"standby={str(end.get('standby'))[:8]} hostile={hostile[:8]}",
                flush=True,
            )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="peak RSS and status latency of a daemon under each attack")
    parser.add_argument("--quick", action="store_true", help="shorter attacks (make bench)")
    parser.add_argument("--jobs", action="store_true", help="the job attacks (a hostile member of a training job)")
    parser.add_argument("--fds", action="store_true", help="silent connections at 1,024 open files (issue 29)")
    parser.add_argument("--fair", action="store_true", help="an announce flood beside two honest jobs (issue 29)")
    parser.add_argument("--market", action="store_true", help="the marketplace attacks (issue 29)")
    args = parser.parse_args()
    if args.jobs:
        return job_attacks(args.quick)
    if args.fds:
        from adversarial_fds import fd_attacks  # bench/adversarial_fds.py, beside this script

        return fd_attacks(args.quick)
    if args.fair:
        from adversarial_fair import fair_attacks  # bench/adversarial_fair.py, beside this script

        return fair_attacks(args.quick)
    if args.market:
        from adversarial_market import market_attacks  # bench/adversarial_market.py, beside this script

        return market_attacks(args.quick)
    with tempfile.TemporaryDirectory(prefix="arceus-adv-") as tmp:
        daemon = start_daemon(Path(tmp), "victim", "--no-auto-join")
        try:
            target = peer_address(daemon)
            print(
                f"{'attack':<20} {'RSS MiB base':>12} {'attack':>8} {'ratio':>6}   "
                f"{'status p50 ms base':>18} {'attack':>7} {'ratio':>6}   {'max ms base':>11} {'attack':>7} "
                f"{'ratio':>6}  attack took  outcome"
            )
            for name, argv in attacks(args.quick):
                quiet = 3.0 if args.quick else 6.0
                with Watch(daemon) as before:  # the no-attack baseline, right before the attack
                    time.sleep(quiet)
                began = time.monotonic()
                with Watch(daemon) as during:
                    result = hostile(argv[0], target, *argv[1:], timeout=600)
                took = time.monotonic() - began
                if during.report.exited:
                    print(f"{name}: the daemon exited")
                    return 1
                answers = result.get("answers") or result.get("codes") or result.get("outcomes") or {}
                print(_row(name, before.report, during.report, took) + f"  {answers}", flush=True)
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
