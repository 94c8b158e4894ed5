"""Semantic checks of control messages at the edge, after decoding and before any handler uses a value.

The codec bounds sizes and types (:mod:`protocol.codec`); this module owns what a field must *mean*: ids in
their exact format, hashes of their exact length. A check raises :class:`protocol.errors.RemoteProtocolError`
whose ``reason`` is the counter key; the caller drops the message and counts it.

Formats (see :mod:`arceusd.jobs.spec.schema` and :mod:`arceusd.base.identity`): a peer id is 32 lowercase hex characters
(``sha256(public key)[:16]``); a job id is 32 lowercase hex characters (the first 16 bytes of a sha256 over
the spec hash, owner and a nonce); a spec hash is the 32 bytes of a sha256. Nothing else is accepted, so an
id can be used as a file name (``jobs/<job id>``) and shown to a user as it is.
"""

from __future__ import annotations

import re

from protocol.errors import RemoteProtocolError
from protocol.job_wire import JOB_MEMBERS_MAX
from protocol.messages import JobAnnounce

_HEX32 = re.compile(r"[0-9a-f]{32}")
SPEC_HASH_BYTES = 32


def is_hex_id(value: str) -> bool:
    """True for exactly 32 lowercase hex characters (a peer id or a job id)."""
    return _HEX32.fullmatch(value) is not None


def check_job_id(value: str) -> None:
    if not is_hex_id(value):
        raise RemoteProtocolError("bad_job_id", f"a job id is 32 lowercase hex characters, got {value[:40]!r}")


def check_peer_id(value: str, field: str = "peer id") -> None:
    if not is_hex_id(value):
        raise RemoteProtocolError("bad_peer_id", f"a {field} is 32 lowercase hex characters, got {value[:40]!r}")


def member_ids(values: tuple[str, ...], limit: int = JOB_MEMBERS_MAX) -> tuple[str, ...]:
    """A job's member ids as its leader sent them (``JoinReply.members``, ``JobStart.members``), sorted, each
    once. RemoteProtocolError: more than ``limit`` (``too_long``), or one that is not a peer id (``bad_peer_id``)."""
    if len(values) > limit:
        raise RemoteProtocolError("too_long", f"{len(values)} member ids, more than the {limit} a job holds")
    for value in values:
        check_peer_id(value, "member id")
    return tuple(sorted(set(values)))


def check_job_announce(msg: JobAnnounce) -> None:
    """A JobAnnounce's ids and hash in their exact formats, and a spec that is UTF-8 text (the spec itself is
    parsed and checked by the job layer, which also recomputes the hash)."""
    check_job_id(msg.job_id)
    check_peer_id(msg.owner, "job owner")
    if len(msg.spec_hash) != SPEC_HASH_BYTES:
        raise RemoteProtocolError(
            "bad_spec_hash", f"a spec hash is {SPEC_HASH_BYTES} bytes (sha256), got {len(msg.spec_hash)}"
        )
    try:
        msg.spec.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("bad_spec", "the announced spec is not UTF-8 JSON") from None
