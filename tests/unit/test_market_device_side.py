"""The device's side of a receipt in the market service (``Market.on_receipt``), over a stand-in for the daemon:
a device countersigns only a receipt that its job's leader sent and signed, for steps its own worker reached,
within the time it has worked for the job; it keeps what it countersigned. And the keeper's answer to a receipts
request goes to the job's owner only."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.jobs.spec.schema import parse_spec
from arceusd.market.quote import step_flops
from arceusd.market.receipts import Receipt, decode, encode, sign_leader
from arceusd.market.service import Market
from protocol.market_wire import ReceiptOffer, ReceiptsRequest
from tests.unit.test_jobspec import ROOT, gpt_doc

LEADER = Identity.generate()
DEVICE = Identity.generate()
STRANGER = Identity.generate()
JOB = "ef" * 16


def device_market(tmp_path: Path, step: int = 30) -> tuple[Market, Any]:
    spec = parse_spec(gpt_doc(), base_dir=ROOT, check_files=True)
    job = SimpleNamespace(
        job_id=JOB,
        owner=LEADER.peer_id,
        leader=LEADER.peer_id,
        leaders={LEADER.peer_id},
        spec=spec,
        epoch=2,
        step=step,
        created=time.time() - 60.0,
        members={},
        state="running",
        role="member",
        worker=None,
    )
    node = SimpleNamespace(
        paths=SimpleNamespace(config=tmp_path / "config.toml", root=tmp_path),
        identity=DEVICE,
        jobs=SimpleNamespace(jobs={JOB: job}),
        peers=None,
        market=None,
    )
    return Market(node), job  # type: ignore[arg-type]


def offer(spec: Any, leader: Identity = LEADER, **kw: Any) -> ReceiptOffer:
    base: dict[str, Any] = dict(
        job_id=JOB,
        owner=LEADER.peer_id,
        leader=leader.peer_id,
        device=DEVICE.peer_id,
        term=3,
        epoch=2,
        step_from=20,
        step_to=30,
        device_seconds=20.0,
        price_per_hour=0.3,
        flops=10 * 0.5 * step_flops(spec),
        issued_at=time.time(),
    )
    signed = sign_leader(leader, Receipt(**{**base, **kw}))
    return ReceiptOffer(encode(signed.receipt), signed.leader_key, signed.leader_sig)


def answer(market: Market, msg: Any, sender: str = LEADER.peer_id) -> Any:
    return trio.run(market.on_receipt, SimpleNamespace(sender=sender), msg)


def test_the_device_countersigns_what_its_worker_did_and_keeps_it(tmp_path: Path) -> None:
    market, job = device_market(tmp_path)
    reply = answer(market, offer(job.spec))
    assert reply.device_sig and reply.device_key == DEVICE.public_key_raw and not reply.reason
    kept = market.ledger.entries
    assert len(kept) == 1 and kept[0].countersigned and kept[0].receipt.step_to == 30


@pytest.mark.parametrize(
    "change, sender, why",
    [
        (dict(step_to=40), None, "steps up to 40 but this device's worker reached 30"),
        (dict(epoch=3), None, "epoch 3 is newer than this device's 2"),
        (dict(device_seconds=3600.0), None, "more device-seconds than this device has worked for the job"),
        (dict(flops=1e30), None, "more FLOPs than the whole model takes for those steps"),
        ({}, STRANGER, "a receipt must come from its leader"),
        ({}, "stranger-signs", "the receipt's leader does not lead this job"),
        (dict(job_id="ab" * 16), None, "this device knows no such job"),
    ],
)
def test_the_device_refuses_a_receipt_for_work_it_did_not_do(
    tmp_path: Path, change: dict[str, Any], sender: object, why: str
) -> None:
    market, job = device_market(tmp_path)
    if sender == "stranger-signs":
        msg, frm = offer(job.spec, leader=STRANGER, **change), STRANGER.peer_id
    else:
        msg = offer(job.spec, **change)
        frm = sender.peer_id if isinstance(sender, Identity) else LEADER.peer_id
    reply = answer(market, msg, frm)
    assert not reply.device_sig and why in reply.reason, reply.reason
    assert market.ledger.entries == [], "nothing kept for a refused receipt"


def test_a_forged_leader_signature_is_refused(tmp_path: Path) -> None:
    market, job = device_market(tmp_path)
    good = offer(job.spec)
    reply = answer(market, replace(good, leader_sig=bytes(64)))
    assert not reply.device_sig and "leader's signature does not verify" in reply.reason
    body = decode(good.body)
    assert answer(market, replace(good, body=encode(replace(body, step_from=0)))).reason, "a changed body too"


def test_receipts_go_to_the_jobs_owner_only(tmp_path: Path) -> None:
    market, job = device_market(tmp_path)
    answer(market, offer(job.spec))
    ask = ReceiptsRequest(JOB, 0)
    mine = trio.run(market.on_receipts_request, SimpleNamespace(sender=LEADER.peer_id), ask)  # the owner here
    assert len(mine.entries) == 1 and not mine.more
    other = trio.run(market.on_receipts_request, SimpleNamespace(sender=STRANGER.peer_id), ask)
    assert other.entries == ()
