"""Issue 29: a ledger proves who signed what. ``verify-ledger`` and ``bill`` refuse each of five forgeries of an
owner's ledger with one line naming the receipt and why (a field changed; changed and the chain recomputed; a
receipt removed and the chain recomputed; a receipt forged with two self-made keys naming the real job and owner;
one forged as the owner), whether or not the forger also holds the keeper's key; an empty file and a ledger cut
short are not ledgers; a daemon's ledger signed by another key is refused when opened."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from arceusd.base.identity import Identity, load_or_create_identity
from arceusd.cli.commands import cli
from arceusd.market.authority import authorise
from arceusd.market.ledger import HEAD_FILE, Ledger, LedgerError, verify_file
from arceusd.market.receipts import sign_leader
from tests.adversarial.ledger_forgeries import (
    DEV_A,
    FORGERIES,
    JOB,
    STANDBY,
    WHY,
    forge,
    keeper_can_hide,
    owners_ledger,
    receipt,
    rechain,
)


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
    forge(state, me, name, with_keeper_key)
    if keeper_can_hide(name, with_keeper_key):
        # the keeper's own key re-signs what it likes of its own ledger: only another party's copy shows this
        assert verify_file(path).ok
        return
    where, why = FORGERIES[name][1], WHY[name]
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
