"""The owner's collection of its job's receipts: what a keeper hands over (its owner's receipts only, paged, each
once), what the owner keeps (only receipts of its job, signed by a leader it knows, whose signatures verify), and
that a receipt held twice (the leader's copy and the device's countersigned one) is counted once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from arceusd.base.identity import Identity
from arceusd.market.authority import authorise
from arceusd.market.collect import MAX_START, accept, kept_for, new_ones, page, to_entry, unique
from arceusd.market.ledger import Ledger, bill, earnings
from arceusd.market.receipts import Receipt, ReceiptError, SignedReceipt, countersign, sign_leader
from protocol.market_wire import RECEIPTS_PER_BATCH

OWNER = Identity.generate()
STANDBY = Identity.generate()
DEV = Identity.generate()
STRANGER = Identity.generate()
JOB = "ab" * 16


def signed(
    leader: Identity = STANDBY,
    device: Identity = DEV,
    step: int = 10,
    job: str = JOB,
    owner: Identity = OWNER,
    counter: bool = True,
) -> SignedReceipt:
    r = Receipt(job, owner.peer_id, leader.peer_id, device.peer_id, 2, 3, step - 10, step, 30.0, 1e12, 0.3, 1.7e9)
    s = sign_leader(leader, r)
    return countersign(device, s) if counter else s


LEADERS = {OWNER.peer_id, STANDBY.peer_id}


def test_the_owner_keeps_a_receipt_of_its_job_signed_by_a_leader_it_knows() -> None:
    s = signed()
    assert accept(to_entry(s), JOB, OWNER.peer_id, LEADERS) == s
    plain = signed(counter=False)
    assert accept(to_entry(plain), JOB, OWNER.peer_id, LEADERS) == plain


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: to_entry(signed(job="cd" * 16)), "not this job"),
        (lambda: to_entry(signed(owner=STRANGER)), "names another owner"),
        (lambda: to_entry(signed(leader=STRANGER)), "did not lead this job"),
        (lambda: replace(to_entry(signed()), leader_sig=bytes(64)), "leader's signature does not verify"),
        (lambda: replace(to_entry(signed()), device_sig=bytes(64)), "countersignature does not verify"),
        (lambda: replace(to_entry(signed()), device_key=STRANGER.public_key_raw), "device key is not"),
        (lambda: replace(to_entry(signed()), device_sig=b""), "device key without a countersignature"),
        (lambda: replace(to_entry(signed()), body=to_entry(signed()).body[:-1]), "not msgpack"),
    ],
)
def test_what_the_owner_refuses(make: object, message: str) -> None:
    with pytest.raises(ReceiptError, match=message):
        accept(make(), JOB, OWNER.peer_id, LEADERS)  # type: ignore[operator]


def test_a_keeper_hands_the_owner_its_receipts_only_paged_and_each_once() -> None:
    mine = [signed(step=10 * (i + 1)) for i in range(RECEIPTS_PER_BATCH + 5)]
    other_owner = signed(owner=STRANGER, step=10)
    entries = [*mine, signed(step=10, counter=False), other_owner, signed(job="cd" * 16)]
    kept = kept_for(entries, JOB, OWNER.peer_id)
    assert kept == mine, "only this job's and this owner's; the uncountersigned copy gives way to the signed one"
    first = page(kept, JOB, 0)
    assert len(first.entries) == RECEIPTS_PER_BATCH and first.more
    second = page(kept, JOB, RECEIPTS_PER_BATCH)
    assert len(second.entries) == 5 and not second.more
    assert not page(kept, JOB, MAX_START + 1).entries and "start must be" in page(kept, JOB, -1).reason


def test_new_ones_and_a_receipt_held_twice_counts_once(tmp_path: Path) -> None:
    plain, both = signed(counter=False), signed()
    assert new_ones([plain], [plain, both]) == [both], "the countersigned copy is new; the same plain one is not"
    assert new_ones([both], [plain, both]) == []
    ledger = Ledger.open(tmp_path)
    ledger.authorise(authorise(OWNER, JOB, STANDBY.peer_id, 1.7e9))  # the standby's receipts need the owner's word
    for s in (plain, both, both, signed(leader=OWNER, step=20)):
        ledger.append(s)
    assert len(unique(ledger.entries)) == 2
    owed, earned = bill(ledger.entries, JOB), earnings(ledger.entries, DEV.peer_id)
    assert owed["unaccepted_receipts"] == 0 and earned["receipts"] == 2
    assert owed["total_usd"] == pytest.approx(2 * 30.0 / 3600 * 0.3) == pytest.approx(earned["total_usd"])
