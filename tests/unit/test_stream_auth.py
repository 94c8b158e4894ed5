"""Unit tests of protocol/stream_auth.py: the handshake and per-frame authentication, with every tampering."""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.base.identity import Identity
from protocol import stream_auth as sa
from protocol.errors import LocalProtocolError, RemoteProtocolError

NOW = 1_700_000_000_000
CLIENT = Identity.generate()
SERVER = Identity.generate()
DEFAULT_LIMITS = sa.Limits()


def rng(seed: int) -> Callable[[int], bytes]:
    r = random.Random(seed)
    return lambda n: r.randbytes(n)


def handshake(
    purpose: bytes = b"tensors/job-1",
    expect: str | None = None,
    limits: sa.Limits = DEFAULT_LIMITS,
) -> tuple[sa.ClientHandshake, sa.ServerHandshake, sa.Session, sa.Session]:
    client = sa.ClientHandshake(
        CLIENT, purpose=purpose, expect_peer_id=expect, now_ms=NOW, random_bytes=rng(1), limits=limits
    )
    server = sa.ServerHandshake(SERVER, client.hello, now_ms=NOW + 5, random_bytes=rng(2), limits=limits)
    client_session, finish = client.receive_ack(server.ack, now_ms=NOW + 10)
    server_session = server.receive_finish(finish)
    return client, server, client_session, server_session


def flips(data: bytes) -> list[bytes]:
    """Every single-byte change of ``data`` (xor 0x01 and xor 0x80 at each position)."""
    out = []
    for i in range(len(data)):
        for mask in (0x01, 0x80):
            out.append(data[:i] + bytes([data[i] ^ mask]) + data[i + 1 :])
    return out


def test_handshake_success_both_sides_learn_proven_ids() -> None:
    _, server, cs, ss = handshake(expect=SERVER.peer_id)
    assert cs.peer_id == SERVER.peer_id and ss.peer_id == CLIENT.peer_id
    assert cs.peer_public_key == SERVER.public_key_raw and ss.peer_public_key == CLIENT.public_key_raw
    assert ss.purpose == b"tensors/job-1" and server.info.purpose == b"tensors/job-1"
    frame = cs.sealer.seal(b"hdr", b"payload")
    got = ss.opener.open(frame)
    assert (got.kind, got.header, bytes(got.payload), got.sequence) == (sa.FRAME_DATA, b"hdr", b"payload", 0)
    back = ss.sealer.seal(b"", b"reply")
    assert bytes(cs.opener.open(back).payload) == b"reply"


def test_handshake_is_deterministic_given_the_rng_and_clock() -> None:
    a, b = handshake()[0], handshake()[0]
    assert a.hello == b.hello
    c = sa.ClientHandshake(CLIENT, purpose=b"tensors/job-1", expect_peer_id=None, now_ms=NOW, random_bytes=rng(9))
    assert c.hello != a.hello


def test_each_direction_has_its_own_key() -> None:
    _, _, cs, ss = handshake()
    c2s = cs.sealer.seal(b"h", b"x")
    # A client frame reflected back to the client fails: directions do not share keys.
    with pytest.raises(RemoteProtocolError) as err:
        cs.opener.open(c2s)
    assert err.value.reason == "bad_mac"
    assert bytes(ss.opener.open(c2s).payload) == b"x"


@pytest.mark.parametrize("field", ["hello", "ack", "finish"])
def test_every_byte_flip_of_a_handshake_message_is_rejected(field: str) -> None:
    client, server, _, _ = handshake()
    _, finish = client.receive_ack(server.ack, now_ms=NOW)
    original = {"hello": client.hello, "ack": server.ack, "finish": finish}[field]
    rejected = 0
    variants = flips(original)
    for bad in variants:
        with pytest.raises(RemoteProtocolError):
            if field == "hello":
                sa.ServerHandshake(SERVER, bad, now_ms=NOW, random_bytes=rng(3))
            elif field == "ack":
                client.receive_ack(bad, now_ms=NOW)
            else:
                server.receive_finish(bad)
        rejected += 1
    assert rejected == len(variants) == 2 * len(original)


@pytest.mark.parametrize("field", ["hello", "ack", "finish"])
def test_truncated_or_extended_handshake_messages_are_rejected(field: str) -> None:
    client, server, _, _ = handshake()
    _, finish = client.receive_ack(server.ack, now_ms=NOW)
    original = {"hello": client.hello, "ack": server.ack, "finish": finish}[field]
    for bad in [original[:n] for n in range(len(original))] + [original + b"\x00", b""]:
        with pytest.raises(RemoteProtocolError):
            if field == "hello":
                sa.ServerHandshake(SERVER, bad, now_ms=NOW, random_bytes=rng(3))
            elif field == "ack":
                client.receive_ack(bad, now_ms=NOW)
            else:
                server.receive_finish(bad)


class _Impostor:
    """Claims one identity's public key but signs with another key."""

    def __init__(self, claimed: Identity, actual: Identity) -> None:
        self.public_key_raw = claimed.public_key_raw
        self.peer_id = claimed.peer_id
        self._actual = actual

    def sign(self, data: bytes) -> bytes:
        return self._actual.sign(data)


def test_client_signing_with_wrong_key_is_rejected() -> None:
    impostor = _Impostor(CLIENT, Identity.generate())
    client = sa.ClientHandshake(impostor, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    with pytest.raises(RemoteProtocolError) as err:
        sa.ServerHandshake(SERVER, client.hello, now_ms=NOW, random_bytes=rng(2))
    assert err.value.reason == "bad_signature"


def test_server_signing_with_wrong_key_is_rejected() -> None:
    client = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    server = sa.ServerHandshake(_Impostor(SERVER, Identity.generate()), client.hello, now_ms=NOW, random_bytes=rng(2))
    with pytest.raises(RemoteProtocolError) as err:
        client.receive_ack(server.ack, now_ms=NOW)
    assert err.value.reason == "bad_signature"


def test_server_whose_id_does_not_match_the_expected_one_is_rejected() -> None:
    other = Identity.generate()
    client = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    # A genuine, well-signed server, but not the one we meant to reach.
    expecting = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=SERVER.peer_id, now_ms=NOW, random_bytes=rng(1))
    server = sa.ServerHandshake(other, client.hello, now_ms=NOW, random_bytes=rng(2))
    client.receive_ack(server.ack, now_ms=NOW)  # no expectation: accepted
    with pytest.raises(RemoteProtocolError) as err:
        server_for_expecting = sa.ServerHandshake(other, expecting.hello, now_ms=NOW, random_bytes=rng(2))
        expecting.receive_ack(server_for_expecting.ack, now_ms=NOW)
    # The Hello names its recipient, so the wrong server already refuses it.
    assert err.value.reason == "wrong_recipient"


def test_ack_from_unexpected_peer_is_rejected_even_if_it_ignores_the_recipient() -> None:
    other = Identity.generate()
    expecting = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=SERVER.peer_id, now_ms=NOW, random_bytes=rng(1))
    # A server that ignores the recipient field: answer a Hello by building the Ack with its own key.
    plain = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    ack = sa.ServerHandshake(other, plain.hello, now_ms=NOW, random_bytes=rng(2)).ack
    fixed = struct.Struct(">4sBB32s32s16sQ32s")
    fields = list(fixed.unpack(ack[: fixed.size]))
    fields[-1] = hashlib.sha256(expecting.hello).digest()
    body = fixed.pack(*fields)
    forged = body + other.sign(sa.DOMAIN_ACK + body)
    with pytest.raises(RemoteProtocolError) as err:
        expecting.receive_ack(forged, now_ms=NOW)
    assert err.value.reason == "unexpected_peer"


def test_ack_for_another_hello_is_rejected() -> None:
    a = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    b = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(7))
    ack_for_a = sa.ServerHandshake(SERVER, a.hello, now_ms=NOW, random_bytes=rng(2)).ack
    with pytest.raises(RemoteProtocolError):
        b.receive_ack(ack_for_a, now_ms=NOW)


@pytest.mark.parametrize("skew", [sa.DEFAULT_MAX_SKEW_MS + 1, -sa.DEFAULT_MAX_SKEW_MS - 1])
def test_stale_timestamps_are_rejected_on_both_sides(skew: int) -> None:
    client = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    with pytest.raises(RemoteProtocolError) as err:
        sa.ServerHandshake(SERVER, client.hello, now_ms=NOW + skew, random_bytes=rng(2))
    assert err.value.reason == "stale_timestamp"
    server = sa.ServerHandshake(SERVER, client.hello, now_ms=NOW, random_bytes=rng(2))
    with pytest.raises(RemoteProtocolError) as err:
        client.receive_ack(server.ack, now_ms=NOW + skew)
    assert err.value.reason == "stale_timestamp"
    # At the edge of the window it still works.
    sa.ServerHandshake(SERVER, client.hello, now_ms=NOW + sa.DEFAULT_MAX_SKEW_MS, random_bytes=rng(2))


def test_replayed_hello_cannot_complete_without_the_ephemeral_key() -> None:
    client = sa.ClientHandshake(CLIENT, purpose=b"p", expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    first = sa.ServerHandshake(SERVER, client.hello, now_ms=NOW, random_bytes=rng(2))
    _, finish = client.receive_ack(first.ack, now_ms=NOW)
    first.receive_finish(finish)
    # An eavesdropper replays Hello and the old Finish; the server's fresh nonce makes the Finish stale.
    replay = sa.ServerHandshake(SERVER, client.hello, now_ms=NOW, random_bytes=rng(3))
    with pytest.raises(RemoteProtocolError) as err:
        replay.receive_finish(finish)
    assert err.value.reason == "bad_finish"


def test_low_order_ephemeral_key_is_rejected() -> None:
    purpose = b"p"
    fixed = struct.Struct(">4sBB32s32s16sQ16sB")
    body = fixed.pack(
        sa.MAGIC, sa.VERSION, sa.KIND_HELLO, CLIENT.public_key_raw, bytes(32), bytes(16), NOW, bytes(16), 1
    )
    body += purpose
    hello = body + CLIENT.sign(sa.DOMAIN_HELLO + body)
    with pytest.raises(RemoteProtocolError) as err:
        sa.ServerHandshake(SERVER, hello, now_ms=NOW, random_bytes=rng(2))
    assert err.value.reason == "bad_ephemeral_key"


def test_local_misuse_raises_local_errors() -> None:
    with pytest.raises(LocalProtocolError):
        sa.ClientHandshake(CLIENT, purpose=b"x" * 256, expect_peer_id=None, now_ms=NOW, random_bytes=rng(1))
    with pytest.raises(LocalProtocolError):
        sa.ClientHandshake(CLIENT, purpose=b"x", expect_peer_id="nothex", now_ms=NOW, random_bytes=rng(1))


# ------------------------------------------------------------------------------------------------- frames


def pair(limits: sa.Limits = DEFAULT_LIMITS) -> tuple[sa.FrameSealer, Callable[[], sa.FrameOpener]]:
    key = bytes(range(32))
    return sa.FrameSealer(key, limits), lambda: sa.FrameOpener(key, limits)


def test_every_byte_flip_of_a_frame_is_rejected_before_use() -> None:
    sealer, new_opener = pair()
    frame = sealer.seal(b"header-bytes", bytes(range(64)))
    assert bytes(new_opener().open(frame).payload) == bytes(range(64))
    variants = flips(frame)
    length_bytes = range(1, sa.FRAME_PREFIX.size)
    for i, bad in enumerate(variants):
        with pytest.raises(RemoteProtocolError) as err:
            new_opener().open(bad)
        # A changed length is caught by the bounds checks (or the tag); everything else by the tag.
        allowed = ("bad_mac", "malformed_frame", "frame_too_large") if i // 2 in length_bytes else ("bad_mac",)
        assert err.value.reason in allowed
    assert len(variants) == 2 * (sa.FRAME_PREFIX.size + 12 + 64 + sa.TAG_BYTES)


def test_truncated_frames_are_rejected() -> None:
    sealer, new_opener = pair()
    frame = sealer.seal(b"h", b"0123456789")
    for n in range(len(frame)):
        with pytest.raises(RemoteProtocolError) as err:
            new_opener().open(frame[:n])
        assert err.value.reason in ("bad_mac", "malformed_frame")


def test_several_frames_in_one_message_open_in_order() -> None:
    sealer, new_opener = pair()
    items = [(b"a", b"1" * 10), (b"", b""), (b"ccc", b"3" * 1000)]
    message = memoryview(b"".join(sealer.seal(h, p) for h, p in items))
    opener = new_opener()
    offset, got = 0, []
    while offset < message.nbytes:
        frame, offset = opener.open_next(message, offset)
        got.append((frame.header, bytes(frame.payload)))
    assert got == items
    with pytest.raises(RemoteProtocolError):
        new_opener().open(message)  # open() wants exactly one frame


def test_replayed_reordered_and_dropped_frames_are_rejected() -> None:
    sealer, new_opener = pair()
    frames = [sealer.seal(b"", bytes([i]) * 8) for i in range(4)]
    cases = {
        "replay": [frames[0], frames[1], frames[1]],
        "reorder": [frames[1]],
        "swap": [frames[0], frames[2]],
        "drop": [frames[0], frames[1], frames[3]],
        "restart": [frames[0], frames[1], frames[0]],
    }
    for name, sequence in cases.items():
        opener = new_opener()
        for f in sequence[:-1]:
            opener.open(f)
        with pytest.raises(RemoteProtocolError) as err:
            opener.open(sequence[-1])
        assert err.value.reason == "bad_mac", name


def test_opener_stays_failed_after_a_bad_frame() -> None:
    sealer, new_opener = pair()
    f0, f1 = sealer.seal(b"", b"a"), sealer.seal(b"", b"b")
    opener = new_opener()
    with pytest.raises(RemoteProtocolError):
        opener.open(f0[:-1] + bytes([f0[-1] ^ 1]))
    with pytest.raises(RemoteProtocolError):
        opener.open(f0)
    with pytest.raises(RemoteProtocolError):
        opener.open(f1)


def test_wrong_key_is_rejected() -> None:
    sealer, _ = pair()
    with pytest.raises(RemoteProtocolError) as err:
        sa.FrameOpener(bytes(32), sa.Limits()).open(sealer.seal(b"", b"x"))
    assert err.value.reason == "bad_mac"


def test_close_frame_ends_sending() -> None:
    sealer, new_opener = pair()
    opener = new_opener()
    opener.open(sealer.seal(b"h", b"x"))
    got = opener.open(sealer.seal(b"", b"", kind=sa.FRAME_CLOSE))
    assert got.kind == sa.FRAME_CLOSE and got.sequence == 1
    with pytest.raises(LocalProtocolError):
        sealer.seal(b"", b"late")


def test_size_limits_on_send_and_receive() -> None:
    small = sa.Limits(max_header=8, max_payload=100)
    sealer, new_opener = pair(small)
    sealer.seal(b"x" * 8, b"y" * 100)
    with pytest.raises(LocalProtocolError) as lerr:
        sealer.seal(b"", b"y" * 101)
    assert lerr.value.reason == "frame_too_large"
    with pytest.raises(LocalProtocolError):
        sealer.seal(b"x" * 9, b"")
    big_sealer = sa.FrameSealer(bytes(range(32)), sa.Limits())
    with pytest.raises(RemoteProtocolError) as rerr:
        new_opener().open(big_sealer.seal(b"", b"y" * 1000))
    assert rerr.value.reason == "frame_too_large"
    # Within the overall frame size but over the payload limit (header shorter than allowed): still refused.
    with pytest.raises(RemoteProtocolError) as rerr:
        new_opener().open(sa.FrameSealer(bytes(range(32)), sa.Limits()).seal(b"", b"y" * 105))
    assert rerr.value.reason == "frame_too_large"


def test_torch_tensor_payload_round_trips_without_copy_on_receive() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(1024, dtype=torch.float32)
    import ctypes

    storage = t.untyped_storage()
    view = memoryview((ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())).cast("B")
    sealer, new_opener = pair()
    frame = sealer.seal(b"f32", view)
    got = new_opener().open(frame)
    back = torch.frombuffer(bytearray(got.payload), dtype=torch.float32)
    assert torch.equal(back, t)
    assert got.payload.obj is frame  # a view into the received bytes, not a copy


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=300)), min_size=1, max_size=8))
def test_frames_round_trip_in_order(items: list[tuple[bytes, bytes]]) -> None:
    sealer, new_opener = pair()
    opener = new_opener()
    for i, (header, payload) in enumerate(items):
        got = opener.open(sealer.seal(header, payload))
        assert (got.header, bytes(got.payload), got.sequence) == (header, payload, i)


@pytest.mark.parametrize("size", [0, 1, 64 * 1024, 64 * 1024 + 1, 1 << 20])
def test_frame_tag_is_gmac_of_the_frame_under_its_sequence_number(size: int) -> None:
    # Reference: AES-256-GCM with an empty plaintext, the frame before the tag as associated data and the
    # 96-bit nonce 0^32 || n, computed independently of the sealer (both sides of the one-shot/streaming
    # switch inside FrameSealer, and a payload large enough to take the streaming path).
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = bytes(range(32))
    sealer, new_opener = pair()
    payload = random.Random(size).randbytes(size)
    opener = new_opener()
    for n in range(3):
        frame = sealer.seal(b"hdr", payload)
        body, tag = frame[: -sa.TAG_BYTES], frame[-sa.TAG_BYTES :]
        assert body == sa.FRAME_PREFIX.pack(sa.FRAME_DATA, 3, size) + b"hdr" + payload
        assert tag == AESGCM(key).encrypt(bytes(4) + n.to_bytes(8, "big"), b"", body)
        assert bytes(opener.open(frame).payload) == payload


def test_large_frame_with_a_flipped_payload_byte_is_rejected() -> None:
    sealer, new_opener = pair()
    frame = bytearray(sealer.seal(b"t", bytes(200_000)))
    frame[sa.FRAME_PREFIX.size + 1 + 123_456] ^= 0x10
    with pytest.raises(RemoteProtocolError) as err:
        new_opener().open(bytes(frame))
    assert err.value.reason == "bad_mac"
