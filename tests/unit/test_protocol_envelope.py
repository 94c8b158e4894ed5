"""Signed envelope: every tampered byte is refused, and each check refuses with its own reason."""

from __future__ import annotations

from typing import Any

import pytest

from arceusd.base.identity import Identity
from protocol import codec, envelope
from protocol.envelope import BROADCAST, HEADER_LEN, NO_JOB, SIG_LEN, open_envelope, open_message, seal
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.messages import Ping, TermRequest
from protocol.replay import ReplayGuard

ALICE = Identity.generate()
BOB = Identity.generate()
MALLORY = Identity.generate()
JOB = "ab" * 16
OTHER_JOB = "cd" * 16
NOW = 1_700_000_000_000
KEYS = {p.peer_id: p.public_key_raw for p in (ALICE, BOB, MALLORY)}


def _seal(msg: Any = None, signer: Identity = ALICE, **kw: Any) -> bytes:
    args: dict[str, Any] = {"boot_id": 1, "seq": 1, "timestamp_ms": NOW, "recipient": BOB.peer_id}
    args.update(kw)
    return envelope.seal_message(signer, msg if msg is not None else Ping(5, BOB.peer_id), **args)


def _open(frame: bytes, **kw: Any) -> tuple[envelope.Header, object]:
    args: dict[str, Any] = {
        "lookup_key": KEYS.get,
        "expect_recipient": BOB.peer_id,
        "expect_job": None,
        "replay_guard": ReplayGuard(),
        "now_ms": NOW,
    }
    args.update(kw)
    return open_message(frame, **args)


def _reason(frame: bytes, **kw: Any) -> str:
    with pytest.raises(RemoteProtocolError) as exc:
        _open(frame, **kw)
    return exc.value.reason


def test_round_trip_header_fields() -> None:
    msg = TermRequest(job_id=JOB, term=4, candidate=ALICE.peer_id)
    frame = _seal(msg, job_id=JOB, term=4, epoch=2, stream_id=9, seq=77, boot_id=123)
    head, got = _open(frame, expect_job=JOB, min_term=4, min_epoch=2)
    assert got == msg
    assert (head.sender, head.recipient, head.job_id) == (ALICE.peer_id, BOB.peer_id, JOB)
    assert (head.term, head.epoch, head.stream_id, head.seq, head.boot_id) == (4, 2, 9, 77, 123)
    assert head.msg_type == 20 and head.timestamp_ms == NOW and head.payload_len == len(codec.encode(msg))
    assert len(frame) == HEADER_LEN + SIG_LEN + head.payload_len


def test_every_flipped_byte_is_rejected() -> None:
    frame = _seal()
    assert len(frame) > HEADER_LEN + SIG_LEN  # header, signature and payload all covered
    for pos in range(len(frame)):
        for mask in (0x01, 0x80):
            bad = bytearray(frame)
            bad[pos] ^= mask
            with pytest.raises(RemoteProtocolError):
                _open(bytes(bad))
    _open(frame)  # the untouched frame still opens


def test_truncated_and_extended_frames_rejected() -> None:
    frame = _seal()
    for cut in range(len(frame)):
        with pytest.raises(RemoteProtocolError):
            _open(frame[:cut])
    assert _reason(frame + b"\x00") == "length_mismatch"


def test_reasons() -> None:
    frame = _seal()
    assert _reason(frame, lookup_key=lambda _pid: None) == "unknown_sender"
    forged = bytearray(_seal(signer=MALLORY))
    forged[10:26] = bytes.fromhex(ALICE.peer_id)  # claim to be Alice
    assert _reason(bytes(forged)) == "bad_signature"
    assert _reason(_seal(recipient=MALLORY.peer_id)) == "wrong_recipient"
    assert _reason(_seal(recipient=BROADCAST), accept_broadcast=False) == "wrong_recipient"
    _open(_seal(recipient=BROADCAST))
    assert _reason(_seal(job_id=OTHER_JOB), expect_job=JOB) == "wrong_job"
    assert _reason(_seal(job_id=NO_JOB), expect_job=JOB) == "wrong_job"
    assert _reason(_seal(job_id=JOB, term=2), expect_job=JOB, min_term=3) == "stale_term"
    assert _reason(_seal(job_id=JOB, epoch=1), expect_job=JOB, min_epoch=2) == "stale_epoch"
    assert _reason(frame, now_ms=NOW + 10 * 60_000) == "stale_timestamp"
    assert _reason(frame, now_ms=NOW - 10 * 60_000) == "future_timestamp"
    guard = ReplayGuard()
    _open(frame, replay_guard=guard)
    assert _reason(frame, replay_guard=guard) == "replayed"
    # A payload that is signed but not a valid message still gets no further than the codec's error.
    raw = seal(ALICE, msg_type=10, payload=b"\xc1", boot_id=1, seq=2, timestamp_ms=NOW, recipient=BOB.peer_id)
    assert _reason(raw) == "malformed"
    unknown = seal(ALICE, msg_type=64000, payload=b"", boot_id=1, seq=3, timestamp_ms=NOW, recipient=BOB.peer_id)
    assert _reason(unknown) == "unknown_type"


def _resign(frame: bytes, offset: int, new: bytes) -> bytes:
    """Patch header bytes and sign again with Alice's key: authentic but invalid in a header field."""
    head = bytearray(frame[:HEADER_LEN])
    head[offset : offset + len(new)] = new
    sig = ALICE.sign(envelope.SIGNING_TAG + bytes(head))
    return bytes(head) + sig + frame[HEADER_LEN + SIG_LEN :]


def test_header_checks_before_key_lookup() -> None:
    frame = _seal()
    looked: list[str] = []

    def lookup(pid: str) -> bytes | None:
        looked.append(pid)
        return KEYS.get(pid)

    assert _reason(b"XXXX" + frame[4:], lookup_key=lookup) == "bad_magic"
    assert _reason(_resign(frame, 4, b"\x00\x02"), lookup_key=lookup) == "bad_version"
    assert looked == []  # refused before any key lookup or signature work
    assert _reason(_resign(frame, 8, b"\x00\x01")) == "bad_flags"
    assert _reason(b"\x00" * 10) == "short_frame"
    assert _reason(frame, max_frame=100) == "frame_too_large"
    tampered_payload = frame[:-1] + bytes([frame[-1] ^ 1])
    assert _reason(tampered_payload) == "bad_digest"


def test_open_envelope_returns_payload_view() -> None:
    frame = _seal()
    head, payload = open_envelope(
        frame, lookup_key=KEYS.get, expect_recipient=BOB.peer_id, expect_job=None, replay_guard=None, now_ms=0
    )
    assert bytes(payload) == codec.encode(Ping(5, BOB.peer_id)) and payload.readonly
    assert head == envelope.peek_header(frame)


def test_local_errors() -> None:
    with pytest.raises(LocalProtocolError):
        _seal(recipient="not-hex")
    with pytest.raises(LocalProtocolError):
        _seal(seq=-1)
    with pytest.raises(LocalProtocolError) as exc:
        _open(_seal(), lookup_key=lambda _pid: MALLORY.public_key_raw)
    assert exc.value.reason == "key_mismatch"
