"""Issue 29 part 3, the pure rule: a receipt's price follows what the leader measured of the device, never more
than its offer; an unmeasured device is paid at most the leader's own speed; a discounted one at its discounted
speed from then on; a failed challenge at its offer / 1,000; a challenge that ran out of time measures nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from arceusd.jobs.judging.challenges import Timed
from arceusd.jobs.judging.claims import MAX_DISCOUNT
from arceusd.market.needs import pay
from arceusd.market.paid_speed import baseline, beyond_cap, cap, paid_flops, paid_speeds, timed_out

HONEST = 1e11
LIMIT = cap(HONEST)
WORK = HONEST * 0.15  # a challenge sized for 0.15 s at an honest offer


def test_an_unmeasured_device_is_paid_its_offer_up_to_the_leaders_own_speed() -> None:
    assert paid_flops(HONEST, 1.0, None, 1.0, LIMIT).flops == HONEST
    liar = paid_flops(1000 * HONEST, 1.0, None, 1.0, LIMIT)
    assert liar.flops == LIMIT == HONEST and "not measured yet: capped" in liar.basis
    assert cap(None) > 0


def test_a_challenge_answered_in_time_pays_what_it_showed_at_most_the_offer() -> None:
    honest = Timed(HONEST, WORK, 0.3)  # twice its offer's time, as every device beside the job
    assert paid_flops(HONEST, 1.0, honest, 2.0, LIMIT).flops == HONEST
    three_x = Timed(3 * HONEST, 3 * WORK, 0.9)  # 3x its speed: 6x its offer's time where the others took 2x
    got = paid_flops(3 * HONEST, 1.0, three_x, 2.0, LIMIT)
    assert got.flops == pytest.approx(HONEST) and got.basis == "its speed challenge"


def test_a_failed_or_timed_out_challenge_and_a_discount() -> None:
    forged = Timed(1000 * HONEST, 1000 * WORK, 0.01, "block 3 is not the one its root committed to")
    assert paid_flops(1000 * HONEST, MAX_DISCOUNT, forged, 1.0, LIMIT).flops == pytest.approx(HONEST)
    late = Timed(1000 * HONEST, 1000 * WORK, 10.0)  # the leader stopped waiting at 10 s: an upper bound only
    assert timed_out(late) and not timed_out(Timed(HONEST, WORK, 0.3))
    # discounted by 40 after its challenge ran out of time: still capped, never the discounted 25x
    got = paid_flops(1000 * HONEST, 40.0, late, 1.0, LIMIT)
    assert got.flops == LIMIT and "ran out of time" in got.basis
    assert paid_flops(4 * HONEST, 8.0, None, 1.0, LIMIT).flops == HONEST / 2, "paid at the discounted speed"


def test_the_baseline_is_the_median_of_the_others_answered_in_time() -> None:
    timed = {
        "a": Timed(HONEST, WORK, 0.3),
        "b": Timed(HONEST, WORK, 0.45),
        "me": Timed(HONEST, WORK, 0.15),
        "liar": Timed(1000 * HONEST, 1000 * WORK, 10.0),
    }
    assert baseline(timed, "a") == pytest.approx(2.0)  # the median of b's 3 and me's 1 (the liar's left out)
    assert baseline({}, "a") == 1.0


def test_a_1000x_liar_earns_at_most_1_5x_an_honest_member_before_and_after_it_is_caught() -> None:
    honest_price = pay(paid_flops(HONEST, 1.0, None, 1.0, LIMIT).flops, 0.0)
    for discount, challenge in (
        (1.0, None),
        (40.0, Timed(1000 * HONEST, 1000 * WORK, 10.0)),
        (MAX_DISCOUNT, Timed(1000 * HONEST, 1000 * WORK, 0.01, "forged")),
    ):
        liar_price = pay(paid_flops(1000 * HONEST, discount, challenge, 1.0, LIMIT).flops, 0.0)
        assert liar_price <= 1.5 * honest_price, (discount, liar_price, honest_price)


def job(members: dict[str, float], timed: dict[str, Timed] | None = None) -> SimpleNamespace:
    offers = {p: SimpleNamespace(flops_per_s=f) for p, f in members.items()}
    leading = SimpleNamespace(speed=SimpleNamespace(timed=timed or {}, discounts={}, challenged=set(timed or {})))
    return SimpleNamespace(members=offers, leading=leading, plan_peers=lambda: tuple(members))


def test_the_leader_times_a_plan_device_offering_more_than_the_cap() -> None:
    j = job({"me": HONEST, "a": 1.9 * HONEST, "liar": 1000 * HONEST})
    assert beyond_cap(j, "me") == ["liar"], "a device within TIME_ABOVE of the leader is not timed for its pay"
    assert paid_speeds(j, "me")["a"].flops == HONEST, "...and paid at most the cap until it is"
    assert paid_speeds(j, "me")["liar"].flops == HONEST
    loaded = job({"me": HONEST, "liar": 1000 * HONEST}, {"me": Timed(HONEST, WORK, 0.15 * 13)})
    paid = paid_speeds(loaded, "me")
    assert paid["me"].flops == HONEST and paid["liar"].flops == HONEST, "the leader's own challenge is the baseline"
    timed = job({"me": HONEST, "liar": 1000 * HONEST}, {"me": Timed(HONEST, WORK, 0.15)})
    assert beyond_cap(timed, "me") == ["liar"]
    timed.leading.speed.challenged.add("liar")
    assert beyond_cap(timed, "me") == [], "asked once per job"
