"""Issue 29: a ledger proves who signed what. ``verify-ledger`` and ``bill`` refuse each of five forgeries of an
owner's ledger with one line naming the receipt and why (a field changed; changed and the chain recomputed; a
receipt removed and the chain recomputed; a receipt forged with two self-made keys naming the real job and owner;
one forged as the owner), whether or not the forger also holds the keeper's key; an empty file and a ledger cut
short are not ledgers; a daemon's ledger signed by another key is refused when opened."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from arceusd.base.identity import Identity, load_or_create_identity
from arceusd.cli.commands import cli
from arceusd.market.authority import authorise, from_bytes
from arceusd.market.ledger import (
    HEAD_FILE,
    Ledger,
    LedgerError,
    auth_hash,
    entry_hash,
    head_bytes,
    keeper_bytes,
    verify_file,
)
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


@pytest.mark.parametrize("with_keeper_key", [False, True], ids=["forger", "keeper-forges"])
@pytest.mark.parametrize("name", list(FORGERIES))
def test_verify_ledger_and_bill_refuse_each_forgery_with_one_line(
    tmp_path: Path, name: str, with_keeper_key: bool
) -> None:
    state = tmp_path / "state"
    me = owners_ledger(state)
    path = state / "ledger.jsonl"
    runner = CliRunner()
    honest = runner.invoke(cli, ["--state-dir", str(state), "bill", JOB[:8], "--json"])
    assert honest.exit_code == 0, honest.output
    assert json.loads(honest.output)["total_usd"] == pytest.approx(4 * 0.5)
    forge, where = FORGERIES[name]
    lines, recompute = forge(path.read_text().splitlines(keepends=True), me)
    if recompute:
        lines = rechain(lines, me if with_keeper_key else None, state / HEAD_FILE)
    path.write_text("".join(lines))
    if with_keeper_key and name == "removed and re-chained":
        # the keeper's own key re-signs what it likes of its own ledger: only another party's copy shows this
        assert verify_file(path).ok
        return
    why = WHY[name]
    for args in (["verify-ledger", str(path)], ["bill", JOB[:8]]):
        out = runner.invoke(cli, ["--state-dir", str(state), *args])
        assert out.exit_code != 0, (args, out.output)
        errors = [ln for ln in out.output.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1 and where in errors[0] and why in errors[0], (args, out.output)
    assert not Ledger.open(state).verified.ok, "a daemon restarted on the forged ledger would report it ok"


def test_receipts_removed_from_the_end_an_empty_file_and_another_keeper_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    owners_ledger(state)
    path = state / "ledger.jsonl"
    whole = path.read_text()
    path.write_text("".join(whole.splitlines(keepends=True)[:-2]))
    assert "line(s) 4..5 were removed" in verify_file(path).error
    path.write_text("")
    assert "the file is empty" in verify_file(path).error
    out = CliRunner().invoke(cli, ["--state-dir", str(state), "verify-ledger", str(path)])
    assert out.exit_code != 0 and "empty" in out.output
    (state / HEAD_FILE).unlink()
    path.write_text(whole)
    assert "no signed head" in verify_file(path).error
    # every line and the head signed again by another key: a valid ledger, but not this daemon's
    other = Identity.generate()
    path.write_text("".join(rechain(whole.splitlines(keepends=True), other, state / HEAD_FILE)))
    assert verify_file(path).ok
    assert "not by this daemon" in Ledger.open(state).verified.error


def test_a_receipt_from_a_leader_the_owner_did_not_authorise_is_not_appended(tmp_path: Path) -> None:
    me = load_or_create_identity(tmp_path)
    ledger = Ledger.open(tmp_path, me)
    with pytest.raises(LedgerError, match="did not authorise"):
        ledger.append(sign_leader(STANDBY, receipt(me.peer_id, STANDBY.peer_id, DEV_A.peer_id, 10)))
    stranger = Identity.generate()
    with pytest.raises(LedgerError, match="invalid authorisation"):
        ledger.authorise(replace(authorise(stranger, JOB, STANDBY.peer_id, 1.0), owner_key=me.public_key_raw))
    assert ledger.authorise(authorise(me, JOB, STANDBY.peer_id, 1.0))
    assert not ledger.authorise(authorise(me, JOB, STANDBY.peer_id, 2.0)), "kept once"
    ledger.append(sign_leader(STANDBY, receipt(me.peer_id, STANDBY.peer_id, DEV_A.peer_id, 10)))
    assert Ledger.open(tmp_path, me).verified.ok
