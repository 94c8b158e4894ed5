"""The leader's side of ``[needs]``: whom it admits (members, kinds, memory, budget), when the members hold the
total memory, when the budget stops a running job (never past the budget, at a steady cost per step or one that
varies within its cap), the projection, and the leader's count of what it spent."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arceusd.base.identity import Identity
from arceusd.market.admission import (
    Member,
    Spend,
    budget_stop,
    devices_for_memory,
    join_refusal,
    memory_shortfall,
    projected_usd,
)
from arceusd.market.receipts import PLAN_SLACK, Commit, LeaderBook, most_per_step_usd

BASE: dict[str, object] = dict(
    members=2,
    max_members=0,
    kinds=(),
    kind="cpu",
    lends_mib=4096,
    per_device_mib=0,
    budget_usd=0.0,
    spend=Spend(),
    remaining_steps=100,
    remaining_usd=1.0,
)


def refusal(**kw: object) -> str | None:
    return join_refusal(**{**BASE, **kw})  # type: ignore[arg-type]


def test_a_job_without_needs_admits_anyone() -> None:
    assert refusal() is None


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(members=3, max_members=3), "all the members it wants (3 of needs.max_members 3)"),
        (dict(kinds=("cuda",)), "only cuda devices (needs.device_kinds), not cpu"),
        (dict(per_device_mib=8192), "lends 4096 MiB; the job needs 8192 MiB per device"),
        (dict(budget_usd=0.5), "about $1.000000 for the remaining 100 step(s) exceed needs.budget_usd $0.500000"),
        (dict(budget_usd=1.5, spend=Spend(0.6, 0.0)), "$0.600000 spent"),
        (dict(budget_usd=1.5, spend=Spend(0.1, 0.02)), "about $2.000000 for the remaining 100"),  # measured > modelled
    ],
)
def test_what_the_leader_refuses(kw: dict[str, object], message: str) -> None:
    why = refusal(**kw)
    assert why is not None and message in why, why


def test_within_the_budget_and_below_the_maximum_it_admits() -> None:
    assert refusal(members=2, max_members=3, kinds=("cpu", "cuda"), per_device_mib=4096, budget_usd=1.0) is None


def test_members_must_hold_the_total_memory() -> None:
    assert memory_shortfall(0, []) is None
    assert memory_shortfall(3000, [1000 << 20, 2000 << 20]) is None
    short = memory_shortfall(3000, [1000 << 20, 1999 << 20])
    assert short == "waiting for members: they lend 2999 MiB of the 3000 MiB needs.memory_total_mib asks"
    assert devices_for_memory(3000, 1000) == 3 and devices_for_memory(3001, 1000) == 4
    assert devices_for_memory(0, 1000) == 1 and devices_for_memory(10, 0) == 10


def test_projection_is_the_perfect_pipeline_paid_at_each_price() -> None:
    hours, usd = projected_usd(3.6e15, [Member(1e12, 0.5, 0.3), Member(1e12, 0.5, 0.1)])
    assert hours == pytest.approx(1.0) and usd == pytest.approx(0.4)
    assert projected_usd(0.0, [Member(1e12, 1.0, 0.3)]) == (0.0, 0.0)


def test_budget_stop() -> None:
    assert budget_stop(0.0, Spend(5.0, 1.0), 10, 100, 10) is None, "no budget: never"
    assert budget_stop(1.0, Spend(5.0, 1.0), 100, 100, 10) is None, "the last checkpoint ends the job anyway"
    assert budget_stop(1.0, Spend(0.5, 0.05), 10, 100, 10) is None, "0.5 + 10 x 0.05 = the budget"
    why = budget_stop(1.0, Spend(0.6, 0.05), 10, 100, 10)
    assert why is not None and why.startswith("stopped at step 10 of 100: the budget is spent")
    assert budget_stop(1.0, Spend(0.6, 0.05), 95, 100, 10) is None, "only 5 steps to the end: 0.85"


@given(st.floats(0.001, 10.0), st.floats(1e-5, 0.5), st.integers(1, 50), st.integers(1, 500))
def test_at_a_steady_cost_per_step_a_job_never_spends_past_its_budget(
    budget: float, per_step: float, interval: int, total: int
) -> None:
    spent, step = 0.0, 0
    while step < total:
        nxt = min(total, step + interval)
        spent += per_step * (nxt - step)  # the receipts of the checkpoint at ``nxt``
        step = nxt
        if step >= total or budget_stop(budget, Spend(spent, per_step), step, total, interval) is not None:
            break
    first = per_step * min(interval, total)  # the first checkpoint is issued before anything is measured
    assert spent <= max(budget, first) * (1 + 1e-9)


@given(
    st.floats(0.001, 10.0),
    st.floats(1e-5, 0.5),
    st.integers(1, 50),
    st.integers(1, 500),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
)
def test_when_the_cost_per_step_varies_within_its_cap_a_job_never_spends_past_its_budget(
    budget: float, most: float, interval: int, total: int, fractions: list[float]
) -> None:
    """Fast intervals then a slow one (the case the measured rate alone overspent in CI): the cap bounds it."""
    spent, step, i = 0.0, 0, 0
    while step < total:
        nxt = min(total, step + interval)
        spent += most * fractions[i % len(fractions)] * (nxt - step)
        step, i = nxt, i + 1
        rate = spent / step
        if step >= total or budget_stop(budget, Spend(spent, rate, most), step, total, interval) is not None:
            break
    assert spent <= max(budget, most * min(interval, total)) * (1 + 1e-9)


def test_the_most_a_step_costs_is_every_plan_device_paid_for_the_slack() -> None:
    a, b, c, owner = (Identity.generate().peer_id for _ in range(4))
    commit = Commit(
        "ef" * 16, owner, 1, 1, 40, 1036.0, frozenset({a, b}), {a: 0.5, b: 0.5}, 1e9, 10.0, {a: 0.3, b: 0.6, c: 5.0}
    )  # c is priced but not in the plan
    assert most_per_step_usd(commit) == pytest.approx(10.0 * PLAN_SLACK * 0.9 / 3600)
    # the owner's own device in the plan is not paid (issue 31): the most a step costs leaves it out
    assert most_per_step_usd(replace(commit, owner=a)) == pytest.approx(10.0 * PLAN_SLACK * 0.6 / 3600)
    book = LeaderBook()
    book.start(0, 0.0)
    slow = book.issue(a, replace(commit, at=1e9))  # the leader's clock says far longer: paid up to the cap
    assert sum(r.usd for r in slow) == pytest.approx(most_per_step_usd(commit) * 40)


def test_the_leaders_book_counts_what_it_issued() -> None:
    a, b, owner = (Identity.generate().peer_id for _ in range(3))
    book = LeaderBook()
    book.start(20, 1000.0)  # took over at step 20 (a leads; the owner's own device is not in the plan)
    c = Commit("ef" * 16, owner, 1, 1, 40, 1036.0, frozenset({a, b}), {a: 0.5, b: 0.5}, 1e9, 10.0, {a: 0.3, b: 0.6})
    receipts = book.issue(a, c)
    assert book.spent_usd == pytest.approx(sum(r.usd for r in receipts)) == pytest.approx(36 / 3600 * 0.9)
    assert book.per_step_usd() == pytest.approx(0.009 / 20)
    assert book.spent_estimate() == pytest.approx(0.009 * 2), "steps 0-20 at the rate it measured"
