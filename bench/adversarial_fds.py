"""Issue 29's descriptor flood beside a no-attack run, and what the peer port's gate costs a call.

Usage: ``python bench/adversarial.py --fds [--quick]`` (or this file directly).

Per scenario a fresh victim daemon (open files 1,024 soft and hard, ``lan`` preset, loopback) and a real peer are
started; for the same window, with no attack or while ``tests/adversarial/fd_flood.py`` holds silent connections
(the HTTP/2 preface, then nothing) from processes and loopback hosts of its own, the victim is watched every
0.1 s (peak RSS and descriptors from /proc, ``status`` latency over the control socket), the real peer's view of
it is sampled, and 2 s in a new peer starts and says hello (the seconds from its start until each sees the
other alive).
Printed per scenario: those figures, the outcome, and the gate's counters.

Then the gate's cost, measured in this run: the round trip of a small unary call and the rate of 4 MiB calls
through a transport with the gate and one without (client and server in this process).
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.adversarial.fd_flood import launch, result  # noqa: E402
from tests.adversarial.victim import PeerViews, Report, Watch, peer_address  # noqa: E402
from tests.harness import Daemon, wait_for  # noqa: E402

NOFILE = 1024


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def scenarios() -> list[tuple[str, list[tuple[int, list[str]]]]]:
    return [
        ("none", []),
        ("1,100 silent, 1 host", [(1100, ["127.0.0.2"])]),
        ("1,124 silent, 4 x 8 hosts", [(281, [f"127.0.{p}.{h}" for h in range(1, 9)]) for p in range(1, 5)]),
    ]


def _start(root: Path, name: str, *extra: str, limited: bool = False) -> Daemon:
    args = ["--preset", "lan", "--host", "127.0.0.1", "--port", "0", "--no-mdns", *extra]
    return Daemon(root / name, args, preexec_fn=_limit_files if limited else None).start()


def _p50(report: Report) -> float:
    lat = sorted(report.status_latencies)
    return lat[len(lat) // 2] if lat else 0.0


def run_scenario(root: Path, floods: list[tuple[int, list[str]]], seconds: float) -> dict[str, Any]:
    victim = _start(root, "victim", limited=True)
    helpers: list[Daemon] = []
    try:
        target = peer_address(victim)
        victim_id = victim.status()["peer_id"]
        peer = _start(root, "peer", "--peer", target)
        helpers.append(peer)
        wait_for(lambda: any(p["state"] == "alive" for p in peer.call("peers")), 30, 0.1, "peer sees victim")
        hello_s: float | None = None
        with Watch(victim) as watch, PeerViews(peer, victim_id) as views:
            began = time.monotonic()
            attackers = [launch(target, count, sources, seconds) for count, sources in floods]
            time.sleep(2.0)
            newcomer = _start(root, "newcomer", "--peer", target)
            helpers.append(newcomer)
            joined = time.monotonic()  # the newcomer is up; from here its hello and the victim's answer
            try:
                wait_for(
                    lambda: any(p["peer_id"] == victim_id and p["state"] == "alive" for p in newcomer.call("peers")),
                    20,
                    0.1,
                )
                wait_for(lambda: sum(p["state"] == "alive" for p in victim.call("peers")) == 2, 20, 0.1)
                hello_s = time.monotonic() - joined
            except (AssertionError, OSError):
                hello_s = None
            floods_seen = [result(a, seconds + 60) for a in attackers]
            time.sleep(max(0.0, seconds - (time.monotonic() - began)))
            gate = victim.status()["transport"].get("gate", {}) if victim.proc and victim.proc.poll() is None else {}
        return {
            "report": watch.report,
            "views": views.states,
            "hello_s": hello_s,
            "gate": gate,
            "floods": floods_seen,
            "exited": watch.report.exited,
        }
    finally:
        for d in helpers:
            d.stop()
        victim.stop()


def fd_attacks(quick: bool) -> int:
    seconds = 6.0 if quick else 12.0
    print(f"open files {NOFILE} (soft and hard), {seconds:.0f} s per scenario, lan preset")
    print(
        f"{'scenario':<26} {'RSS MiB':>8} {'fds':>5} {'status p50 ms':>14} {'max ms':>7} {'hello s':>8} "
        f"{'peer saw':<18} outcome; gate"
    )
    for name, floods in scenarios():
        with tempfile.TemporaryDirectory(prefix="arceus-adv-fds-") as tmp:
            out = run_scenario(Path(tmp), floods, seconds)
        r: Report = out["report"]
        seen = sorted(set(out["views"]))
        hello = f"{out['hello_s']:8.1f}" if out["hello_s"] is not None else "  failed"
        gate = {k: v for k, v in out["gate"].items() if k not in ("max_connections", "max_per_source")}
        print(
            f"{name:<26} {r.peak_rss_mib:8.1f} {r.max_fds:5d} {_p50(r) * 1e3:14.2f} {r.status_max_s * 1e3:7.1f} "
            f"{hello} {','.join(seen):<18} {'EXITED' if out['exited'] else 'ran on'}; {gate}",
            flush=True,
        )
    gate_cost()
    return 0


def gate_cost(calls: int = 500, big: int = 40) -> None:
    """Small-call round trip and 4 MiB call rate through the gate and without it, in this process."""
    import trio

    from arceusd.base.identity import Identity
    from arceusd.transport import Stream, open_transport
    from arceusd.transport.gate_core import limits_for

    async def echo(request: bytes) -> bytes:
        return request[:16]

    async def no_streams(_stream: Stream) -> None:
        return None

    async def measure(gated: bool) -> tuple[float, float]:
        limits = limits_for(NOFILE) if gated else None
        async with (
            open_transport(
                Identity.generate(), "127.0.0.1", 0, unary_handler=echo, stream_handler=no_streams, gate=limits
            ) as server,
            open_transport(
                Identity.generate(), "127.0.0.1", 0, unary_handler=echo, stream_handler=no_streams
            ) as client,
        ):
            await client.call(server.address, b"hello", 5.0)
            began = time.monotonic()
            for _ in range(calls):
                await client.call(server.address, b"p" * 200, 5.0)
            small = (time.monotonic() - began) / calls
            payload = b"x" * (4 << 20)
            began = time.monotonic()
            for _ in range(big):
                await client.call(server.address, payload, 30.0)
            rate = big * len(payload) / (time.monotonic() - began)
            return small, rate

    rows = [(gated, trio.run(measure, gated)) for gated in (False, True, False, True)]
    print("\ngate cost (client and server in one process; two runs each, alternating)")
    for gated, (small, rate) in rows:
        print(
            f"{'gated' if gated else 'plain':<6} small call round trip {small * 1e6:7.0f} us   "
            f"4 MiB calls {rate / 1e6:6.0f} MB/s"
        )


if __name__ == "__main__":
    sys.exit(fd_attacks("--quick" in sys.argv))
