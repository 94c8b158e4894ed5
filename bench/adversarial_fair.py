"""Issue 29 (c) bench: an announce flood from many keys against a daemon that sees two honest jobs, beside the
same daemons with no flood.

Used by ``python bench/adversarial.py --fair [--quick]``. Three daemons on loopback (``local`` preset, their own
processes): two owners each submit a job that waits for members (announced, never trained), the victim sees
both. Then the victim is watched for a quiet window (the no-attack run), and again while
``tests/adversarial/hostile_peer.py announce-flood`` sends 3,000 announcements (600 with ``--quick``) from 100
keys that only said hello. Printed per run: the victim's peak RSS, ``status`` latency (median and max) and the
outcome: how many of the honest jobs ``arceusd market`` lists, how many jobs it tracks and how many
announcements were evicted.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tests.adversarial.victim import Report, Watch, hostile, peer_address, start_daemon
from tests.harness import ROOT, Daemon, run_cli, wait_for


def _p50(report: Report) -> float:
    lat = sorted(report.status_latencies)
    return lat[len(lat) // 2] if lat else 0.0


def _outcome(victim: Daemon, honest: list[str]) -> str:
    listed = {row["job_id"] for row in victim.cli_json("market")["jobs"]}
    status = victim.status()
    evicted = status["announcements"]["dropped"].get("announce_evicted", 0)
    kept = len(set(honest) & listed)
    return f"honest jobs listed {kept}/{len(honest)}, tracked {len(status['jobs'])}, evicted {evicted}"


def fair_attacks(quick: bool) -> int:
    count = "600" if quick else "3000"
    with tempfile.TemporaryDirectory(prefix="arceus-adv-fair-") as tmp:
        victim = start_daemon(Path(tmp), "victim", "--no-auto-join")
        owners = [
            start_daemon(Path(tmp), f"owner{i}", "--no-auto-join", "--peer", peer_address(victim)) for i in (1, 2)
        ]
        try:
            honest = []
            for owner in owners:  # the example spec reads the repository's own data folder (data/mnist)
                done = run_cli(owner.state_dir, "submit", str(ROOT / "examples" / "mnist-mlp.toml"), "--members", "3")
                assert done.returncode == 0, done.stderr
                honest.append(done.stdout.split()[2])
            wait_for(lambda: set(honest) <= {j["job_id"] for j in victim.status()["jobs"]}, 30, 0.2, "jobs seen")
            print(f"{'run':<22} {'RSS MiB':>8} {'status p50 ms':>14} {'max ms':>8} {'took s':>7}  outcome")
            for name, argv in (("no flood", None), (f"flood {count} / 100 keys", count)):
                began = time.monotonic()
                with Watch(victim) as w:
                    if argv is None:
                        time.sleep(3.0 if quick else 6.0)
                    else:
                        hostile(
                            "announce-flood",
                            peer_address(victim),
                            "--count",
                            argv,
                            "--identities",
                            "100",
                            "--spec-kib",
                            "16",
                            timeout=600,
                        )
                took = time.monotonic() - began
                r = w.report
                print(
                    f"{name:<22} {r.peak_rss_mib:8.1f} {_p50(r) * 1e3:14.2f} {r.status_max_s * 1e3:8.2f} "
                    f"{took:7.1f}  {_outcome(victim, honest)}",
                    flush=True,
                )
        finally:
            for d in (*owners, victim):
                d.stop()
    return 0
