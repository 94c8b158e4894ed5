"""Who may sign a job's receipts as its leader: the job's owner, and the leaders the owner named. Pure.

A receipt's leader signature proves which key signed it, not that the key had any business doing so: anyone can
make two keys, call one the leader and the other the device, and sign a receipt naming a real job and its real
owner. So a receipt counts only when its leader is the job's owner (the owner's own key signed it: the leader
key's peer id is the owner's) or when the owner signed an :class:`Authorisation` naming that leader for that job
(the plan's standby, which leads once the owner is gone). The owner signs one for each standby its plans name
(``arceusd.market.service``); it travels with the owner's receipt offers to every device of the job
(:class:`~protocol.market_wire.ReceiptOffer` ``authority``), and every ledger keeps the ones its receipts need,
before them (``arceusd.market.ledger``).

Encoding: the body is a msgpack map ``{job_id, owner, leader, issued_at}`` in that order (as receipts); the owner
signs ``AUTH_DOMAIN || body``; on the wire and in a ledger it is ``owner key (32) || signature (64) || body``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

import msgpack

from arceusd.base.identity import Identity, peer_id_from_public_key, verify_signature

AUTH_DOMAIN = b"arceus-leader-authorisation-v1\x00"
MAX_AUTH = 512
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class AuthorityError(ValueError):
    """An authorisation is malformed or does not verify; the message says what."""


@dataclass(frozen=True)
class Authorisation:
    """The owner of ``job_id`` lets ``leader`` sign its receipts."""

    job_id: str
    owner: str
    leader: str
    issued_at: float

    def check(self) -> None:
        for name in ("job_id", "owner", "leader"):
            if not _HEX32.match(getattr(self, name)):
                raise AuthorityError(f"authorisation {name} must be 32 lowercase hex characters")
        if not math.isfinite(self.issued_at) or self.issued_at < 0:
            raise AuthorityError("authorisation issued_at must be a finite number >= 0")


def encode_body(a: Authorisation) -> bytes:
    a.check()
    body: bytes = msgpack.packb(
        {f.name: getattr(a, f.name) for f in fields(Authorisation)}, use_bin_type=True, strict_types=True
    )
    return body


def decode_body(body: bytes) -> Authorisation:
    try:
        data = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=64,
            max_bin_len=0,
            max_array_len=0,
            max_map_len=len(fields(Authorisation)),
            max_ext_len=0,
        )
    except (ValueError, msgpack.UnpackException) as exc:
        raise AuthorityError(f"authorisation body is not msgpack: {exc}") from None
    names = [f.name for f in fields(Authorisation)]
    if not isinstance(data, dict) or list(data) != names:
        raise AuthorityError(f"authorisation body must hold exactly the fields {names} in that order")
    values: dict[str, Any] = {}
    for f in fields(Authorisation):
        want = float if f.name == "issued_at" else str
        if type(data[f.name]) is not want:
            raise AuthorityError(f"authorisation {f.name} must be {want.__name__}")
        values[f.name] = data[f.name]
    a = Authorisation(**values)
    if encode_body(a) != body:
        raise AuthorityError("authorisation body is not in canonical form")
    return a


@dataclass(frozen=True)
class SignedAuthorisation:
    auth: Authorisation
    owner_key: bytes
    owner_sig: bytes

    def verify(self) -> None:
        """The key is the owner's and its signature holds; :class:`AuthorityError` otherwise."""
        try:
            peer = peer_id_from_public_key(self.owner_key)
        except ValueError:
            peer = ""
        if peer != self.auth.owner:
            raise AuthorityError("the authorisation's key is not its job owner's")
        if not verify_signature(self.owner_key, self.owner_sig, AUTH_DOMAIN + encode_body(self.auth)):
            raise AuthorityError("the owner's signature on the authorisation does not verify")

    def to_bytes(self) -> bytes:
        return self.owner_key + self.owner_sig + encode_body(self.auth)


def from_bytes(raw: bytes) -> SignedAuthorisation:
    """Read and verify an authorisation as the wire and ledgers carry it."""
    if not 96 < len(raw) <= MAX_AUTH:
        raise AuthorityError(f"an authorisation is 97..{MAX_AUTH} bytes, got {len(raw)}")
    signed = SignedAuthorisation(decode_body(raw[96:]), raw[:32], raw[32:96])
    signed.verify()
    return signed


def authorise(owner: Identity, job_id: str, leader: str, at: float) -> SignedAuthorisation:
    """The owner's signature letting ``leader`` sign the job's receipts."""
    a = Authorisation(job_id, owner.peer_id, leader, float(at))
    return SignedAuthorisation(a, owner.public_key_raw, owner.sign(AUTH_DOMAIN + encode_body(a)))


def leader_allowed(job_id: str, owner: str, leader: str, granted: set[tuple[str, str, str]]) -> bool:
    """Whether ``leader`` may sign receipts of ``job_id`` owned by ``owner``: it is the owner, or ``granted`` (the
    verified authorisations as ``(job, owner, leader)``) holds the owner's word for it."""
    return leader == owner or (job_id, owner, leader) in granted


__all__ = [
    "AUTH_DOMAIN",
    "MAX_AUTH",
    "Authorisation",
    "AuthorityError",
    "SignedAuthorisation",
    "authorise",
    "from_bytes",
    "leader_allowed",
]
