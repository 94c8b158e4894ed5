"""Replay windows: accept-once within the window, freshness, bounded memory that fails closed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.replay import ReplayGuard

K = ("a" * 32, 1, 0)
NOW = 1_000_000


def _reason(guard: ReplayGuard, key: tuple[str, int, int], seq: int, ts: int = NOW, now: int = NOW) -> str:
    with pytest.raises(RemoteProtocolError) as exc:
        guard.accept(key, seq, ts, now)
    return exc.value.reason


def test_accept_once_and_reorder_within_window() -> None:
    g = ReplayGuard(window=64)
    for s in (10, 12, 11, 9, 40):
        g.accept(K, s, NOW, NOW)
    for s in (10, 12, 11, 9, 40):
        assert _reason(g, K, s) == "replayed"
    g.accept(K, 39, NOW, NOW)  # unseen, inside the window
    assert _reason(g, K, 40 - 64) == "sequence_too_old"
    g.accept(K, 40 - 63, NOW, NOW)  # the oldest number still inside
    g.accept(K, 10_000, NOW, NOW)  # a big jump slides the whole window
    assert _reason(g, K, 10_000 - 64) == "sequence_too_old"


def test_keys_are_independent() -> None:
    g = ReplayGuard()
    g.accept(K, 5, NOW, NOW)
    g.accept((K[0], 2, 0), 5, NOW, NOW)  # new boot
    g.accept((K[0], 1, 1), 5, NOW, NOW)  # other stream
    g.accept(("b" * 32, 1, 0), 5, NOW, NOW)  # other sender
    assert len(g) == 4


def test_freshness() -> None:
    g = ReplayGuard(skew_ms=1000)
    assert _reason(g, K, 1, ts=NOW - 1001) == "stale_timestamp"
    assert _reason(g, K, 1, ts=NOW + 1001) == "future_timestamp"
    g.accept(K, 1, NOW - 1000, NOW)
    g.accept(K, 2, NOW + 1000, NOW)


def test_rejection_records_nothing() -> None:
    g = ReplayGuard(skew_ms=10)
    _reason(g, K, 1, ts=NOW - 100)
    g.accept(K, 1, NOW, NOW)  # the stale attempt did not consume seq 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=200), st.integers(1, 64))
def test_matches_reference_model(seqs: list[int], window: int) -> None:
    """Against a set-based reference: accept iff unseen and newer than top - window."""
    g = ReplayGuard(window=window)
    seen: set[int] = set()
    top = -1
    for s in seqs:
        expect_ok = s not in seen and (top < 0 or s > top - window)
        try:
            g.accept(K, s, NOW, NOW)
            ok = True
        except RemoteProtocolError:
            ok = False
        assert ok == expect_ok, (s, top)
        if ok:
            seen.add(s)
            top = max(top, s)


def test_eviction_fails_closed_via_tombstone() -> None:
    g = ReplayGuard(max_keys=2, skew_ms=1000)
    old = ("a" * 32, 1, 0)  # a previous boot of peer a
    g.accept(old, 50, NOW, NOW)
    g.accept(("b" * 32, 1, 0), 1, NOW, NOW)
    g.accept(("c" * 32, 1, 0), 1, NOW, NOW)  # evicts `old`
    assert len(g) == 2 and g.tombstones == 1
    for s in (50, 49, 1):  # what the evicted window had seen or could have seen: still refused
        assert _reason(g, old, s) in ("replayed", "sequence_too_old")
    g.accept(old, 51, NOW, NOW)  # newer numbers go on


def test_tombstones_expire_after_everything_is_stale() -> None:
    g = ReplayGuard(max_keys=1, skew_ms=1000)
    g.accept(K, 5, NOW, NOW)
    g.accept(("b" * 32, 1, 0), 1, NOW, NOW)
    assert g.tombstones == 1
    later = NOW + 2001
    g.accept(("c" * 32, 1, 0), 1, later, later)
    assert g.tombstones == 1  # K's expired, b's is new
    # Replaying K's old message now fails on freshness regardless of state.
    assert _reason(g, K, 5, ts=NOW, now=later) == "stale_timestamp"


def test_tombstone_overflow_closes_new_keys_until_safe() -> None:
    g = ReplayGuard(max_keys=1, max_tombstones=1, skew_ms=1000)
    g.accept(K, 5, NOW, NOW)
    g.accept(("b" * 32, 1, 0), 1, NOW, NOW)  # K -> tombstone
    g.accept(("c" * 32, 1, 0), 1, NOW, NOW)  # b -> tombstone, K's tombstone dropped
    assert g.closed_until_ms == NOW + 1000
    assert _reason(g, K, 5, ts=NOW + 1000, now=NOW + 1000) == "evicted_key"
    assert _reason(g, ("d" * 32, 1, 0), 1, ts=NOW, now=NOW) == "evicted_key"
    g.accept(("d" * 32, 1, 0), 1, NOW + 1001, NOW + 1001)


def test_memory_is_bounded() -> None:
    rng = random.Random(7)
    g = ReplayGuard(max_keys=100, max_tombstones=200)
    for i in range(5000):
        key = (f"{rng.randrange(2**128):032x}", 1, 0)
        try:
            g.accept(key, i, NOW + i, NOW + i)
        except RemoteProtocolError as exc:
            assert exc.reason == "evicted_key"
        assert len(g) <= 100 and g.tombstones <= 200


def test_bad_config() -> None:
    with pytest.raises(LocalProtocolError):
        ReplayGuard(window=0)
