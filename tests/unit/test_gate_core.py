"""The peer port's connection table (arceusd/transport/gate_core.py): bounds per source and in total, fair
eviction when full, hello and idle deadlines, and the limits derived from the open-files limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.transport.gate_core import (
    FDS_PER_CONNECTION,
    ConnectionTable,
    GateLimits,
    limits_for,
    reserve_for,
    source_key,
)


def test_limits_keep_the_reserve_below_the_open_files_limit() -> None:
    assert limits_for(1024) == GateLimits(256, 32, 3.0, 30.0, 30.0)
    for nofile in (64, 256, 1024, 4096, 65536, 1 << 20):
        limits = limits_for(nofile)
        used = limits.max_connections * FDS_PER_CONNECTION
        assert used + reserve_for(nofile) <= nofile, nofile
        assert 2 <= limits.max_per_source <= 64 and limits.max_connections <= 1024
    assert limits_for(1 << 20).max_connections == 1024


def test_source_key() -> None:
    assert source_key("10.0.0.7") == "10.0.0.7"
    assert source_key("2001:db8::1") == source_key("2001:db8::ffff") == "2001:db8::/64"
    assert source_key("2001:db8:0:1::1") != source_key("2001:db8::1")
    assert source_key("::ffff:10.0.0.7") == "10.0.0.7"
    assert source_key("fe80::1%eth0") == "fe80::/64"
    assert source_key("unknown") == "unknown"


def test_per_source_bound_refuses_the_excess() -> None:
    table = ConnectionTable(GateLimits(max_connections=10, max_per_source=3))
    answers = [table.admit(i, "10.0.0.9", 0.0) for i in range(5)]
    assert [a.refused for a in answers] == [None, None, None, "source_full", "source_full"]
    assert table.admit(9, "10.0.0.1", 0.0).refused is None
    assert table.counts["source_full"] == 2


def test_full_table_evicts_from_the_heaviest_source_unproven_first() -> None:
    table = ConnectionTable(GateLimits(max_connections=4, max_per_source=4))
    for i in range(3):
        table.admit(i, "10.0.0.9", float(i))
    table.prove(0)
    table.admit(3, "10.0.0.1", 0.0)  # the real peer's first connection
    answer = table.admit(4, "10.0.0.2", 5.0)  # full: a lighter source takes one of 10.0.0.9's, unproven first
    assert answer.refused is None and answer.evict == 1
    assert table.per_source["10.0.0.9"] == 2 and 3 in table.connections
    # a newcomer from the heaviest source itself is refused; equals are not evicted for each other
    assert table.admit(5, "10.0.0.9", 6.0).refused == "total_full"
    assert table.admit(6, "10.0.0.1", 6.0).refused == "total_full"  # 10.0.0.1 holds 1, the heaviest 2


def test_hello_and_idle_deadlines() -> None:
    table = ConnectionTable(
        GateLimits(max_connections=8, max_per_source=8, hello_timeout=3.0, idle_timeout=30.0, hello_limit=10.0)
    )
    for i in range(5):
        table.admit(i, "10.0.0.9", 0.0)
    table.prove(1)  # completed a call
    table.enter(2, 1.0)  # a call in flight, not yet answered
    table.touch(0, 2.9, inbound=False)  # our bytes to it hold nothing off
    table.touch(4, 2.0, inbound=True)  # its bytes (a first call still arriving) hold the quiet deadline off
    assert table.expired(2.9) == []
    assert sorted(table.expired(3.0)) == [0, 3]
    for t in range(4, 10):
        table.touch(4, float(t), inbound=True)
        assert table.expired(float(t)) == []
    assert table.expired(10.0) == [4]  # but not past the hello limit
    assert table.counts["hello_timeout"] == 3
    assert table.expired(31.0) == [1]  # idle 31 s
    assert table.expired(100.0) == []  # busy: held off
    table.leave(2, 100.0, proven=True)
    assert table.expired(129.0) == [] and table.expired(130.0) == [2]
    assert table.counts["idle_timeout"] == 2 and not table.connections and not table.per_source


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["admit", "close", "prove", "tick"])), max_size=300))
def test_bounds_hold_under_any_sequence(ops: list[tuple[int, str]]) -> None:
    limits = GateLimits(max_connections=16, max_per_source=5, hello_timeout=3.0, idle_timeout=10.0)
    table = ConnectionTable(limits)
    now = 0.0
    for cid, (host, op) in enumerate(ops):
        now += 0.5
        if op == "admit":
            table.admit(cid, f"10.0.{host % 7}.1", now)
        elif op == "close" and table.connections:
            table.release(sorted(table.connections)[host % len(table.connections)])
        elif op == "prove" and table.connections:
            table.prove(sorted(table.connections)[host % len(table.connections)])
        else:
            table.expired(now)
        assert len(table.connections) <= limits.max_connections
        assert all(0 < n <= limits.max_per_source for n in table.per_source.values())
        assert sum(table.per_source.values()) == len(table.connections)


def test_a_source_evicts_only_from_one_holding_over_twice_as_many() -> None:
    table = ConnectionTable(GateLimits(max_connections=8, max_per_source=8))
    for i in range(5):
        table.admit(i, "10.0.0.9", 0.0)
    for i in range(5, 7):
        table.admit(i, "10.0.0.8", 0.0)
    table.admit(7, "10.0.0.1", 0.0)
    assert table.admit(8, "10.0.0.8", 1.0).refused == "total_full"  # 2 against 5: near its share, no churn
    answer = table.admit(9, "10.0.0.1", 1.0)  # 1 against 5
    assert answer.refused is None and answer.evict is not None and answer.evict < 5
