"""The signed envelope: a fixed binary header, an Ed25519 signature, then the payload.

Frame layout (all integers big-endian; ids are 16 raw bytes, shown to callers as 32 lowercase hex chars)::

    magic         4s   b"ARCE"
    version       u16  PROTOCOL_VERSION
    msg type      u16  registered message type id (protocol.messages) or an application-defined id
    flags         u16  must be 0 in version 1
    sender        16s  peer id of the signer
    recipient     16s  peer id, zeros = broadcast
    job id        16s  zeros = no job
    term          u64  leader term the sender acts under (0 = none)
    plan epoch    u64
    boot id       u64  sender's boot id; must grow across restarts (e.g. wall-clock ms at start)
    stream id     u64  must grow within a boot (allocate from a counter)
    sequence      u64  grows within a stream
    timestamp     u64  sender's clock, ms since the epoch
    payload len   u32
    payload hash  32s  sha256(payload)
    ---- HEADER_LEN = 142 bytes ----
    signature     64s  Ed25519 over SIGNING_TAG + the 142 header bytes exactly as received
    payload       payload-len bytes

The signature covers the header, and the header covers the payload through its digest, so verifying never
re-encodes anything. :func:`open_envelope` checks, in this order, each failure a
:class:`RemoteProtocolError` with its own ``reason``:

``short_frame``/``frame_too_large`` (length), ``bad_magic``, ``bad_version``, ``bad_flags``,
``length_mismatch`` (declared vs actual payload length), ``unknown_sender`` (no key), ``bad_signature``,
``bad_digest``, ``wrong_recipient``, ``wrong_job``, ``stale_term``, ``stale_epoch``, then the replay guard's
reasons (``stale_timestamp``, ``future_timestamp``, ``replayed``, ``sequence_too_old``, ``evicted_key``).
Only then is the payload handed to a decoder (:func:`open_message` does so with :mod:`protocol.codec`).

Measured here: sign ~30 us and verify ~60 us per message dominate; the per-stream MAC handshake in the
transport is the fast path for bulk tensors (see ARCHITECTURE.md, "The wire").
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol import PROTOCOL_VERSION, codec, limits
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.messages import type_id_of
from protocol.replay import ReplayGuard

MAGIC = b"ARCE"
SIGNING_TAG = b"arceus-envelope-v1\x00"
_HEADER = struct.Struct(">4sHHH16s16s16sQQQQQQI32s")
HEADER_LEN = _HEADER.size
SIG_LEN = 64
ID_BYTES = 16
ZERO_ID = "0" * (2 * ID_BYTES)
BROADCAST = ZERO_ID
"""Recipient meaning "everyone"."""
NO_JOB = ZERO_ID
"""Job id meaning "not about a job"."""
_U64_MAX = 2**64 - 1


class Signer(Protocol):
    """What sealing needs from an identity (arceusd.base.identity.Identity satisfies it)."""

    @property
    def peer_id(self) -> str: ...

    def sign(self, data: bytes) -> bytes: ...


KeyLookup = Callable[[str], bytes | None]
"""peer id (hex) -> raw 32-byte Ed25519 public key, or None when the peer is unknown."""


@dataclass(frozen=True)
class Header:
    version: int
    msg_type: int
    flags: int
    sender: str
    recipient: str
    job_id: str
    term: int
    epoch: int
    boot_id: int
    stream_id: int
    seq: int
    timestamp_ms: int
    payload_len: int
    payload_digest: bytes

    @property
    def is_broadcast(self) -> bool:
        return self.recipient == BROADCAST


def _id_bytes(name: str, value: str) -> bytes:
    raw = _ID_CACHE.get(value)
    if raw is not None:
        return raw
    raw = _parse_id(name, value)
    if len(_ID_CACHE) >= _ID_CACHE_MAX:
        _ID_CACHE.clear()
    _ID_CACHE[value] = raw
    return raw


_ID_CACHE: dict[str, bytes] = {}
_ID_CACHE_MAX = 4096
"""Parsed ids (a sender seals for the same few ids over and over; only valid ids are stored)."""


def _parse_id(name: str, value: str) -> bytes:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != ID_BYTES or value != value.lower():
        raise LocalProtocolError("bad_id", f"{name} must be {2 * ID_BYTES} lowercase hex chars, got {value!r}")
    return raw


def seal(
    signer: Signer,
    *,
    msg_type: int,
    payload: bytes | bytearray | memoryview,
    boot_id: int,
    seq: int,
    timestamp_ms: int,
    recipient: str = BROADCAST,
    job_id: str = NO_JOB,
    term: int = 0,
    epoch: int = 0,
    stream_id: int = 0,
) -> bytes:
    """Build a signed frame around ``payload``.

    Error handling: LocalProtocolError for malformed ids, integers out of range or an oversized payload."""
    ints = {"term": term, "epoch": epoch, "boot_id": boot_id, "stream_id": stream_id, "seq": seq}
    for name, v in (*ints.items(), ("timestamp_ms", timestamp_ms)):
        if not (0 <= v <= _U64_MAX):
            raise LocalProtocolError("bad_header_field", f"{name}={v} is not a u64")
    if not (0 <= msg_type < 65536):
        raise LocalProtocolError("bad_header_field", f"msg_type={msg_type} is not a u16")
    plen = memoryview(payload).nbytes
    if HEADER_LEN + SIG_LEN + plen > limits.MAX_FRAME_SIZE:
        raise LocalProtocolError("frame_too_large", f"payload of {plen} bytes exceeds MAX_FRAME_SIZE")
    header = _HEADER.pack(
        MAGIC,
        PROTOCOL_VERSION,
        msg_type,
        0,
        _id_bytes("sender", signer.peer_id),
        _id_bytes("recipient", recipient),
        _id_bytes("job_id", job_id),
        term,
        epoch,
        boot_id,
        stream_id,
        seq,
        timestamp_ms,
        plen,
        hashlib.sha256(payload).digest(),
    )
    signature = signer.sign(SIGNING_TAG + header)
    if len(signature) != SIG_LEN:
        raise LocalProtocolError("bad_signer", f"signer returned {len(signature)} signature bytes, not 64")
    return b"".join((header, signature, payload))


def seal_message(
    signer: Signer,
    msg: object,
    *,
    boot_id: int,
    seq: int,
    timestamp_ms: int,
    recipient: str = BROADCAST,
    job_id: str = NO_JOB,
    term: int = 0,
    epoch: int = 0,
    stream_id: int = 0,
) -> bytes:
    """Encode a registered message with :func:`protocol.codec.encode` and seal it under its type id."""
    return seal(
        signer,
        msg_type=type_id_of(msg),
        payload=codec.encode(msg),
        boot_id=boot_id,
        seq=seq,
        timestamp_ms=timestamp_ms,
        recipient=recipient,
        job_id=job_id,
        term=term,
        epoch=epoch,
        stream_id=stream_id,
    )


@functools.lru_cache(maxsize=4096)
def _public_key(raw: bytes) -> tuple[str, Ed25519PublicKey | None]:
    """The peer id a raw public key hashes to and its key object (None: not a usable Ed25519 key).

    Cached per key, so a busy receiver neither re-hashes nor re-parses its peers' keys per message."""
    peer_id = hashlib.sha256(raw).digest()[:ID_BYTES].hex()
    try:
        return peer_id, Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return peer_id, None


def peek_header(frame: bytes | bytearray | memoryview) -> Header:
    """Parse the header WITHOUT authenticating it (for routing/metrics only; never act on it)."""
    mv = memoryview(frame).cast("B")
    if mv.nbytes < HEADER_LEN + SIG_LEN:
        raise RemoteProtocolError("short_frame", f"{mv.nbytes} bytes is shorter than header + signature")
    (
        magic,
        version,
        msg_type,
        flags,
        sender,
        recipient,
        job,
        term,
        epoch,
        boot,
        stream,
        seq,
        ts,
        plen,
        digest,
    ) = _HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise RemoteProtocolError("bad_magic", "not an Arceus envelope")
    return Header(
        version=version,
        msg_type=msg_type,
        flags=flags,
        sender=sender.hex(),
        recipient=recipient.hex(),
        job_id=job.hex(),
        term=term,
        epoch=epoch,
        boot_id=boot,
        stream_id=stream,
        seq=seq,
        timestamp_ms=ts,
        payload_len=plen,
        payload_digest=digest,
    )


def open_envelope(
    frame: bytes | bytearray | memoryview,
    *,
    lookup_key: KeyLookup,
    expect_recipient: str,
    expect_job: str | None,
    replay_guard: ReplayGuard | None,
    now_ms: int,
    min_term: int = 0,
    min_epoch: int = 0,
    accept_broadcast: bool = True,
    max_frame: int = limits.MAX_FRAME_SIZE,
) -> tuple[Header, memoryview]:
    """Authenticate and check a frame; return its header and a read-only view of its payload.

    ``expect_recipient`` is our own peer id (broadcast frames pass when ``accept_broadcast``). ``expect_job``
    is the job this receiver serves, :data:`NO_JOB` for job-less traffic, or None to accept any job and
    dispatch on ``header.job_id`` afterwards. ``min_term``/``min_epoch`` are the highest the receiver has
    persisted for that job. ``replay_guard`` None skips replay and freshness checks (only for frames whose
    replay is harmless, e.g. idempotent probes you re-check by other means).

    Error handling: RemoteProtocolError with the reasons listed in the module docstring; a ``lookup_key`` that
    returns a key not matching the sender's id is our bug (LocalProtocolError ``key_mismatch``)."""
    mv = memoryview(frame).cast("B").toreadonly()
    n = mv.nbytes
    if n > max_frame:
        raise RemoteProtocolError("frame_too_large", f"{n} bytes > {max_frame}")
    head = peek_header(mv)
    if head.version != PROTOCOL_VERSION:
        raise RemoteProtocolError(
            "bad_version",
            f"protocol version {head.version}, we speak {PROTOCOL_VERSION}; upgrade the older side",
        )
    if head.flags != 0:
        raise RemoteProtocolError("bad_flags", f"unknown flags {head.flags:#06x}")
    if head.payload_len != n - HEADER_LEN - SIG_LEN:
        raise RemoteProtocolError(
            "length_mismatch",
            f"header declares {head.payload_len} payload bytes, frame has {n - HEADER_LEN - SIG_LEN}",
        )
    pub = lookup_key(head.sender)
    if pub is None:
        raise RemoteProtocolError("unknown_sender", f"no public key for peer {head.sender}")
    key_peer_id, key = _public_key(bytes(pub))
    if key_peer_id != head.sender:
        raise LocalProtocolError("key_mismatch", f"lookup_key returned a key that is not peer {head.sender}'s")
    try:
        if key is None:
            raise InvalidSignature
        key.verify(bytes(mv[HEADER_LEN : HEADER_LEN + SIG_LEN]), SIGNING_TAG + bytes(mv[:HEADER_LEN]))
    except InvalidSignature:
        raise RemoteProtocolError("bad_signature", f"signature does not verify for peer {head.sender}") from None
    payload = mv[HEADER_LEN + SIG_LEN :]
    if hashlib.sha256(payload).digest() != head.payload_digest:
        raise RemoteProtocolError("bad_digest", "payload does not match the signed digest")
    if head.recipient != expect_recipient and not (accept_broadcast and head.recipient == BROADCAST):
        raise RemoteProtocolError("wrong_recipient", f"frame is for {head.recipient}, we are {expect_recipient}")
    if expect_job is not None and head.job_id != expect_job:
        raise RemoteProtocolError("wrong_job", f"frame is for job {head.job_id}, expected {expect_job}")
    if head.term < min_term:
        raise RemoteProtocolError("stale_term", f"term {head.term} < {min_term}")
    if head.epoch < min_epoch:
        raise RemoteProtocolError("stale_epoch", f"plan epoch {head.epoch} < {min_epoch}")
    if replay_guard is not None:
        replay_guard.accept((head.sender, head.boot_id, head.stream_id), head.seq, head.timestamp_ms, now_ms)
    return head, payload


def open_message(
    frame: bytes | bytearray | memoryview,
    *,
    lookup_key: KeyLookup,
    expect_recipient: str,
    expect_job: str | None,
    replay_guard: ReplayGuard | None,
    now_ms: int,
    min_term: int = 0,
    min_epoch: int = 0,
    accept_broadcast: bool = True,
    max_frame: int = limits.MAX_FRAME_SIZE,
) -> tuple[Header, object]:
    """:func:`open_envelope`, then decode the payload as the registered message type ``header.msg_type``."""
    head, payload = open_envelope(
        frame,
        lookup_key=lookup_key,
        expect_recipient=expect_recipient,
        expect_job=expect_job,
        replay_guard=replay_guard,
        now_ms=now_ms,
        min_term=min_term,
        min_epoch=min_epoch,
        accept_broadcast=accept_broadcast,
        max_frame=max_frame,
    )
    return head, codec.decode(head.msg_type, payload)
