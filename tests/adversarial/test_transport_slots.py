"""Issue #19 item 8: 48 gRPC streams that never send a byte once took all 40 server slots, and joins, reports
and starts (unary calls) failed while they lasted. Now streams have slots of their own, a source holds at most
8 handshakes, and a handshake that does not progress is cut after 2 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.adversarial.victim import (
    Watch,
    assert_healthy,
    baseline,
    finish,
    hostile_background,
    peer_address,
    raw_call,
    start_daemon,
)
from tests.harness import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_silent_streams_leave_calls_and_membership_working(tmp_path: Path) -> None:
    d0 = start_daemon(tmp_path, "d0")
    try:
        target = peer_address(d0)
        d1 = start_daemon(tmp_path, "d1", "--peer", target)
        try:
            wait_for(lambda: any(p["state"] == "alive" for p in d1.call("peers")), 20, 0.1, "d1 sees d0")
            base = baseline(d0)
            attack = hostile_background("silent-streams", target, "--count", "48", "--seconds", "8")
            with Watch(d0) as watch:
                time.sleep(1.0)
                answered = 0
                for _ in range(20):  # the calls joins, reports and starts use: each answered within 1 s
                    began = time.monotonic()
                    assert raw_call(target, b"", timeout=1.0) == b""
                    assert time.monotonic() - began < 1.0
                    answered += 1
                    time.sleep(0.2)
                result = finish(attack)
                views = d1.call("peers")
            assert answered == 20
            assert_healthy(watch.report, base, rss_extra_mib=100)
            assert all(p["state"] == "alive" for p in views), views  # membership (unary pings) held throughout
            # The attacker kept 48 streams asked for; the server refused all but a handful and cut the rest
            # within its accept timeout (2 s, plus scheduling slack).
            assert result["ended"].get("RESOURCE_EXHAUSTED", 0) > 48, result
            assert result["longest_s"] < 4.0, result
            transport = d0.status()["transport"]
            assert transport["rejected"].get("host_handshakes_full", 0) > 0, transport
            assert transport["rejected"].get("handshake_timeout", 0) > 0, transport
            wait_for(lambda: d0.status()["transport"]["streams"] == 0, 5, 0.1, "stream slots back")
        finally:
            d1.stop()
    finally:
        assert d0.stop() == 0
