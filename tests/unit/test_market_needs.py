"""Matching an offer against a job's needs and the owner's policy, the demand count, and the quote."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arceusd.jobs.spec.schema import parse_spec
from arceusd.market.needs import DeviceOffer, JobNeeds, Unfit, demand_in_view, match, pay
from arceusd.market.policy import LAPTOP, Policy, Reason
from arceusd.market.pricing import CLOUD_GPUS, TYPICAL_LAPTOP_FLOPS, Demand, price_per_hour
from arceusd.market.probes import Snapshot
from arceusd.market.quote import job_flops, quote, quote_lines
from tests.unit.test_jobspec import ROOT, gpt_doc

IDLE = Snapshot(3600.0, True, 90.0, 1.0, 3)
LAPTOP_DEVICE = DeviceOffer("aa" * 16, "cpu", 8 << 30, TYPICAL_LAPTOP_FLOPS)
OWNER = "bb" * 16


def job(**kw: object) -> JobNeeds:
    base: dict[str, object] = {"job_id": "cc" * 16, "owner": OWNER, "model_params": 10**6, "members": 1}
    return JobNeeds(**{**base, **kw})  # type: ignore[arg-type]


def unfits(m: object) -> set[object]:
    return {getattr(r, "unfit", None) or getattr(r, "reason", None) for r in m.reasons}  # type: ignore[attr-defined]


def test_a_job_without_needs_takes_an_idle_device_at_the_market_price() -> None:
    m = match(LAPTOP_DEVICE, Policy(), IDLE, job())
    assert m.qualifies and m.price_per_hour == pytest.approx(0.30)


def test_a_device_whose_lowest_price_is_above_the_jobs_highest_does_not_qualify() -> None:
    m = match(LAPTOP_DEVICE, Policy(min_price_per_hour=0.50), IDLE, job(max_price_per_hour=0.40))
    assert not m.qualifies and unfits(m) == {Reason.PRICE_TOO_LOW}
    assert "$0.3000/h < $0.5000/h" in m.why_not()  # the market price, under the job's highest, under the floor
    m = match(LAPTOP_DEVICE, Policy(min_price_per_hour=0.25), IDLE, job(max_price_per_hour=0.27))
    assert m.qualifies and m.price_per_hour == 0.27  # the job's highest caps what it pays
    assert not match(LAPTOP_DEVICE, Policy(min_price_per_hour=0.28), IDLE, job(max_price_per_hour=0.27)).qualifies


def test_kind_memory_and_fullness() -> None:
    gpu = DeviceOffer("aa" * 16, "mps", 4 << 30, TYPICAL_LAPTOP_FLOPS)
    assert match(gpu, Policy(), IDLE, job(device_kinds=("mps",))).qualifies
    assert unfits(match(gpu, Policy(gpu=False), IDLE, job(device_kinds=("mps",)))) == {Unfit.KIND}
    assert unfits(match(gpu, Policy(), IDLE, job(memory_per_device_mib=8192))) == {Unfit.MEMORY}
    assert unfits(match(gpu, Policy(max_memory_mib=512), IDLE, job(memory_per_device_mib=1024))) == {Unfit.MEMORY}
    assert unfits(match(gpu, Policy(), IDLE, job(members=3, max_members=3))) == {Unfit.FULL}
    assert unfits(match(gpu, Policy(), IDLE, job(), member=True)) == {Unfit.ALREADY}


def test_policy_reasons_come_through() -> None:
    busy = Snapshot(5.0, False, 90.0, 1.0, 3)
    m = match(LAPTOP_DEVICE, replace(LAPTOP, owners=("dd" * 16,)), busy, job())
    assert unfits(m) == {Reason.NOT_IDLE, Reason.ON_BATTERY, Reason.OWNER_NOT_ALLOWED}


@given(st.floats(0, 2), st.floats(0, 2), st.floats(1e9, 1e14))
def test_a_device_joins_only_at_a_pay_between_its_floor_and_the_jobs_highest(
    floor: float, cap: float, flops: float
) -> None:
    offer = DeviceOffer("aa" * 16, "cpu", 1 << 30, flops)
    m = match(offer, Policy(min_price_per_hour=floor), IDLE, job(max_price_per_hour=cap))
    assert m.price_per_hour == pay(flops, cap) <= price_per_hour(flops)
    assert m.qualifies == (m.price_per_hour >= floor)
    if m.qualifies and cap:
        assert floor <= m.price_per_hour <= cap
    if cap and floor > cap:
        assert not m.qualifies


def test_max_cores() -> None:
    four = DeviceOffer("aa" * 16, "cpu", 1 << 30, 1e11, threads=4)
    assert unfits(match(four, Policy(max_cores=2), IDLE, job())) == {Unfit.CORES}
    assert match(four, Policy(max_cores=4), IDLE, job()).qualifies


def test_demand_counts_jobs_that_want_devices_against_idle_ones() -> None:
    jobs = [job(), job(members=2, max_members=2), job(members=1, max_members=4)]
    assert demand_in_view(jobs, alive_devices=10, busy_devices=4) == Demand(2, 6)
    assert demand_in_view([], alive_devices=1, busy_devices=3) == Demand(0, 0)


def test_job_needs_and_flops_from_a_spec() -> None:
    doc = gpt_doc()
    doc["needs"] = {"max_price_per_hour": 0.2, "device_kinds": ["cpu"], "max_members": 3}
    spec = parse_spec(doc, base_dir=ROOT, check_files=True)
    needs = JobNeeds.from_spec("cc" * 16, OWNER, spec, 2)
    assert needs.max_price_per_hour == 0.2 and needs.device_kinds == ("cpu",) and needs.max_members == 3
    assert needs.model_params > 0
    flops = job_flops(spec)
    assert flops > 0
    doc["training"]["steps"] = 100
    assert job_flops(parse_spec(doc, base_dir=ROOT, check_files=True)) == pytest.approx(flops * 2)


def test_quote_figures() -> None:
    q = quote(3.6e15, 2, 1e12, efficiency=0.5, budget_usd=0.01, deadline_hours=0.5)
    assert q.hours == pytest.approx(1.0)  # 3.6e15 / (2 x 0.5e12) s = 3600 s
    assert q.usd == pytest.approx(1 * price_per_hour(1e12))  # the other device's hour: the owner's is not billed
    assert "for 1 paid device(s): your own is not billed" in "\n".join(quote_lines(q))
    assert quote(3.6e15, 1, 1e12).usd == 0.0  # the owner's device alone costs its owner nothing
    assert not q.within_budget and not q.within_deadline
    assert [c.name for c in q.cloud] == [g.name for g in CLOUD_GPUS]
    text = "\n".join(quote_lines(q))
    assert "the budget cannot be met: about $" in text and "over needs.budget_usd $0.010000" in text
    assert "the deadline cannot be met: about 60.0 min on 2 device(s), past needs.deadline_hours 0.5 h" in text
    assert "H100" in text
    capped = quote(3.6e15, 2, 1e12, efficiency=0.5, max_price_per_hour=0.001)
    assert capped.price_per_device_hour == 0.001 and capped.usd == pytest.approx(0.001) and not capped.problems()
    with pytest.raises(ValueError):
        quote(1.0, 0, 1e12)


def test_full_efficiency_quote_is_cheaper_than_every_cloud_gpu() -> None:
    q = quote(1e18, 4, TYPICAL_LAPTOP_FLOPS)
    assert all(q.usd < c.usd for c in q.cloud)


def test_the_markets_outlook_counts_the_owners_device_as_the_unpaid_one() -> None:
    """A device that only saw a job's announce knows none of its members: the outlook still counts the owner's
    device (the one the quote leaves unpaid) beside this one, so a budget one device-second cannot pay warns."""
    from types import SimpleNamespace

    from arceusd.market.pricing import NEUTRAL
    from arceusd.market.service import Market

    doc = gpt_doc()
    doc["needs"] = {"budget_usd": 1e-12}
    spec = parse_spec(doc, base_dir=ROOT, check_files=True)
    seen = SimpleNamespace(
        spec=spec, total_steps=spec.training.steps, step=0, owner="bb" * 16, created=0.0, member_ids=lambda: []
    )
    warnings = Market.outlook(seen, LAPTOP_DEVICE, 1.0, NEUTRAL, member=False)
    assert any(w.startswith("the budget cannot be met: about $") and "on 2 device(s)" in w for w in warnings), warnings
