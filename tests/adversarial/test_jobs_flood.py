"""Issue #19 item 6: 3,000 JobAnnounce messages once grew a daemon to 2 GB, and job ids with ``../`` and
terminal escapes were stored (a job's folder is named after its id). Now announcements are validated at the edge
(ids exactly 32 lowercase hex, a spec that reproduces its hash), rate-limited per sender and bounded per owner
and in total, oldest evicted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arceusd.announce_guard import AnnounceLimits
from tests.adversarial.victim import Watch, assert_healthy, baseline, hostile, peer_address, start_daemon
from tests.harness import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_announce_flood_is_bounded_and_hostile_ids_never_stored(tmp_path: Path) -> None:
    d0 = start_daemon(tmp_path, "d0", "--no-auto-join")
    try:
        target = peer_address(d0)
        base = baseline(d0)
        with Watch(d0) as watch:
            # 3,000 announcements of a valid spec padded to 300 KiB (unbounded, ~900 MB kept), from 100 keys.
            result = hostile("announce-flood", target, "--count", "3000", "--identities", "100",
                             "--spec-kib", "300", timeout=200)  # fmt: skip
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
