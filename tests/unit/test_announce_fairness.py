"""Fair shares of the announcement table (arceusd/network/announce_guard.py, issue 29 (c)): a flood of announcements
from many keys evicts its own, never the jobs of owners in our membership, and members' hosts and keys share
the table."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.network.announce_guard import AnnounceGuard, AnnounceLimits, address_host, fair_victim


def _key(i: int) -> str:
    return f"{i:032x}"


def test_a_flood_of_keys_that_only_said_hello_never_evicts_a_members_job() -> None:
    guard = AnnounceGuard()
    honest = {"a" * 32: ("a1" * 16, "10.0.0.1"), "b" * 32: ("b2" * 16, "10.0.0.2"), "c" * 32: ("b2" * 16, "10.0.0.2")}
    for job, (owner, host) in honest.items():
        assert guard.added(job, owner, member=True, host=host) == []
    evicted: list[str] = []
    for i in range(3_000):  # 100 keys, 30 jobs each
        evicted += guard.added(_key(10_000 + i), _key(i % 100))
    assert not set(honest) & set(evicted)
    assert guard.summary()["tracked"] == guard.limits.total
    # a late honest job still gets in: a stranger's announcement makes room
    assert guard.added("d" * 32, "d4" * 16, member=True, host="10.0.0.4") != ["d" * 32]


def test_a_strangers_newcomer_is_refused_when_members_fill_the_table() -> None:
    guard = AnnounceGuard(AnnounceLimits(per_source=8, total=4))
    for i in range(4):
        guard.added(_key(i), _key(100 + i), member=True, host=f"10.0.0.{i}")
    assert guard.added(_key(9), _key(999)) == [_key(9)]


def test_member_keys_from_one_host_share_that_hosts_part() -> None:
    guard = AnnounceGuard(AnnounceLimits(per_source=8, total=16))
    guard.added("a" * 32, "a1" * 16, member=True, host="10.0.0.1")
    guard.added("b" * 32, "b2" * 16, member=True, host="10.0.0.2")
    evicted: list[str] = []
    for i in range(500):  # 50 member keys behind one address
        evicted += guard.added(_key(i), _key(1000 + i % 50), member=True, host="10.0.0.66")
    assert "a" * 32 not in evicted and "b" * 32 not in evicted


def test_within_an_owner_the_oldest_goes_and_over_owners_the_one_holding_most() -> None:
    guard = AnnounceGuard(AnnounceLimits(per_source=8, total=3))
    guard.added("a" * 32, "o1" * 16)
    guard.added("b" * 32, "o1" * 16)
    guard.added("c" * 32, "o2" * 16)
    assert guard.added("d" * 32, "o3" * 16) == ["a" * 32]


def test_address_host() -> None:
    assert address_host("10.0.0.1:47070") == "10.0.0.1"
    assert address_host("[::1]:47070") == "::1"
    assert address_host("") == ""


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.booleans(), st.integers(0, 3)), min_size=1, max_size=200))
def test_bounds_hold_and_members_go_only_when_no_stranger_is_left(steps: list[tuple[int, bool, int]]) -> None:
    limits = AnnounceLimits(per_source=3, total=10)
    guard = AnnounceGuard(limits)
    for n, (owner, member, host) in enumerate(steps):
        before = dict(guard._seen)
        evicted = guard.added(_key(n), _key(owner), member=member, host=f"h{host}")
        table = guard._seen
        assert len(table) <= limits.total
        assert max(Counter(e.owner for e in table.values()).values()) <= 3
        strangers_left = any(not e.member for e in table.values())
        for job in evicted:
            entry = before.get(job)
            if entry is not None and entry.member and entry.owner != _key(owner):
                assert not strangers_left, (job, entry)
    if guard._seen:
        assert fair_victim(guard._seen) in guard._seen
