"""Adversarial bench: what each attack of issue #19 costs a real daemon, against the same daemon with no attack.

Usage: ``python bench/adversarial.py [--quick]``

One daemon (``local`` preset, loopback, its own process) is started once. For each attack, the daemon is first
watched for a quiet window (the no-attack baseline, right before), then while the attack runs from its own process
(``tests/adversarial/hostile_peer.py``: its own key, the real protocol). Watching samples the daemon every
0.1 s: RSS from /proc, and the latency of ``status`` over the control socket. Printed per attack: peak RSS and
status latency (median and max) without and with the attack, and the ratios with/without measured in this
run. Attacks: 48 silent streams (item 8), 40 unauthenticated 60 MiB calls (item 9), a JobAnnounce flood of
300 KiB specs from 100 keys (item 6), a member with a hostile device string (item 10), mutated handshakes and
stream frames.
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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arceus-adv-") as tmp:
        daemon = start_daemon(Path(tmp), "victim", "--no-auto-join")
        try:
            target = peer_address(daemon)
            print(f"{'attack':<20} {'RSS MiB base':>12} {'attack':>8} {'ratio':>6}   "
                  f"{'status p50 ms base':>18} {'attack':>7} {'ratio':>6}   {'max ms base':>11} {'attack':>7} "
                  f"{'ratio':>6}  attack took")  # fmt: skip
            for name, argv in attacks(args.quick):
                quiet = 3.0 if args.quick else 6.0
                with Watch(daemon) as before:  # the no-attack baseline, right before the attack
                    time.sleep(quiet)
                began = time.monotonic()
                with Watch(daemon) as during:
                    hostile(argv[0], target, *argv[1:], timeout=600)
                took = time.monotonic() - began
                if during.report.exited:
                    print(f"{name}: the daemon exited")
                    return 1
                print(_row(name, before.report, during.report, took))
        finally:
            daemon.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
