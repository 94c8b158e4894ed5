"""The daemon's planning step with calibrated offers: what goes into the plan inputs, and what a member checks.

``arceusd.jobs.plans.planning`` is pure: these run the leader's ``make_plan`` and the member's ``verify_start`` on a
spec parsed without data files (the facts a spec from the wire carries)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from arceusd.jobs.plans.planning import Offer, PlanRefused, encode_start, make_plan, plan_inputs, verify_start
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.jobs.spec.schema import spec_from_dict
from partitioner import inputs_to_dict

GIB = 1 << 30


def _spec(optimizer: str) -> JobSpec:
    return spec_from_dict(
        {
            "name": "cal",
            "seed": 1,
            "model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 65},
            "data": {"kind": "text", "path": "unused.txt", "val_fraction": 0.1},
            "training": {"steps": 10, "batch_size": 8, "micro_batches": 4, "optimizer": optimizer, "lr": 1e-3},
        }
    )


def _offers() -> list[Offer]:
    return [
        Offer(
            "a" * 32,
            "h:1",
            1e11,
            4 * GIB,
            block_efficiency=0.7,
            dispatch_s=3e-4,
            adamw_s_per_param=2e-9,
            sgd_s_per_param=5e-10,
            message_s=4e-4,
        ),
        Offer(
            "b" * 32,
            "h:2",
            5e10,
            4 * GIB,
            block_efficiency=0.8,
            dispatch_s=2e-4,
            adamw_s_per_param=3e-9,
            sgd_s_per_param=6e-10,
            message_s=2e-4,
        ),
    ]


@pytest.mark.parametrize("optimizer,per_param", [("adamw", (2e-9, 3e-9)), ("sgd", (5e-10, 6e-10))])
def test_offers_calibration_enters_the_plan_inputs(optimizer: str, per_param: tuple[float, float]) -> None:
    inputs = plan_inputs(_spec(optimizer), _offers(), {})
    a, b = inputs.canonical().devices
    assert (a.block_efficiency, a.dispatch_s, b.block_efficiency, b.dispatch_s) == (0.7, 3e-4, 0.8, 2e-4)
    assert (a.optimizer_s_per_param, b.optimizer_s_per_param) == per_param  # the job's optimizer's cost
    (_, _, ab), (_, _, ba) = inputs.links.links
    assert ab.message_s == ba.message_s == pytest.approx((4e-4 + 2e-4) / 2)  # each message costs both ends


def test_uncalibrated_offers_plan_as_before() -> None:
    offers = [Offer(o.peer_id, o.address, o.flops_per_s, o.memory_bytes) for o in _offers()]
    d = inputs_to_dict(plan_inputs(_spec("adamw"), offers, {}))
    assert all(set(x) == {"peer_id", "flops_per_s", "memory_bytes", "kind"} for x in d["devices"])
    assert all(len(link) == 4 for link in d["links"])


def test_member_verifies_the_plan_and_refuses_a_misstated_calibration() -> None:
    spec = _spec("adamw")
    offers = _offers()
    inputs, the_plan = make_plan(spec, offers, {})
    data = encode_start(inputs, the_plan)
    for own in offers:
        verify_start(spec, *data, own)
    # the leader lies about a's efficiency (and plans accordingly, so the plan itself is consistent)
    lied = [dataclasses.replace(offers[0], block_efficiency=1.0), offers[1]]
    bad_inputs, bad_plan = make_plan(spec, lied, {})
    with pytest.raises(PlanRefused, match="misstates"):
        verify_start(spec, *encode_start(bad_inputs, bad_plan), offers[0])
    verify_start(spec, *encode_start(bad_inputs, bad_plan), offers[1])  # b's own facts are right
    # a plan from other inputs than the ones sent is refused by the recomputation
    with pytest.raises(PlanRefused, match="different"):
        verify_start(spec, data[0], encode_start(bad_inputs, bad_plan)[1], offers[1])


def test_measured_links_replace_the_defaults_and_member_pairs_take_the_slower_leader_link() -> None:
    from arceusd.jobs.plans.planning import DEFAULT_BANDWIDTH, estimated_links
    from partitioner import Link

    c = Offer("c" * 32, "h:3", 8e10, 4 * GIB)
    offers = [*_offers(), c]
    leader, a, b = c.peer_id, offers[0].peer_id, offers[1].peer_id
    measured = {a: Link(0.002, 50e6, 3e-4), b: Link(0.004, 20e6, 1e-4)}
    links = estimated_links(leader, measured, [a, b, leader])
    assert links[(leader, a)] == measured[a] and links[(leader, b)] == measured[b]
    assert links[(a, b)] == Link(0.004, 20e6, 3e-4)
    inputs = plan_inputs(_spec("adamw"), offers, {}, measured=links)
    got = {(x, y): link for x, y, link in inputs.links.links}
    assert got[(a, leader)] == measured[a] or got[(leader, a)] == measured[a]
    assert all(link.bandwidth_bytes_per_s != DEFAULT_BANDWIDTH for link in got.values())
    # without measurements every link is nominal
    plain = plan_inputs(_spec("adamw"), offers, {})
    assert all(link.bandwidth_bytes_per_s == DEFAULT_BANDWIDTH for _, _, link in plain.links.links)


def test_an_offer_from_the_wire_is_checked_field_by_field() -> None:
    good = _offers()[0]
    good.check()
    for field, value in [
        ("message_s", -1e-3),
        ("dispatch_s", float("nan")),
        ("sgd_s_per_param", float("inf")),
        ("block_efficiency", 0.0),
        ("flops_per_s", 0.0),
        ("kind", "tpu"),
    ]:
        with pytest.raises(ValueError, match=field if field != "kind" else "kind must be one of"):
            bad: dict[str, Any] = {field: value}  # deliberately wrong types/values, as from the wire
            dataclasses.replace(good, **bad).check()


def test_a_member_accepts_a_plan_rating_it_slower_than_it_offered_never_faster() -> None:
    from arceusd.jobs.judging import claims

    spec = _spec("adamw")
    offers = _offers()
    slower = [claims.discounted(offers[0], 6.0), offers[1]]  # the leader measured a 6x slower than it offered
    assert slower[0].flops_per_s == pytest.approx(offers[0].flops_per_s / 6)
    verify_start(spec, *encode_start(*make_plan(spec, slower, {})), offers[0])
    faster = [dataclasses.replace(offers[0], flops_per_s=offers[0].flops_per_s * 2), offers[1]]
    with pytest.raises(PlanRefused, match="misstates"):
        verify_start(spec, *encode_start(*make_plan(spec, faster, {})), offers[0])
    beyond = [dataclasses.replace(offers[0], flops_per_s=offers[0].flops_per_s / (claims.MAX_DISCOUNT * 2)), offers[1]]
    with pytest.raises(PlanRefused, match="misstates"):
        verify_start(spec, *encode_start(*make_plan(spec, beyond, {})), offers[0])


def test_overclaim_is_judged_against_the_other_members_not_the_machine() -> None:
    from arceusd.jobs.judging import claims

    # everyone 2-3x slower than planned (a busy machine): nobody overclaimed
    busy = {"a": (0.30, 0.10), "b": (0.25, 0.10), "c": (0.20, 0.10)}
    assert all(claims.overclaim(busy, p) is None for p in busy)
    # c ran 22x its prediction while the others ran 2.5-3x theirs (2.75x together): 8x relative to them
    liar = {**busy, "c": (2.2, 0.10)}
    assert claims.overclaim(liar, "c") == pytest.approx(8.0)
    # a tiny stage's overheads (20x its 2 ms) do not set the bar: the rest ran 2.2x as a whole
    tiny = {"a": (0.04, 0.002), "b": (0.6, 0.3), "c": (2.0, 0.1)}
    assert claims.overclaim(tiny, "c") == pytest.approx(20 / (0.64 / 0.302))
    assert claims.overclaim(liar, "a") is None and claims.overclaim(liar, "b") is None
    # others faster than planned do not make an honest member look slow
    fast_others = {"a": (0.02, 0.10), "b": (0.03, 0.10), "c": (0.55, 0.10)}
    assert claims.overclaim(fast_others, "c") is None
    # a stage of a few milliseconds: 20x its prediction is overheads, not a lie
    assert claims.overclaim({**busy, "c": (0.004, 0.0002)}, "c") is None
    assert claims.overclaim({"c": (9.0, 0.1)}, "c") is None  # nobody to compare with
    # what honest members of the tests' small MLP reported on two busy cores (one of them 25-90x its 1.5 ms)
    honest = {"a": (0.0116, 0.00158), "b": (0.0168, 0.00346), "c": (0.133, 0.0015)}
    assert all(claims.overclaim(honest, p) is None for p in honest)
    # far over its prediction, but not what slows the job: another stage takes as long
    assert claims.overclaim({"a": (0.5, 0.4), "c": (1.2, 0.01)}, "c") is None
    offer = Offer("d" * 32, "h:4", 1e10, GIB)
    assert claims.discounted(offer, 1.0) is offer
    assert claims.discounted(offer, 1e9).flops_per_s == pytest.approx(1e10 / claims.MAX_DISCOUNT)  # bounded
