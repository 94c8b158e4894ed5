"""Hostile updates against the pure membership core (issue 19, items 2 and 7): who may claim what, incarnation
range and window, total refutation, pending members bounded per source, the table bounded without evicting live
members, and the per-sender rate limiter. Each rule is driven through ``Membership.handle``."""

from __future__ import annotations

import dataclasses
import random

import pytest

from arceusd.membership import Membership, MembershipConfig, local
from arceusd.membership.events import (
    AckReceived,
    GossipReceived,
    MemberState,
    PushPullReceived,
    SendPing,
    Tick,
    Update,
    UpdateKind,
)
from arceusd.membership.guard import INCARNATION_WINDOW, MAX_INCARNATION, Drop, check_update, host_of
from arceusd.membership.ratelimit import RateLimiter

ALIVE, SUSPECT, DEAD, LEFT = UpdateKind.ALIVE, UpdateKind.SUSPECT, UpdateKind.DEAD, UpdateKind.LEFT


def alive(peer: str, incarnation: int = 1, host: str = "h") -> Update:
    return Update(ALIVE, peer, incarnation, peer, f"{host}:1", b"k" + peer.encode())


def core(config: MembershipConfig | None = None, members: tuple[str, ...] = ("real",)) -> Membership:
    c = Membership(config or local(), "me", "me:1", b"kme", random.Random(0), now=0.0)
    c.bootstrap(tuple(alive(p) for p in members), 0.0)
    return c


@pytest.mark.parametrize(
    ("update", "known", "member", "expected"),
    [
        (Update(ALIVE, "x", 1, "y", "a", b"k"), None, True, Drop.NOT_SELF_ORIGINATED),
        (Update(LEFT, "x", 1, "y"), 1, True, Drop.NOT_SELF_ORIGINATED),
        (Update(SUSPECT, "x", 1, "x"), 1, True, Drop.SELF_ACCUSATION),
        (Update(DEAD, "x", 1, "y"), 1, False, Drop.ORIGIN_NOT_MEMBER),
        (Update(SUSPECT, "x", MAX_INCARNATION, "y"), MAX_INCARNATION, True, Drop.INCARNATION_RANGE),
        (Update(ALIVE, "x", MAX_INCARNATION + 1, "x", "a", b"k"), None, True, Drop.INCARNATION_RANGE),
        (Update(SUSPECT, "x", 2 + INCARNATION_WINDOW, "y"), 1, True, Drop.INCARNATION_WINDOW),
        (Update(SUSPECT, "x", 1 + INCARNATION_WINDOW, "y"), 1, True, None),
        (Update(ALIVE, "x", MAX_INCARNATION, "x", "a", b"k"), None, False, None),
        (Update(DEAD, "x", 7, "y"), 3, True, None),
    ],
)
def test_check_update_rules(update: Update, known: int | None, member: bool, expected: Drop | None) -> None:
    assert check_update(update, known, member) is expected


def test_suspect_at_the_top_of_the_range_from_a_hello_only_peer_is_dropped_not_refuted() -> None:
    """Issue 19 item 2: SUSPECT about us at 2**64-1 from a key that is not a member."""
    c = core()
    c.handle(GossipReceived("stranger", (Update(SUSPECT, "me", 2**64 - 1, "stranger"),)), 0.0)
    assert c.incarnation == 1 and c.dropped[Drop.ORIGIN_NOT_MEMBER.value] == 1
    # from a member it is still dropped (range), and a claim far above our incarnation (window) too
    c.handle(GossipReceived("real", (Update(SUSPECT, "me", 2**64 - 1, "real"),)), 0.0)
    c.handle(GossipReceived("real", (Update(SUSPECT, "me", 5 + INCARNATION_WINDOW, "real"),)), 0.0)
    assert c.incarnation == 1
    assert c.dropped[Drop.INCARNATION_RANGE.value] == 1 and c.dropped[Drop.INCARNATION_WINDOW.value] == 1
    # an honest suspicion is refuted as before
    c.handle(GossipReceived("real", (Update(SUSPECT, "me", 1, "real"),)), 0.0)
    assert c.incarnation == 2


def test_refutation_is_total_at_the_top_of_the_range() -> None:
    c = Membership(local(), "me", "me:1", b"kme", random.Random(0), now=0.0, incarnation=MAX_INCARNATION - 1)
    c.bootstrap((alive("real"),), 0.0)
    c.handle(GossipReceived("real", (Update(SUSPECT, "me", MAX_INCARNATION - 1, "real"),)), 0.0)
    assert c.incarnation == MAX_INCARNATION
    # nothing can claim MAX about us any more, so we never need to go above it
    c.handle(GossipReceived("real", (Update(DEAD, "me", MAX_INCARNATION, "real"),)), 0.0)
    assert c.incarnation == MAX_INCARNATION
    # an ALIVE of a previous life at the top is refuted without leaving the range
    c.handle(GossipReceived("me", (Update(ALIVE, "me", MAX_INCARNATION, "me", "me:1", b"kme"),)), 0.0)
    assert c.incarnation == MAX_INCARNATION


def test_dead_about_a_third_peer_at_the_top_does_not_stick() -> None:
    """Issue 19 item 2: DEAD about a third peer with a huge incarnation would leave it unable to refute."""
    c = core(members=("real", "victim"))
    c.handle(GossipReceived("real", (Update(DEAD, "victim", 2**64 - 1, "real"),)), 0.0)
    c.handle(GossipReceived("real", (Update(DEAD, "victim", 2**40, "real"),)), 0.0)
    assert c.state_of("victim") is MemberState.ALIVE
    # an honest DEAD is applied and the victim can refute it with one more incarnation
    c.handle(GossipReceived("real", (Update(DEAD, "victim", 1, "real"),)), 0.0)
    assert c.state_of("victim") is MemberState.DEAD
    c.handle(GossipReceived("victim", (alive("victim", 2),)), 0.0)
    assert c.state_of("victim") is MemberState.ALIVE


def test_thousands_of_self_signed_alives_wait_pending_bounded_per_source() -> None:
    """Issue 19 item 7: one push/pull with 2,000 ALIVE entries: at most max_pending_per_source wait (and are
    pinged), none enters the table, and the real member is still there and alive."""
    cfg = local()
    c = core()
    fakes = tuple(alive(f"fake{i:04d}", host=f"10.0.{i // 250}.{i % 250}") for i in range(2000))
    assert check_update(fakes[0], None, False) is None  # each one is a valid self-signed ALIVE
    out = c.handle(PushPullReceived("attacker", "", fakes, True), 0.0)
    assert len(c.pending) == cfg.max_pending_per_source
    assert set(c.members) == {"me", "real"} and c.state_of("real") is MemberState.ALIVE
    assert c.dropped[Drop.PENDING_PER_SOURCE.value] == 2000 - cfg.max_pending_per_source
    assert len([a for a in out if isinstance(a, SendPing)]) == cfg.max_pending_per_source
    # nobody answers: they are pinged a bounded number of times, then forgotten
    pings = 0
    for step in range(1, 100):
        pings += len(
            [
                a
                for a in c.handle(Tick(), step * cfg.probe_interval / 2)
                if isinstance(a, SendPing) and a.to.startswith("fake")
            ]
        )
    assert not c.pending and pings <= 2 * cfg.max_pending_per_source
    assert set(c.members) == {"me", "real"}


def test_a_pending_member_joins_when_it_answers_itself() -> None:
    c = core()
    out = c.handle(GossipReceived("real", (alive("new"),)), 0.0)
    assert c.state_of("new") is None and "new" in c.pending
    # the verification ping introduces us (it may not know us either), whatever the broadcast queue holds
    (ping,) = [a for a in out if isinstance(a, SendPing) and a.to == "new"]
    assert [(u.kind, u.peer) for u in ping.gossip] == [(ALIVE, "me")]
    c.handle(AckReceived("new", 999), 0.01)
    assert c.state_of("new") is MemberState.ALIVE and not c.pending
    # a member that speaks for itself joins at once
    c.handle(GossipReceived("direct", (alive("direct"),)), 0.02)
    assert c.state_of("direct") is MemberState.ALIVE


def test_pending_is_bounded_in_total_across_sources() -> None:
    cfg = dataclasses.replace(local(), max_pending=10, max_pending_per_source=4)
    c = core(cfg, members=tuple(f"src{i}" for i in range(5)))
    for s in range(5):
        c.handle(GossipReceived(f"src{s}", tuple(alive(f"n{s}-{i}", host=f"{s}.{i}") for i in range(6))), 0.0)
    assert len(c.pending) == 10
    # src0 and src1: 4 kept and 2 over their own bound each; src2: 2 kept, then the total is reached
    assert c.dropped[Drop.PENDING_PER_SOURCE.value] == 4
    assert c.dropped[Drop.PENDING_TOTAL.value] == 4 + 6 + 6


def test_table_full_evicts_tombstones_never_live_members() -> None:
    cfg = dataclasses.replace(local(), max_members=4, max_members_per_host=10)
    c = core(cfg, members=("a", "b"))
    c.handle(GossipReceived("c", (alive("c"),)), 0.0)
    assert len(c.members) == 4
    c.handle(GossipReceived("d", (alive("d"),)), 0.0)
    assert c.state_of("d") is None and c.dropped[Drop.TABLE_FULL.value] == 1
    c.handle(GossipReceived("a", (Update(DEAD, "b", 1, "a"),)), 0.0)  # b is now a tombstone
    c.handle(GossipReceived("d", (alive("d"),)), 0.0)
    assert c.state_of("d") is MemberState.ALIVE and c.state_of("b") is None
    assert {p for p, m in c.members.items() if m.state is MemberState.ALIVE} == {"me", "a", "c", "d"}


def test_members_per_host_are_bounded() -> None:
    cfg = dataclasses.replace(local(), max_members_per_host=3)
    c = core(cfg, members=())
    for i in range(5):
        c.handle(GossipReceived(f"x{i}", (alive(f"x{i}", host="evil"),)), 0.0)
    assert sum(1 for p in c.members if p.startswith("x")) == 3
    assert c.dropped[Drop.PER_HOST.value] == 2
    assert host_of("10.0.0.1:47070") == "10.0.0.1" and host_of("[::1]:5") == "[::1]" and host_of("x") == "x"


def test_rate_limiter_allows_a_burst_then_the_rate() -> None:
    limiter = RateLimiter(rate=10, burst=5, max_keys=2)
    assert sum(limiter.allow("a", 0.0) for _ in range(20)) == 5
    assert sum(limiter.allow("a", 1.0) for _ in range(20)) == 5  # 10 tokens a second, capped at the burst
    assert limiter.allow("b", 1.0) and limiter.allow("c", 1.0)
    assert len(limiter) == 2
