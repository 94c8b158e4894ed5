"""The pricing formula: the base rate at the typical laptop, monotone in FLOP/s and demand, bounded, and never
dearer than the cloud's cheapest GPU for the same FLOPs."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arceusd.market.pricing import (
    BASE_RATE_PER_HOUR,
    CLOUD_GPUS,
    CLOUD_SHARE,
    DEMAND_MAX,
    DEMAND_MIN,
    NEUTRAL,
    TYPICAL_LAPTOP_FLOPS,
    Demand,
    cheapest_cloud,
    cost_of,
    demand_factor,
    max_price_per_hour,
    price_per_hour,
)

flops = st.floats(min_value=0.0, max_value=2e15, allow_nan=False)
counts = st.integers(min_value=0, max_value=10_000)
demands = st.builds(Demand, counts, counts)


def test_typical_laptop_earns_the_base_rate_at_neutral_demand() -> None:
    assert price_per_hour(TYPICAL_LAPTOP_FLOPS) == pytest.approx(BASE_RATE_PER_HOUR)
    assert price_per_hour(TYPICAL_LAPTOP_FLOPS, Demand(3, 3)) == pytest.approx(BASE_RATE_PER_HOUR)


def test_price_is_per_flop_below_the_cap() -> None:
    assert price_per_hour(2 * TYPICAL_LAPTOP_FLOPS) == pytest.approx(2 * BASE_RATE_PER_HOUR)
    assert price_per_hour(1e11) == pytest.approx(BASE_RATE_PER_HOUR * 1e11 / TYPICAL_LAPTOP_FLOPS)


def test_demand_factor_figures() -> None:
    assert demand_factor(NEUTRAL) == 1.0
    assert demand_factor(Demand(3, 0)) == 2.0
    assert demand_factor(Demand(0, 3)) == 0.5
    assert demand_factor(Demand(1, 0)) == pytest.approx(math.sqrt(2))
    assert demand_factor(Demand(10**6, 0)) == DEMAND_MAX
    assert demand_factor(Demand(0, 10**6)) == DEMAND_MIN


def test_nothing_measured_costs_nothing() -> None:
    assert price_per_hour(0.0) == 0.0
    assert price_per_hour(float("nan")) == 0.0
    assert price_per_hour(-5.0) == 0.0
    assert cost_of(1e15, 0.0) == 0.0


def test_negative_demand_is_refused() -> None:
    with pytest.raises(ValueError, match="demand counts"):
        Demand(-1, 0)


def test_cloud_table_is_consistent() -> None:
    assert len({g.name for g in CLOUD_GPUS}) == len(CLOUD_GPUS)
    assert all(g.usd_per_hour > 0 and g.fp32_flops > 1e12 for g in CLOUD_GPUS)
    assert cheapest_cloud().usd_per_flop_hour == min(g.usd_per_flop_hour for g in CLOUD_GPUS)
    hours, dollars = CLOUD_GPUS[0].cost_for(CLOUD_GPUS[0].fp32_flops * 3600)
    assert hours == pytest.approx(1.0) and dollars == pytest.approx(CLOUD_GPUS[0].usd_per_hour)


@given(flops, flops, demands)
def test_monotone_in_flops(a: float, b: float, demand: Demand) -> None:
    lo, hi = sorted((a, b))
    assert price_per_hour(lo, demand) <= price_per_hour(hi, demand)


@given(flops, counts, counts, counts)
def test_monotone_in_demand(f: float, jobs: int, extra_jobs: int, idle: int) -> None:
    more_jobs = Demand(jobs + extra_jobs, idle)
    assert price_per_hour(f, Demand(jobs, idle)) <= price_per_hour(f, more_jobs)
    fewer_idle = Demand(jobs, idle)
    more_idle = Demand(jobs, idle + extra_jobs)
    assert price_per_hour(f, more_idle) <= price_per_hour(f, fewer_idle)


@given(flops, demands)
def test_bounded(f: float, demand: Demand) -> None:
    p = price_per_hour(f, demand)
    assert 0.0 <= p <= max_price_per_hour()
    assert p <= BASE_RATE_PER_HOUR * (min(f, 1e15) / TYPICAL_LAPTOP_FLOPS) * DEMAND_MAX + 1e-12


@given(st.floats(min_value=1e6, max_value=1e15), demands, st.floats(min_value=1e9, max_value=1e24))
def test_cheaper_than_every_cloud_gpu_for_the_same_flops(f: float, demand: Demand, work: float) -> None:
    ours = cost_of(work, f, demand)
    for gpu in CLOUD_GPUS:
        _, theirs = gpu.cost_for(work)
        assert ours <= CLOUD_SHARE * theirs * (1 + 1e-9)
