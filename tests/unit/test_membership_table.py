"""The membership merge rules, cell by cell: each member state x each update kind x incarnation
lower/equal/higher.

The expected table below is written from memberlist's state.go (aliveNode/suspectNode/deadNode) and checked by
driving the real core with GossipReceived events, not by calling the rule function alone. The accusers are
members (SUSPECT/DEAD from a non-member are dropped, see test_membership_guard.py) and the target's own updates
come from the target itself (a member heard of only through someone else waits pending until it answers).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from arceusd.membership import Membership, MembershipConfig, local
from arceusd.membership.events import GossipReceived, MemberState, Update, UpdateKind
from arceusd.membership.state import Decision, decide

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
BASE = 5
PEER = "target"

# (current state or None, update kind, relation of the update's incarnation to BASE) -> expected state
LOWER, EQUAL, HIGHER = -1, 0, 1
EXPECTED: dict[tuple[MemberState | None, UpdateKind, int], MemberState | None] = {}
for rel in (LOWER, EQUAL, HIGHER):
    EXPECTED[(None, UpdateKind.ALIVE, rel)] = A
    for kind in (UpdateKind.SUSPECT, UpdateKind.DEAD, UpdateKind.LEFT):
        EXPECTED[(None, kind, rel)] = None
EXPECTED.update(
    {
        (A, UpdateKind.ALIVE, LOWER): A,
        (A, UpdateKind.ALIVE, EQUAL): A,
        (A, UpdateKind.ALIVE, HIGHER): A,
        (A, UpdateKind.SUSPECT, LOWER): A,
        (A, UpdateKind.SUSPECT, EQUAL): S,
        (A, UpdateKind.SUSPECT, HIGHER): S,
        (A, UpdateKind.DEAD, LOWER): A,
        (A, UpdateKind.DEAD, EQUAL): D,
        (A, UpdateKind.DEAD, HIGHER): D,
        (A, UpdateKind.LEFT, LOWER): A,
        (A, UpdateKind.LEFT, EQUAL): L,
        (A, UpdateKind.LEFT, HIGHER): L,
        (S, UpdateKind.ALIVE, LOWER): S,
        (S, UpdateKind.ALIVE, EQUAL): S,
        (S, UpdateKind.ALIVE, HIGHER): A,
        (S, UpdateKind.SUSPECT, LOWER): S,
        (S, UpdateKind.SUSPECT, EQUAL): S,
        (S, UpdateKind.SUSPECT, HIGHER): S,
        (S, UpdateKind.DEAD, LOWER): S,
        (S, UpdateKind.DEAD, EQUAL): D,
        (S, UpdateKind.DEAD, HIGHER): D,
        (S, UpdateKind.LEFT, LOWER): S,
        (S, UpdateKind.LEFT, EQUAL): L,
        (S, UpdateKind.LEFT, HIGHER): L,
    }
)
for gone in (D, L):
    for rel in (LOWER, EQUAL, HIGHER):
        EXPECTED[(gone, UpdateKind.ALIVE, rel)] = A if rel == HIGHER else gone
        for kind in (UpdateKind.SUSPECT, UpdateKind.DEAD, UpdateKind.LEFT):
            EXPECTED[(gone, kind, rel)] = gone
# the subject's own LEFT beats an accuser's DEAD at the same incarnation (a push-pull can bring the DEAD first)
EXPECTED[(D, UpdateKind.LEFT, EQUAL)] = L
EXPECTED[(D, UpdateKind.LEFT, HIGHER)] = L

# incarnation the member holds afterwards: the update's when applied, BASE when ignored/confirmed
SETUP = {
    A: [],
    S: [UpdateKind.SUSPECT],
    D: [UpdateKind.DEAD],
    L: [UpdateKind.LEFT],
}


def _update(kind: UpdateKind, incarnation: int, origin: str = "accuser") -> Update:
    if kind is UpdateKind.ALIVE:
        return Update(kind, PEER, incarnation, PEER, "addr-target", b"key-target")
    if kind is UpdateKind.LEFT:
        return Update(kind, PEER, incarnation, PEER)
    return Update(kind, PEER, incarnation, origin)


ACCUSERS = ("x", "accuser", "first", "second")


def _new_core(incarnation: int = 1, config: MembershipConfig | None = None) -> Membership:
    core = Membership(config or local(), "me", "addr-me", b"key-me", random.Random(0), now=0.0, incarnation=incarnation)
    core.bootstrap(tuple(Update(UpdateKind.ALIVE, p, 1, p, f"addr-{p}", b"k") for p in ACCUSERS), 0.0)
    return core


def _from(update: Update) -> str:
    """The sender that carries ``update``: the subject for its own ALIVE/LEFT, another member otherwise."""
    return update.peer if update.kind in (UpdateKind.ALIVE, UpdateKind.LEFT) else "x"


def _core_in(state: MemberState | None) -> Membership:
    core = _new_core()
    if state is not None:
        core.handle(GossipReceived(PEER, (_update(UpdateKind.ALIVE, BASE),)), 0.0)
        for kind in SETUP[state]:
            u = _update(kind, BASE, origin="first")
            core.handle(GossipReceived(_from(u), (u,)), 0.0)
    assert core.state_of(PEER) is state
    return core


def test_table_is_complete() -> None:
    assert len(EXPECTED) == 5 * 4 * 3


@pytest.mark.parametrize(("current", "kind", "rel"), sorted(EXPECTED, key=repr))
def test_cell(current: MemberState | None, kind: UpdateKind, rel: int) -> None:
    core = _core_in(current)
    incarnation = BASE + rel
    u = _update(kind, incarnation)
    actions = core.handle(GossipReceived(_from(u), (u,)), 0.001)
    expected = EXPECTED[(current, kind, rel)]
    assert core.state_of(PEER) is expected
    member = core.members.get(PEER)
    changed = expected is not current or (expected is A and current is A and rel == HIGHER)
    if member is not None:
        assert member.incarnation == (incarnation if changed else BASE)
    # a state change is reported to the driver exactly when the state moved
    moved = [a for a in actions if getattr(a, "peer", None) == PEER and getattr(a, "state", 0) is not current]
    assert bool(moved) == (expected is not current)


@pytest.mark.parametrize(("current", "kind", "rel"), sorted(EXPECTED, key=repr))
def test_rule_function_agrees_with_core(current: MemberState | None, kind: UpdateKind, rel: int) -> None:
    decision = decide(current, BASE if current else 0, kind, BASE + rel)
    expected = EXPECTED[(current, kind, rel)]
    if expected is current and not (current is A and kind is UpdateKind.ALIVE and rel == HIGHER):
        assert decision in (Decision.IGNORE, Decision.CONFIRM)
    else:
        assert decision is Decision.APPLY


def test_suspect_on_suspect_counts_a_confirmation_and_regossips() -> None:
    config = dataclasses.replace(local(), suspicion_mult=3)  # one expected confirmation among 6 members
    core = _new_core(config=config)
    core.handle(GossipReceived(PEER, (_update(UpdateKind.ALIVE, BASE),)), 0.0)
    core.handle(GossipReceived("x", (_update(UpdateKind.SUSPECT, BASE, origin="first"),)), 0.0)
    assert core._suspicions[PEER].expected == config.suspicion_confirmations(6) == 1
    before = core._suspicions[PEER].deadline
    core.handle(GossipReceived("x", (_update(UpdateKind.SUSPECT, BASE, origin="second"),)), 0.001)
    assert core._suspicions[PEER].confirmations == 1
    assert core._suspicions[PEER].deadline < before
    assert any(u.kind is UpdateKind.SUSPECT and u.origin == "second" for u in core._queue.pending())
    # the same accuser again is not independent
    core.handle(GossipReceived("x", (_update(UpdateKind.SUSPECT, BASE, origin="second"),)), 0.002)
    assert core._suspicions[PEER].confirmations == 1


@pytest.mark.parametrize("kind", [UpdateKind.SUSPECT, UpdateKind.DEAD, UpdateKind.LEFT])
@pytest.mark.parametrize("rel", [LOWER, EQUAL, HIGHER])
def test_claims_about_self_are_refuted_unless_stale(kind: UpdateKind, rel: int) -> None:
    core = _new_core(incarnation=BASE)
    claim = Update(kind, "me", BASE + rel, "accuser")
    core.handle(GossipReceived("accuser", (claim,)), 0.0)
    if kind is UpdateKind.LEFT:  # only we may say we left: a LEFT about us made by another is dropped
        assert core.incarnation == BASE
        assert core.dropped["alive_or_left_not_from_subject"] == 1
    elif rel == LOWER:
        assert core.incarnation == BASE
    else:
        assert core.incarnation == BASE + rel + 1
        assert core.health_score == 1  # Lifeguard: being suspected hints that WE are slow
        pending = core._queue.pending()
        assert any(u.kind is UpdateKind.ALIVE and u.peer == "me" and u.incarnation == core.incarnation for u in pending)
    assert core.state_of("me") is A
