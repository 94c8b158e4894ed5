"""A fuzz of stream frames after the handshake (>= 10,000 mutated frames, deterministic from a seed, sent in
batches of 500 per authenticated stream) against the process that reads a peer's frames (a stage worker's
receive and decode, :mod:`tests.adversarial.frame_sink`), plus mutated handshakes and frame batches against a
real daemon's stream endpoint. Sealed mutations pass the MAC (a member holds its session keys) and reach the
decoder; raw ones (one in 250) fail the MAC or the length checks and cut their stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adversarial.victim import (
    Report,
    Watch,
    assert_healthy,
    baseline,
    hostile,
    peer_address,
    raw_call,
    start_daemon,
)
from tests.harness import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_ten_thousand_mutated_frames(tmp_path: Path) -> None:
    sink = subprocess.Popen(
        [sys.executable, "-m", "tests.adversarial.frame_sink"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    d0 = start_daemon(tmp_path, "d0")
    try:
        assert sink.stdout is not None
        sink_address = f"127.0.0.1:{int(sink.stdout.readline())}"
        target = peer_address(d0)
        base = baseline(d0)
        with Watch(None, pids=(sink.pid,)) as sink_base:
            pass
        with Watch(d0) as watch, Watch(None, pids=(sink.pid,)) as sink_watch:
            fuzz = hostile(
                "frame-fuzz", sink_address, "--frames", "10000", "--hellos", "60", "--seed", "19", timeout=240
            )
            at_daemon = hostile(
                "frame-fuzz",
                target,
                "--frames",
                "1000",
                "--hellos",
                "120",
                "--batch",
                "50",
                "--seed",
                "20",
                timeout=240,
            )
        assert fuzz["frames"] >= 10_000, fuzz
        counts = json.loads(raw_call(sink_address, b"stats", timeout=5))
        assert counts["frames"] >= 9_000, counts  # the rest were cut with their stream (raw mutations)
        assert not [k for k in counts if k.startswith("unexpected:")], counts  # only counted refusals
        assert counts.get("decoded", 0) > 0 and counts.get("stream:bad_mac", 0) > 0, counts
        assert sink.poll() is None, "the receiving process died"
        assert sum(at_daemon["hellos"].values()) == 120, at_daemon
        assert_healthy(watch.report, base, rss_extra_mib=100)
        assert not sink_watch.report.exited
        assert sink_watch.report.peak_rss_mib < _peak(sink_base.report) + 200, sink_watch.report.summary()
        rejected = d0.status()["transport"]["rejected"]
        assert sum(rejected.values()) > 0, rejected  # the daemon counted what it refused
    finally:
        sink.kill()
        sink.wait(timeout=10)
        assert d0.stop() == 0


def _peak(report: Report) -> float:
    return report.peak_rss_mib
