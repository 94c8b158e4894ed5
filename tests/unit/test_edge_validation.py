"""Unit tests of the edge checks: remote-string escaping, JobAnnounce validation, and the announce guard."""

from __future__ import annotations

import hashlib

from arceusd.base.text_safety import safe_text, safe_tree
from arceusd.network.announce_guard import AnnounceGuard, AnnounceLimits
from protocol.messages import JobAnnounce

OWNER = "ab" * 16


def announce(job_id: str, owner: str = OWNER, spec: bytes = b"{}", hash_len: int = 32) -> JobAnnounce:
    return JobAnnounce(job_id, owner, hashlib.sha256(spec).digest()[:hash_len], spec)


def test_safe_text_escapes_terminal_controls_and_bounds_length() -> None:
    hostile = "linux\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil\r\nx"
    out = safe_text(hostile)
    assert all(ord(c) >= 0x20 and not 0x7F <= ord(c) <= 0x9F for c in out)
    assert "\\x1b]0;pwned\\x07" in out and "\\u202e" in out and "\\x9b" in out and "\\x0d\\x0a" in out
    assert safe_text("laptop, 8 cores, 16 GiB, é") == "laptop, 8 cores, 16 GiB, é"
    assert len(safe_text("a" * 10_000)) == 512
    tree = safe_tree({"peers": [{"device": "\x1b[31mred", "rtt_ms": 1.5}], "\x1bkey": None})
    assert tree == {"peers": [{"device": "\\x1b[31mred", "rtt_ms": 1.5}], "\\x1bkey": None}


def test_announce_ids_must_be_exact_hex() -> None:
    guard = AnnounceGuard()
    good = "0123456789abcdef" * 2
    assert guard.admit(OWNER, announce(good), known=False, now=0.0) is None
    for bad in ("../../etc/passwd", "\x1b[2J" + "a" * 28, good.upper(), good[:-1], good + "0", ""):
        assert guard.admit(OWNER, announce(bad), known=False, now=0.0) == "bad_job_id"
    assert guard.admit(OWNER, announce(good, owner="x/" * 16), known=False, now=0.0) == "bad_peer_id"
    assert guard.admit(OWNER, announce(good, hash_len=31), known=False, now=0.0) == "bad_spec_hash"
    assert guard.admit(OWNER, announce(good, spec=b"\xff\xfe"), known=False, now=0.0) == "bad_spec"
    assert guard.dropped["bad_job_id"] == 6


def test_announcements_are_rate_limited_per_sender() -> None:
    guard = AnnounceGuard(AnnounceLimits(rate=1.0, burst=3.0))
    ids = [f"{i:032x}" for i in range(10)]
    assert [guard.admit(OWNER, announce(j), known=False, now=0.0) for j in ids[:4]] == [None] * 3 + ["announce_rate"]
    assert guard.admit("cd" * 16, announce(ids[5], owner="cd" * 16), known=False, now=0.0) is None
    assert guard.admit(OWNER, announce(ids[0]), known=True, now=0.0) is None  # a known job costs nothing
    assert guard.admit(OWNER, announce(ids[6]), known=False, now=1.0) is None


def test_announced_jobs_are_bounded_per_source_and_in_total() -> None:
    guard = AnnounceGuard(AnnounceLimits(per_source=2, total=3))
    assert guard.added("a" * 32, OWNER) == []
    assert guard.added("b" * 32, OWNER) == []
    assert guard.added("c" * 32, OWNER) == ["a" * 32]
    assert guard.added("d" * 32, "cd" * 16) == []
    assert guard.added("e" * 32, "ef" * 16) == ["b" * 32]
    assert guard.summary() == {"tracked": 3, "dropped": {"announce_evicted": 2}}
    for i in range(1000):
        guard.added(f"{i:032x}", f"{i:032x}")
    assert guard.summary()["tracked"] == 3
