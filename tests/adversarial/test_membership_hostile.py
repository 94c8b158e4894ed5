"""Issue #19 items 2 and 7 against real daemons: a hostile peer in its own process (tests/adversarial/
hostile_member.py, its own identity key, the real transport and protocol) sends forged-meaning membership
updates to one of two daemons (``local`` preset, static seeds). Each test asserts that no daemon exits, the
real peer stays alive in both views, ``status`` answers within 1 s with memory, threads and fds bounded, and the
drops are counted under ``dropped.membership`` in ``status --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arceusd.membership.config import local
from arceusd.membership.guard import Drop
from tests.adversarial.victim import Watch, assert_healthy, baseline, peer_address
from tests.harness import ROOT, Daemon, run_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def hostile_member(attack: str, target: str, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.adversarial.hostile_member", attack, "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, f"hostile member failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def views(d: Daemon) -> dict[str, str]:
    return {p["peer_id"]: p["state"] for p in d.call("peers")}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    common = ["--host", "127.0.0.1", "--port", "0", "--no-mdns", "--preset", "local"]
    d0 = Daemon(tmp_path / "d0", common).start()
    d1 = Daemon(tmp_path / "d1", [*common, "--peer", peer_address(d0)]).start()
    try:
        ids = (d0.status()["peer_id"], d1.status()["peer_id"])
        wait_for(lambda: views(d0).get(ids[1]) == "alive" and views(d1).get(ids[0]) == "alive", 20, 0.1, "pair")
        yield d0, d1
    finally:
        assert d1.stop() == 0
        assert d0.stop() == 0


def _both_alive(d0: Daemon, d1: Daemon) -> None:
    id0, id1 = d0.status()["peer_id"], d1.status()["peer_id"]
    wait_for(lambda: views(d0).get(id1) == "alive" and views(d1).get(id0) == "alive", 5, 0.1, "real peers alive")


def test_overflowing_claims_are_dropped_and_refutation_stays_small(pair: tuple[Daemon, Daemon]) -> None:
    d0, d1 = pair
    base = baseline(d0)
    with Watch(d0) as watch:
        result = hostile_member("overflow", peer_address(d0), "--victim", d1.status()["peer_id"])
    assert result["target"] == d0.status()["peer_id"], result
    assert_healthy(watch.report, base, rss_extra_mib=100)
    _both_alive(d0, d1)
    status = d0.status()
    assert status["membership"]["incarnation"] < 10, status["membership"]  # never pushed toward 2**64
    assert d1.status()["membership"]["incarnation"] < 10
    dropped = status["dropped"]["membership"]
    for reason in (Drop.ORIGIN_NOT_MEMBER, Drop.INCARNATION_RANGE, Drop.INCARNATION_WINDOW):
        assert dropped.get(reason.value, 0) >= 1, (reason, dropped)
    cli = run_cli(d0.state_dir, "status", "--json")
    assert cli.returncode == 0 and "dropped" in json.loads(cli.stdout), cli.stderr


def test_thousands_of_fake_members_stay_out_of_the_view(pair: tuple[Daemon, Daemon]) -> None:
    d0, d1 = pair
    base = baseline(d0)
    with Watch(d0) as watch:
        result = hostile_member("fake-members", peer_address(d0), "--count", "2000", "--rounds", "2", timeout=200)
    assert result["answers"].get("answered", 0) >= 1, result  # the push/pulls were taken and answered
    assert_healthy(watch.report, base, rss_extra_mib=100)
    _both_alive(d0, d1)
    real = {d0.status()["peer_id"], d1.status()["peer_id"], result["attacker"]}
    for d in (d0, d1):  # none of the 2,000 entered either view (they never answered for themselves)
        assert set(views(d)) <= real, len(views(d))
    dropped = d0.status()["dropped"]["membership"]
    # The bound is on entries pending at once: a fake address's hello fails fast (refused), freeing its slot for
    # the next, so a round may take a few waves of max_pending_per_source (3,744 of 4,000 dropped here, where an
    # exact 2 x (2,000 - 64) was asserted before). Most must still be refused at the bound, none entered a view.
    pending_bound = local().max_pending_per_source
    assert dropped.get(Drop.PENDING_PER_SOURCE.value, 0) >= 2 * 2000 - 8 * pending_bound, dropped


def test_a_gossip_flood_is_rate_limited_and_counted(pair: tuple[Daemon, Daemon]) -> None:
    d0, d1 = pair
    base = baseline(d0)
    with Watch(d0) as watch:
        result = hostile_member("flood", peer_address(d0), "--count", "3000", timeout=200)
    assert sum(result["answers"].values()) == 3000, result
    assert_healthy(watch.report, base, rss_extra_mib=100)
    _both_alive(d0, d1)
    assert d0.status()["dropped"]["membership"].get("rate_limited", 0) >= 1, d0.status()["dropped"]
