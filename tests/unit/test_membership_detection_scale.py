"""Failure detection at scale, in the seeded simulator (issue 33): 100 members under the ``lan`` preset, 40
crashes two seconds apart (the case ``bench/membership_sim.py`` prints). The bounds are the ones that bench
reports against: SWIM's expected first detection and memberlist's full-detection formula. A core that slows its
probes (the first-contact stretch held every new member's probe for eight intervals: first detection 14.5 s, 9x
SWIM) or wastes its gossip fails here, and so does a slow tail: with members probing in lockstep passes one crash
waited 11.5 s for its first probe (full detection p99 2.06x memberlist), and with round-robin probing alone the
slowest of the 40 waited an exponential time, 4-6 s (p99 1.2-1.6x on four seeds); the ring probe keeps it at 1.13x. The
simulator is deterministic for a seed, so the figures are the same on every machine."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

from arceusd.membership import lan

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_membership_sim", ROOT / "bench" / "membership_sim.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_hundred_members_detect_a_crash_near_swim_and_memberlist() -> None:
    bench = _bench()
    cfg = lan()
    n = 100
    figures = bench.detection(n, 40, cfg, seed=n)
    swim_first = bench.SWIM_FIRST * cfg.probe_interval
    memberlist_full = swim_first + cfg.suspicion_mult * math.log10(n) * cfg.probe_interval
    assert figures["missing"] == 0 and figures["false_dead"] == 0, figures
    assert figures["first_p50"] <= 1.5 * swim_first, figures
    assert figures["full_p50"] <= 1.2 * memberlist_full, figures
    # 1.13x on this seed (1.08-1.18x on seeds 1-8); the ring's wait is at most two intervals, so the slowest crash
    # is first suspected within 3 s and dead everywhere about 8.5 s later: 11.5 s = 1.2x is the worst it can be
    assert figures["full_p99"] <= 1.25 * memberlist_full, figures
