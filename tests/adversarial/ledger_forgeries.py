"""Forgeries of a ledger (issue 29: a ledger proves who signed what), shared by ``tests/unit/test_ledger_forgery.py``
and ``bench/adversarial.py --secrets``: an owner's honest ledger of five lines (its own receipts for two devices,
an authorisation of a standby and one receipt that standby signed, :func:`owners_ledger`), and five ways to forge
it (:data:`FORGERIES`: a field changed; changed and the chain recomputed; a receipt removed and the chain
recomputed; a receipt forged with two self-made keys naming the real job and owner; one forged as the owner), each
with the line and the reason ``verify-ledger`` and ``bill`` give when they refuse it (:data:`WHY`), by a forger
without the keeper's key or with it (:func:`forge`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from arceusd.base.identity import Identity, load_or_create_identity
from arceusd.market.authority import authorise, from_bytes
from arceusd.market.ledger import HEAD_FILE, LEDGER_FILE, Ledger, auth_hash, entry_hash, head_bytes, keeper_bytes
from arceusd.market.receipts import (
    DEVICE_DOMAIN,
    LEADER_DOMAIN,
    Receipt,
    SignedReceipt,
    countersign,
    decode,
    encode,
    sign_leader,
)

DEV_A = Identity.generate()
DEV_B = Identity.generate()
STANDBY = Identity.generate()
JOB = "ef" * 16


def receipt(owner: str, leader: str, device: str, step: int, seconds: float = 3600.0) -> Receipt:
    return Receipt(JOB, owner, leader, device, 1, 1, step - 10, step, seconds, 1e12, 0.5, 1.7e9)


def owners_ledger(state: Path) -> Identity:
    """The owner's state directory: its own receipts for two devices, and one signed by the standby it authorised."""
    me = load_or_create_identity(state)
    ledger = Ledger.open(state)
    for i, dev in enumerate((DEV_A, DEV_B, DEV_A)):
        ledger.append(countersign(dev, sign_leader(me, receipt(me.peer_id, me.peer_id, dev.peer_id, 10 * i + 10))))
    ledger.authorise(authorise(me, JOB, STANDBY.peer_id, 1.7e9))
    r = receipt(me.peer_id, STANDBY.peer_id, DEV_B.peer_id, 40)
    ledger.append(countersign(DEV_B, sign_leader(STANDBY, r)))
    return me


def rechain(lines: list[str], keeper: Identity | None, head: Path) -> list[str]:
    """Renumber and rehash every line (what a forger recomputes); with ``keeper``, sign each line and the head as
    the keeper would (a forger holding the keeper's key)."""
    out, prev = [], "0" * 64
    for seq, line in enumerate(lines):
        obj = json.loads(line)
        obj["seq"], obj["prev"] = seq, prev
        if "auth" in obj:
            obj["hash"] = auth_hash(prev, seq, from_bytes(bytes.fromhex(obj["auth"])))
        else:
            s = SignedReceipt(
                decode(bytes.fromhex(obj["body"])),
                *(bytes.fromhex(obj[k]) for k in ("leader_key", "leader_sig", "device_key", "device_sig")),
            )
            obj["hash"] = entry_hash(prev, seq, s)
        if keeper is not None:
            obj["keeper_sig"] = keeper.sign(keeper_bytes(seq, prev, obj["hash"])).hex()
        prev = obj["hash"]
        out.append(json.dumps(obj, separators=(",", ":")) + "\n")
    if keeper is not None:
        key = keeper.public_key_raw
        head.write_text(
            json.dumps(
                {
                    "count": len(out),
                    "hash": prev,
                    "keeper_key": key.hex(),
                    "sig": keeper.sign(head_bytes(len(out), prev, key)).hex(),
                }
            )
        )
    return out


def line_of(s: SignedReceipt) -> str:
    obj = {
        "seq": 0,
        "prev": "0" * 64,
        "body": encode(s.receipt).hex(),
        "leader_key": s.leader_key.hex(),
        "leader_sig": s.leader_sig.hex(),
        "device_key": s.device_key.hex(),
        "device_sig": s.device_sig.hex(),
        "hash": "0" * 64,
        "keeper_sig": "00" * 64,
    }
    return json.dumps(obj, separators=(",", ":")) + "\n"


def field_changed(lines: list[str], me: Identity) -> list[str]:
    obj = json.loads(lines[1])
    body = decode(bytes.fromhex(obj["body"]))
    obj["body"] = encode(replace(body, device_seconds=body.device_seconds * 100)).hex()
    lines[1] = json.dumps(obj, separators=(",", ":")) + "\n"
    return lines


def self_made_keys(me: Identity) -> str:
    leader, device = Identity.generate(), Identity.generate()
    forged = receipt(me.peer_id, leader.peer_id, device.peer_id, 50, seconds=3600.0 * 1000)
    return line_of(countersign(device, sign_leader(leader, forged)))


def as_the_owner(me: Identity) -> str:
    impostor, device = Identity.generate(), Identity.generate()
    forged = receipt(me.peer_id, me.peer_id, device.peer_id, 50, seconds=3600.0 * 1000)
    leader_sig = impostor.sign(LEADER_DOMAIN + encode(forged))
    device_sig = device.sign(DEVICE_DOMAIN + encode(forged) + leader_sig)
    return line_of(SignedReceipt(forged, impostor.public_key_raw, leader_sig, device.public_key_raw, device_sig))


Forgery = Callable[[list[str], Identity], tuple[list[str], bool]]
"""Lines -> (forged lines, whether to recompute the chain)."""

FORGERIES: dict[str, tuple[Forgery, str]] = {
    "field changed": (lambda ls, me: (field_changed(ls, me), False), "line 2: its hash does not match"),
    "changed and re-chained": (lambda ls, me: (field_changed(ls, me), True), "line 2 (receipt job efefefefefef leader"),
    "removed and re-chained": (lambda ls, me: (ls[:1] + ls[2:], True), "line 2 (receipt job"),
    "self-made keys for the real job and owner": (
        lambda ls, me: ([*ls, self_made_keys(me)], True),
        "line 6 (receipt job efefefefefef leader",
    ),
    "forged as the owner": (lambda ls, me: ([*ls, as_the_owner(me)], True), "line 6 (receipt job"),
}
WHY = {
    "field changed": "",
    "changed and re-chained": "the leader's signature does not verify",
    "removed and re-chained": "the keeper's signature does not hold",
    "self-made keys for the real job and owner": "neither the job's owner nor a leader the owner authorised",
    "forged as the owner": "the leader key is not the receipt's leader",
}
"""Why each is refused, whether or not the forger holds the keeper's key (the first check that fails). A keeper
that removes one of its own receipts and signs the rest again is the one forgery its own ledger cannot show (its
counterpart's ledger holds the receipt)."""


def forge(state: Path, me: Identity, name: str, with_keeper_key: bool) -> None:
    """Apply forgery ``name`` to the ledger in ``state`` (kept by ``me``), recomputing the chain where the forgery
    does; ``with_keeper_key``: the forger also signs every line and the head with the keeper's key."""
    path = state / LEDGER_FILE
    how, _ = FORGERIES[name]
    lines, recompute = how(path.read_text().splitlines(keepends=True), me)
    if recompute:
        lines = rechain(lines, me if with_keeper_key else None, state / HEAD_FILE)
    path.write_text("".join(lines))


def keeper_can_hide(name: str, with_keeper_key: bool) -> bool:
    """Whether the forgery is the one the keeper's own ledger cannot show: the keeper removes one of its own
    receipts and signs the rest again (its counterpart's ledger holds the receipt; ``docs/threat-model.md``)."""
    return with_keeper_key and name == "removed and re-chained"
