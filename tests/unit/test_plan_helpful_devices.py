"""Plans use a device only where it helps (issue 31): the daemon's plan (``planning.make_plan``) over random clusters
is never slower than the same cluster without any one of its planned devices, always gives the leader work (its
worker serves the data), and leaves out a device that only slows the step. ``training.use_all_devices`` gives
every member work where that fits (the plans before this rule)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.jobs.plans.planning import Offer, make_plan
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.jobs.spec.schema import load_spec
from partitioner import Plan, PlanError

SPEC = Path(__file__).resolve().parents[1] / "integration" / "specs" / "tiny-gpt-3.toml"
MIB = 1 << 20


def _spec(use_all: bool) -> JobSpec:
    spec = load_spec(str(SPEC))
    return dataclasses.replace(spec, training=dataclasses.replace(spec.training, use_all_devices=use_all))


HELPFUL, EVERY = _spec(False), _spec(True)


def _cluster(seed: int, n: int) -> tuple[list[Offer], dict[tuple[str, str], float]]:
    """``n`` devices of random speed (100x apart at most), memory and calibration; random round trips."""
    rng = random.Random(seed)
    offers = [
        Offer(
            f"{i:02d}" * 16,
            f"10.0.0.{i}:1",
            rng.uniform(1e9, 1e11),
            rng.choice((8, 64, 4096)) * MIB,
            block_efficiency=rng.uniform(0.3, 1.0),
            dispatch_s=rng.uniform(0, 1e-3),
            adamw_s_per_param=rng.uniform(0, 2e-8),
            message_s=rng.uniform(0, 2e-3),
        )
        for i in range(n)
    ]
    rtt = {(a.peer_id, b.peer_id): rng.uniform(1e-4, 2e-2) for a in offers for b in offers if a.peer_id < b.peer_id}
    return offers, rtt


def _devices(p: Plan) -> set[str]:
    return {d for stage in p.stages for d in stage.devices}


def _plan(spec: JobSpec, offers: list[Offer], rtt: dict[tuple[str, str], float], leader: str) -> Plan | None:
    try:
        return make_plan(spec, offers, rtt, include=leader)[1]
    except PlanError:
        return None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(1, 5))
def test_removing_a_planned_device_never_makes_the_step_faster(seed: int, n: int) -> None:
    offers, rtt = _cluster(seed, n)
    leader = offers[0].peer_id
    p = _plan(HELPFUL, offers, rtt, leader)
    if p is None:
        return
    assert leader in _devices(p), "the leader serves the data: it is in every plan"
    for gone in _devices(p) - {leader}:
        without = _plan(HELPFUL, [o for o in offers if o.peer_id != gone], rtt, leader)
        if without is not None:  # (None: the model does not fit without it)
            assert without.predicted_step_time_s >= p.predicted_step_time_s * (1 - 1e-9), (gone, p, without)
    every = _plan(EVERY, offers, rtt, leader)
    if every is not None and len(_devices(every)) == n:
        assert every.predicted_step_time_s >= p.predicted_step_time_s * (1 - 1e-9)


def test_a_device_that_only_slows_the_step_is_a_spare_unless_every_device_is_asked_for() -> None:
    """A fast leader and a device 100x slower behind a slow link: the plan is the leader alone; asked to use every
    device, both work (and the step is predicted slower)."""
    fast, slow = "aa" * 16, "bb" * 16
    offers = [Offer(fast, "10.0.0.1:1", 5e10, 4096 * MIB), Offer(slow, "10.0.0.2:1", 5e8, 4096 * MIB)]
    rtt = {(fast, slow): 0.02}
    alone = make_plan(HELPFUL, offers, rtt, include=fast)[1]
    spread = make_plan(EVERY, offers, rtt, include=fast)[1]
    assert _devices(alone) == {fast} and _devices(spread) == {fast, slow}
    assert alone.predicted_step_time_s < spread.predicted_step_time_s
    # the leader is the slow one: it still works (it serves the data), beside the fast device or alone
    led_by_slow = make_plan(HELPFUL, offers, rtt, include=slow)[1]
    assert slow in _devices(led_by_slow)
