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

``--jobs`` measures the job attacks instead (``bench/adversarial_jobs.py``): per attack a fresh swarm on loopback
trains a job with one hostile member (``tests/adversarial/hostile_job.py``, a real daemon whose reports, shards,
offers or witnesses lie; items 1, 3, 4 and 5 of issue 19, and issue 29's 1e30 shard, a shard served as 16 GiB,
every checkpoint answered with an error, an 8 TiB offer, a 2^50-byte offer, a member offering 100x its speed
with honest reports, covering reports or forged speed challenges, one napping and blaming its neighbour, and a
made-up witness with two replicas: beside the leader, at a place the leader does not hold, and with DiLoCo in
the second and in the first replica), beside the same job with an honest member: the owner's peak RSS and
``status`` latency over the whole job, the job's wall time, its end, and pass/fail. ``--only NAME`` runs the rows
whose name holds NAME (and their job's honest run).

``--secrets`` measures what another local user and a ledger forger can do (``bench/adversarial_secrets.py``): the
dashboard's token looked for in every process's command line and environment while ``arceusd dashboard --open``
runs (beside a control process that holds it), and each forgery of an owner's ledger against ``verify-ledger``,
``bill`` and a daemon started on it (beside the honest ledger).

``--market`` measures issue 29's marketplace attacks beside their no-attack runs (``bench/adversarial_market.py``):
what a member offering 1,000 times its speed earns against an honest member, and when members leave an owner that
withholds their receipts or prices them at $0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description="peak RSS and status latency of a daemon under each attack")
    parser.add_argument("--quick", action="store_true", help="shorter attacks (make bench)")
    parser.add_argument("--jobs", action="store_true", help="the job attacks (a hostile member of a training job)")
    parser.add_argument("--fds", action="store_true", help="silent connections at 1,024 open files (issue 29)")
    parser.add_argument("--fair", action="store_true", help="an announce flood beside two honest jobs (issue 29)")
    parser.add_argument("--market", action="store_true", help="the marketplace attacks (issue 29)")
    parser.add_argument("--secrets", action="store_true", help="the dashboard token and ledger forgeries (issue 29)")
    parser.add_argument("--only", default="", metavar="NAME", help="with --jobs: the rows whose name holds NAME")
    args = parser.parse_args()
    if args.jobs:
        from adversarial_jobs import job_attacks  # bench/adversarial_jobs.py, beside this script

        return job_attacks(args.quick, args.only)
    if args.secrets:
        from adversarial_secrets import secret_attacks  # bench/adversarial_secrets.py, beside this script

        return secret_attacks(args.quick)
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
