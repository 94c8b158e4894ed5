"""Receipts: canonical encoding and signatures, the leader's book (work bounded by the plan, never for steps a
device did not work), the device's check, and the hash-chained ledger (a tampered line is found)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from arceusd.base.identity import Identity
from arceusd.market.ledger import Ledger, LedgerError, bill, earnings, verify_file
from arceusd.market.receipts import (
    PLAN_SLACK,
    Commit,
    DeviceRecord,
    LeaderBook,
    Receipt,
    ReceiptError,
    countersign,
    decode,
    device_check,
    encode,
    most_per_step_usd,
    sign_leader,
)

LEADER = Identity.generate()
DEV_A = Identity.generate()
DEV_B = Identity.generate()
JOB = "cd" * 16


def receipt(**kw: object) -> Receipt:
    base: dict[str, object] = dict(
        job_id=JOB,
        owner=LEADER.peer_id,
        leader=LEADER.peer_id,
        device=DEV_A.peer_id,
        term=1,
        epoch=1,
        step_from=0,
        step_to=10,
        device_seconds=36.0,
        flops=1e12,
        price_per_hour=0.3,
        issued_at=1.7e9,
    )
    return Receipt(**{**base, **kw})  # type: ignore[arg-type]


def commit(step: int, at: float, reported: set[str], epoch: int = 1, **kw: object) -> Commit:
    shares = {DEV_A.peer_id: 0.25, DEV_B.peer_id: 0.75}
    base: dict[str, object] = dict(
        job_id=JOB,
        owner=LEADER.peer_id,
        term=1,
        epoch=epoch,
        step=step,
        at=at,
        reported=frozenset(reported),
        shares=shares,
        flops_per_step=1e9,
        predicted_step_s=0.5,
        prices={p: 0.3 for p in shares},
    )
    return Commit(**{**base, **kw})  # type: ignore[arg-type]


# --- encoding and signatures ---------------------------------------------------------------------------------
def test_encoding_is_canonical_and_round_trips() -> None:
    r = receipt()
    assert decode(encode(r)) == r
    assert encode(r) == encode(receipt())
    assert r.usd == pytest.approx(0.003)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(term=1.0), "term must be int"),
        (lambda d: d.update(flops=5), "flops must be float"),
        (lambda d: d.pop("price_per_hour"), "exactly the fields"),
        (lambda d: d.update(device="XY"), "device must be 32"),
        (lambda d: d.update(step_to=0), "steps out of range"),
        (lambda d: d.update(flops=float("nan")), "flops must be a finite"),
    ],
)
def test_malformed_bodies_are_refused(mutate: object, message: str) -> None:
    d = {k: getattr(receipt(), k) for k in msgpack.unpackb(encode(receipt()))}
    mutate(d)  # type: ignore[operator]
    with pytest.raises(ReceiptError, match=message):
        decode(msgpack.packb(d, use_bin_type=True))


def test_signatures_are_domain_separated_and_bound_to_the_named_peers() -> None:
    signed = sign_leader(LEADER, receipt())
    signed.verify(require_device=False)
    with pytest.raises(ReceiptError, match="not countersigned"):
        signed.verify()
    both = countersign(DEV_A, signed)
    both.verify()
    with pytest.raises(ReceiptError, match="only the receipt's device"):
        countersign(DEV_B, signed)
    with pytest.raises(ReceiptError, match="only the receipt's leader"):
        sign_leader(DEV_A, receipt())
    forged = replace(both, receipt=replace(both.receipt, price_per_hour=3.0))
    with pytest.raises(ReceiptError, match="leader's signature"):
        forged.verify()
    swapped = replace(both, device_sig=LEADER.sign(b"arceus-receipt-countersign-v1\x00" + encode(both.receipt)))
    with pytest.raises(ReceiptError, match="device's countersignature"):
        swapped.verify()
    other_key = replace(both, leader_key=DEV_B.public_key_raw)
    with pytest.raises(ReceiptError, match="leader key is not"):
        other_key.verify()


# --- the leader's book ---------------------------------------------------------------------------------------
def test_receipts_follow_commits_and_shares() -> None:
    book = LeaderBook()
    first = book.issue(LEADER.peer_id, commit(10, 100.0, {DEV_A.peer_id, DEV_B.peer_id}))
    assert [(r.device, r.step_from, r.step_to) for r in first] == sorted(
        [(DEV_A.peer_id, 0, 10), (DEV_B.peer_id, 0, 10)]
    )
    a = next(r for r in first if r.device == DEV_A.peer_id)
    assert a.flops == pytest.approx(10 * 0.25 * 1e9)
    assert a.device_seconds == pytest.approx(10 * 0.5 * PLAN_SLACK)  # 100 s measured, bounded by the plan
    second = book.issue(LEADER.peer_id, commit(20, 104.0, {DEV_A.peer_id, DEV_B.peer_id}))
    assert {(r.step_from, r.step_to, r.device_seconds) for r in second} == {(10, 20, 4.0)}


def test_no_receipt_for_steps_a_device_did_not_work() -> None:
    book = LeaderBook()
    book.issue(
        LEADER.peer_id, commit(40, 10.0, {DEV_B.peer_id}, shares={DEV_B.peer_id: 1.0}, prices={DEV_B.peer_id: 0.3})
    )
    # A joins; the plan is redone (epoch 2) from step 40: A is paid from 40, never for 0..40
    joined = book.issue(LEADER.peer_id, commit(50, 20.0, {DEV_A.peer_id, DEV_B.peer_id}, epoch=2))
    a = next(r for r in joined if r.device == DEV_A.peer_id)
    assert (a.step_from, a.step_to, a.epoch) == (40, 50, 2)
    # a device that reported no shard of the step gets nothing, nor one outside the plan
    stranger = Identity.generate().peer_id
    assert book.issue(LEADER.peer_id, commit(60, 30.0, {DEV_B.peer_id, stranger}, epoch=2))[0].device == DEV_B.peer_id
    assert len(book.issue(LEADER.peer_id, commit(60, 30.0, {DEV_B.peer_id}, epoch=2))) == 0  # nothing twice
    later = book.issue(LEADER.peer_id, commit(70, 40.0, {DEV_A.peer_id}, epoch=2))
    assert [(r.step_from, r.step_to) for r in later] == [(50, 70)]
    # a device the plan gives no work (share 0) gets nothing, whatever it reported
    idle = book.issue(
        LEADER.peer_id,
        commit(80, 50.0, {DEV_A.peer_id, DEV_B.peer_id}, epoch=2, shares={DEV_A.peer_id: 0.0, DEV_B.peer_id: 1.0}),
    )
    assert [r.device for r in idle] == [DEV_B.peer_id]


def test_the_owners_own_device_is_not_billed_to_the_owner(tmp_path: Path) -> None:
    """Issue 31: the owner's device trains in its own job, and its owner was billed for it (and it earned from its
    own job). No receipt is issued to it, whoever leads; the budget's cap per step leaves it out; a ledger from
    before the rule that holds such a receipt bills and earns nothing of it, and the bill still equals the sum of
    the devices' earnings."""
    shares = {LEADER.peer_id: 0.5, DEV_A.peer_id: 0.5}
    both = {LEADER.peer_id, DEV_A.peer_id}
    c = commit(10, 100.0, both, shares=shares, prices={p: 0.3 for p in shares})
    assert [r.device for r in LeaderBook().issue(LEADER.peer_id, c)] == [DEV_A.peer_id]
    assert [r.device for r in LeaderBook().issue(DEV_B.peer_id, c)] == [DEV_A.peer_id]  # a standby leading
    assert most_per_step_usd(c) == pytest.approx(0.5 * PLAN_SLACK * 0.3 / 3600.0)  # A's price alone
    ledger = Ledger.open(tmp_path)
    for device in (LEADER, DEV_A):  # the owner's own receipt, as the leader issued it before
        ledger.append(countersign(device, sign_leader(LEADER, receipt(device=device.peer_id))))
    owed = bill(ledger.entries, JOB)
    assert owed["by_device"] == {DEV_A.peer_id: pytest.approx(receipt().usd)} and owed["own_device_receipts"] == 1
    own, a = earnings(ledger.entries, LEADER.peer_id), earnings(ledger.entries, DEV_A.peer_id)
    assert own["by_job"] == {} and own["receipts"] == 0
    assert owed["total_usd"] == pytest.approx(own["total_usd"] + a["total_usd"])


@given(st.lists(st.tuples(st.integers(1, 30), st.booleans(), st.booleans(), st.booleans()), max_size=30))
def test_paid_ranges_never_overlap_and_lie_within_plans_the_device_reported_in(
    events: list[tuple[int, bool, bool, bool]],
) -> None:
    book, step, epoch, at = LeaderBook(), 0, 1, 0.0
    member_since = {DEV_A.peer_id: 0, DEV_B.peer_id: 0}
    paid: dict[str, list[tuple[int, int]]] = {DEV_A.peer_id: [], DEV_B.peer_id: []}
    for advance, a_reports, b_reports, new_epoch in events:
        if new_epoch:
            epoch += 1
            member_since = {p: step for p in member_since}
        step, at = step + advance, at + advance
        reported = {p for p, yes in ((DEV_A.peer_id, a_reports), (DEV_B.peer_id, b_reports)) if yes}
        for r in book.issue(LEADER.peer_id, commit(step, at, reported, epoch=epoch)):
            assert r.device in reported
            assert r.step_from >= member_since[r.device]  # nothing from before the current plan started
            assert all(not (r.step_from < hi and lo < r.step_to) for lo, hi in paid[r.device])
            paid[r.device].append((r.step_from, r.step_to))
            assert r.device_seconds <= r.steps * 0.5 * PLAN_SLACK + 1e-9
    assert all(0 <= lo < hi <= step for ranges in paid.values() for lo, hi in ranges)


# --- the device's check --------------------------------------------------------------------------------------
def test_device_countersigns_only_what_its_worker_did() -> None:
    rec = DeviceRecord(
        JOB, DEV_A.peer_id, epoch=1, last_step=10, since=1000.0, flops_per_step=1e9, min_price_per_hour=0.2
    )
    good = receipt(step_to=10, flops=10 * 0.25e9, device_seconds=30.0)
    assert device_check(good, rec, now=1040.0) == []
    assert "worker reached 10" in device_check(replace(good, step_to=12), rec, 1040.0)[0]
    assert "whole model" in device_check(replace(good, flops=1e12), rec, 1040.0)[0]
    assert "device-seconds" in device_check(replace(good, device_seconds=100.0), rec, 1040.0)[0]
    assert "lowest" in device_check(replace(good, price_per_hour=0.1), rec, 1040.0)[0]
    assert "not this device" in device_check(replace(good, device=DEV_B.peer_id), rec, 1040.0)[0]


# --- the ledger ----------------------------------------------------------------------------------------------
def filled(tmp_path: Path, n: int = 4) -> Ledger:
    ledger = Ledger.open(tmp_path)
    for i in range(n):
        dev = DEV_A if i % 2 == 0 else DEV_B
        r = receipt(device=dev.peer_id, step_from=10 * i, step_to=10 * i + 10, issued_at=1.7e9 + 86400 * (i // 2))
        signed = sign_leader(LEADER, r)
        ledger.append(countersign(dev, signed) if i < n - 1 else signed)
    return ledger


def test_ledger_appends_and_verifies_on_open(tmp_path: Path) -> None:
    filled(tmp_path)
    again = Ledger.open(tmp_path)
    assert again.verified.ok and len(again.entries) == 4
    assert (tmp_path / "ledger.jsonl").stat().st_mode & 0o777 == 0o600


def test_earnings_and_bill_agree(tmp_path: Path) -> None:
    ledger = filled(tmp_path)
    a, b = earnings(ledger.entries, DEV_A.peer_id), earnings(ledger.entries, DEV_B.peer_id)
    owed = bill(ledger.entries, JOB)
    assert a["receipts"] == 2 and b["receipts"] == 1  # B's second receipt is not countersigned
    assert owed["unaccepted_receipts"] == 1
    assert owed["total_usd"] == pytest.approx(a["total_usd"] + b["total_usd"])
    assert len(a["by_day"]) == 2 and a["by_job"] == {JOB: pytest.approx(a["total_usd"])}


def _edit(line: str, key: str, change: object) -> str:
    obj = json.loads(line)
    obj[key] = change(obj[key])  # type: ignore[operator]
    return json.dumps(obj, separators=(",", ":")) + "\n"


@pytest.mark.parametrize(
    "tamper, found",
    [
        (lambda lines: lines.__setitem__(1, lines[1].replace('"seq":1', '"seq":7')), "line 2: seq 7"),
        (lambda lines: lines.pop(1), "line 2: seq 2"),
        (
            lambda lines: lines.__setitem__(
                2, _edit(lines[2], "hash", lambda h: ("1" if h[0] == "0" else "0") + h[1:])
            ),
            "line 3: its hash does not match",
        ),
        (lambda lines: lines.__setitem__(1, _edit(lines[1], "device_sig", lambda h: "")), "line 2: its hash"),
        (lambda lines: lines.insert(0, lines[0]), "line 2: seq 0"),
        (lambda lines: lines.__setitem__(3, "{not json\n"), "line 4: not JSON"),
    ],
)
def test_a_tampered_line_is_found(tmp_path: Path, tamper: object, found: str) -> None:
    filled(tmp_path)
    path = tmp_path / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    tamper(lines)  # type: ignore[operator]
    path.write_text("".join(lines))
    result = verify_file(path)
    assert not result.ok and found in result.error, result.error
    reopened = Ledger.open(tmp_path)
    assert not reopened.verified.ok
    with pytest.raises(LedgerError, match="did not verify"):
        reopened.append(sign_leader(LEADER, receipt()))


def test_a_changed_receipt_with_a_recomputed_chain_still_fails_its_signature(tmp_path: Path) -> None:
    from arceusd.market.ledger import entry_hash

    filled(tmp_path, 1)
    path = tmp_path / "ledger.jsonl"
    obj = json.loads(path.read_text())
    signed = sign_leader(LEADER, receipt(device=DEV_A.peer_id, step_from=0, step_to=10, issued_at=1.7e9))
    richer = replace(signed, receipt=replace(signed.receipt, device_seconds=3600.0))
    obj["body"] = encode(richer.receipt).hex()
    obj["hash"] = entry_hash(obj["prev"], 0, richer)
    path.write_text(json.dumps(obj, separators=(",", ":")) + "\n")
    assert "leader's signature" in verify_file(path).error


def test_an_unfinished_last_line_is_found(tmp_path: Path) -> None:
    filled(tmp_path, 2)
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(path.read_bytes()[:-10])
    assert "line 2: incomplete" in verify_file(path).error
