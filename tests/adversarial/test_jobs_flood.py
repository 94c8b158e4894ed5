"""Issue #19 item 6: 3,000 JobAnnounce messages once grew a daemon to 2 GB, and job ids with ``../`` and
terminal escapes were stored (a job's folder is named after its id). Now announcements are validated at the edge
(ids exactly 32 lowercase hex, a spec that reproduces its hash), rate-limited per sender and bounded per owner
and in total, evicted by fair shares (issue 29: owners in our membership before keys that only said hello, then
by host and key), so a flood from many keys leaves every honest job in ``arceusd market``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arceusd.network.announce_guard import AnnounceLimits
from tests.adversarial.victim import Watch, assert_healthy, baseline, hostile, peer_address, start_daemon
from tests.harness import ROOT, run_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_announce_flood_is_bounded_and_hostile_ids_never_stored(tmp_path: Path) -> None:
    d0 = start_daemon(tmp_path, "d0", "--no-auto-join")
    try:
        target = peer_address(d0)
        base = baseline(d0)
        with Watch(d0) as watch:
            # 3,000 announcements of a valid spec padded to 300 KiB (unbounded, ~900 MB kept), from 100 keys.
            result = hostile(
                "announce-flood", target, "--count", "3000", "--identities", "100", "--spec-kib", "300", timeout=200
            )
        answers = result["answers"]
        assert result["identities"] == 100, result
        assert answers.get("accepted", 0) > 0, answers
        assert answers.get("refused:bad_job_id", 0) > 0, answers
        assert_healthy(watch.report, base, rss_extra_mib=150)

        limits = AnnounceLimits()
        status = d0.status()
        jobs = status["jobs"]
        assert len(jobs) <= limits.total, len(jobs)
        assert all(re.fullmatch(r"[0-9a-f]{32}", j["job_id"]) for j in jobs), [j["job_id"] for j in jobs]
        dropped = status["announcements"]["dropped"]
        assert dropped.get("bad_job_id", 0) >= 1 and dropped.get("announce_evicted", 0) >= 1, dropped
        assert status["announcements"]["tracked"] <= limits.total
        # Nothing named by the attacker became a path, inside the state folder or out of it.
        assert not Path("/tmp/pwned-by-announce").exists()
        assert not any("pwned" in str(p) for p in d0.state_dir.rglob("*"))
        listing = run_cli(d0.state_dir, "jobs")
        assert listing.returncode == 0 and "\x1b" not in listing.stdout
    finally:
        assert d0.stop() == 0


def test_announce_flood_leaves_every_honest_job_in_the_market(tmp_path: Path) -> None:
    d0 = start_daemon(tmp_path, "d0", "--no-auto-join")
    owners = [start_daemon(tmp_path, f"d{i}", "--no-auto-join", "--peer", peer_address(d0)) for i in (1, 2)]
    try:
        honest = []
        for owner in owners:  # jobs that wait for members (none come): announced, never trained
            submitted = run_cli(owner.state_dir, "submit", str(ROOT / "examples" / "mnist-mlp.toml"), "--members", "3")
            assert submitted.returncode == 0, submitted.stderr
            honest.append(submitted.stdout.split()[2])
        wait_for(lambda: set(honest) <= {j["job_id"] for j in d0.status()["jobs"]}, 30, 0.2, "d0 sees the jobs")
        base = baseline(d0)
        with Watch(d0) as watch:
            result = hostile(
                "announce-flood",
                peer_address(d0),
                "--count",
                "3000",
                "--identities",
                "100",
                "--spec-kib",
                "16",
                timeout=200,
            )
        assert result["identities"] == 100 and result["answers"].get("accepted", 0) > 0, result
        assert_healthy(watch.report, base, rss_extra_mib=150)
        status = d0.status()
        assert len(status["jobs"]) <= AnnounceLimits().total
        assert status["announcements"]["dropped"].get("announce_evicted", 0) >= 1, status["announcements"]
        market = d0.cli_json("market")
        listed = {row["job_id"] for row in market["jobs"]}
        assert set(honest) <= listed, (honest, len(listed))
        shown = run_cli(d0.state_dir, "market")
        assert shown.returncode == 0 and all(job[:8] in shown.stdout for job in honest), shown.stdout[-2000:]
    finally:
        for d in (*owners, d0):
            assert d.stop() == 0
