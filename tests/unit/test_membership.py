"""Membership core behaviour: presets, Lifeguard pieces, convergence, refutation, detection, leave,
duplicates.

All runs use the deterministic simulator (fake clock, seeded RNG): no sleeps.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from arceusd.membership import Membership, MembershipConfig, detection_bound, lan, local
from arceusd.membership.awareness import Awareness
from arceusd.membership.broadcast import BroadcastQueue
from arceusd.membership.events import (
    AckReceived,
    GossipReceived,
    Join,
    Leave,
    MemberState,
    PingReceived,
    SendAck,
    SendGossip,
    SendNack,
    SendPing,
    SendPingReq,
    Tick,
    Update,
    UpdateKind,
    update_size,
)
from arceusd.membership.sim import Cluster, NetworkModel, peer_name
from arceusd.membership.suspicion import Suspicion, suspicion_timeout


def test_lan_preset_matches_memberlist_default_lan_config() -> None:
    cfg = lan()
    assert (cfg.probe_interval, cfg.probe_timeout, cfg.indirect_checks) == (1.0, 0.5, 3)
    assert (cfg.suspicion_mult, cfg.retransmit_mult, cfg.push_pull_interval) == (4, 4, 30.0)
    # memberlist: suspicionTimeout(4, 100, 1s) = 4*log10(100) s; retransmitLimit(4, 100) = 4*ceil(log10(101))
    assert cfg.suspicion_min_timeout(100) == pytest.approx(4 * math.log10(100))
    assert cfg.suspicion_min_timeout(3) == pytest.approx(4.0)  # node scale floors at 1
    assert cfg.retransmit_limit(100) == 4 * math.ceil(math.log10(101))
    assert cfg.push_pull_interval_for(32) == 30.0
    assert cfg.push_pull_interval_for(1000) == 30.0 * (math.ceil(math.log2(1000) - 5) + 1)


def test_local_preset_is_tens_of_ms() -> None:
    cfg = local()
    assert cfg.probe_interval <= 0.1 and cfg.probe_timeout <= 0.05 and cfg.push_pull_interval <= 1.0
    assert detection_bound(cfg, 5) < 5.0


def test_config_rejects_timeout_not_below_interval() -> None:
    with pytest.raises(ValueError, match="probe_timeout"):
        MembershipConfig(**{**_fields(local()), "probe_timeout": 0.2})


def _fields(cfg: MembershipConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


def test_awareness_saturates_and_scales() -> None:
    awareness = Awareness(max_multiplier=3)
    awareness.apply_delta(10)
    assert awareness.score == 2 and awareness.scale(1.0) == 3.0
    awareness.apply_delta(-10)
    assert awareness.score == 0 and awareness.scale(0.5) == 0.5


def test_suspicion_shrinks_logarithmically_with_confirmations() -> None:
    lo, hi, k = 1.0, 6.0, 3
    s = Suspicion("a", 1, k, lo, hi, start=10.0)
    deadlines = [s.deadline]
    for accuser in ("b", "c", "d", "e"):
        s.confirm(accuser)
        deadlines.append(s.deadline)
    assert deadlines[0] == 10.0 + hi
    assert deadlines[1] == pytest.approx(10.0 + hi - (hi - lo) * math.log(2) / math.log(4), abs=1e-3)
    assert deadlines[3] == 10.0 + lo and deadlines[4] == deadlines[3]  # k reached: no further effect
    assert suspicion_timeout(0, 0, lo, hi) == lo  # nobody to confirm: the minimum


def test_broadcast_queue_replaces_per_member_and_limits_retransmits() -> None:
    queue = BroadcastQueue()
    old = Update(UpdateKind.ALIVE, "a", 1, "a", "x", b"k")
    new = Update(UpdateKind.SUSPECT, "a", 1, "me")
    queue.push(old)
    queue.push(new)
    queue.push(Update(UpdateKind.ALIVE, "b", 1, "b", "y", b"k"))
    assert len(queue) == 2
    taken = [queue.take(10_000, 3, update_size) for _ in range(4)]
    assert new in taken[0] and old not in taken[0]
    assert [len(t) for t in taken] == [2, 2, 2, 0]
    # a budget that fits one update takes the least-transmitted first
    queue.push(Update(UpdateKind.ALIVE, "c", 1, "c", "z", b"k"))
    queue.take(10_000, 5, update_size)
    queue.push(Update(UpdateKind.ALIVE, "d", 1, "d", "w", b"k"))
    one = queue.take(update_size(Update(UpdateKind.ALIVE, "d", 1, "d", "w", b"k")), 5, update_size)
    assert [u.peer for u in one] == ["d"]


def test_probe_escalates_to_indirect_then_suspects_with_nack_accounting() -> None:
    cfg = local()
    core = Membership(cfg, "me", "addr-me", b"k", random.Random(3), now=0.0)
    peers = tuple(Update(UpdateKind.ALIVE, f"o{i}", 1, f"o{i}", f"addr-o{i}", b"k") for i in range(5))
    core.bootstrap(peers, 0.0)
    for p in peers:  # each answered a ping of ours before: no first-contact stretch (tested below)
        core.handle(AckReceived(p.peer, 0), 0.0)
    t = core.next_deadline()
    ping = None
    for _ in range(20):  # bounded: find the first probe
        actions = core.handle(Tick(), t)
        pings = [a for a in actions if isinstance(a, SendPing)]
        if pings:
            ping = pings[0]
            break
        t = core.next_deadline()
    assert ping is not None
    start = t
    actions = core.handle(Tick(), start + cfg.probe_timeout)
    reqs = [a for a in actions if isinstance(a, SendPingReq)]
    assert len(reqs) == cfg.indirect_checks and all(r.target == ping.to and r.seq == ping.seq for r in reqs)
    assert ping.to not in {r.to for r in reqs}
    actions = core.handle(Tick(), start + cfg.probe_interval)
    assert core.state_of(ping.to) is MemberState.SUSPECT
    assert core.health_score == cfg.indirect_checks  # no nack came back from anyone: we are suspect ourselves


def _first_probe(core: Membership, t: float) -> tuple[SendPing, float]:
    for _ in range(50):  # bounded
        pings = [a for a in core.handle(Tick(), t) if isinstance(a, SendPing)]
        if pings:
            return pings[0], t
        t = core.next_deadline()
    raise AssertionError("no probe")


def test_a_member_that_never_answered_us_is_probed_with_the_largest_stretch() -> None:
    """First contact: the ping sets up a connection (and maybe a handshake) to a member that has often just
    started, so it gets awareness_max_multiplier times the timeout and interval; once it answered, the preset's
    own timings apply; held dead and back, it is a first contact again."""
    cfg = local()
    stretch = cfg.awareness_max_multiplier
    core = Membership(cfg, "me", "addr-me", b"k", random.Random(5), now=0.0)
    core.bootstrap((Update(UpdateKind.ALIVE, "o", 1, "o", "addr-o", b"k"),), 0.0)
    ping, start = _first_probe(core, core.next_deadline())
    # no ping-req and no suspicion at the preset's timings
    assert not [a for a in core.handle(Tick(), start + 2 * cfg.probe_timeout) if isinstance(a, SendPingReq)]
    core.handle(Tick(), start + 2 * cfg.probe_interval)
    assert core.state_of("o") is MemberState.ALIVE
    silent = Membership(cfg, "me", "addr-me", b"k", random.Random(5), now=0.0)  # a first contact that never answers
    silent.bootstrap((Update(UpdateKind.ALIVE, "o", 1, "o", "addr-o", b"k"),), 0.0)
    _, began = _first_probe(silent, silent.next_deadline())
    silent.handle(Tick(), began + stretch * cfg.probe_interval)
    assert silent.state_of("o") is MemberState.SUSPECT
    core.handle(AckReceived("o", ping.seq), start + 0.3)  # a slow first answer (300 ms) is fine
    assert core.state_of("o") is MemberState.ALIVE and core.health_score == 0
    # answered once: the next probe fails at the preset's interval
    ping, start = _first_probe(core, core.next_deadline())
    core.handle(Tick(), start + cfg.probe_interval)
    assert core.state_of("o") is MemberState.SUSPECT
    # held dead, then back: first contact again
    back = start + cfg.suspicion_max_timeout(2) + 1.0
    core.handle(Tick(), back)
    assert core.state_of("o") is MemberState.DEAD
    core.handle(GossipReceived("o", (Update(UpdateKind.ALIVE, "o", 2, "o", "addr-o", b"k"),)), back)
    assert core.state_of("o") is MemberState.ALIVE
    ping, start = _first_probe(core, back)
    core.handle(Tick(), start + 2 * cfg.probe_interval)
    assert core.state_of("o") is MemberState.ALIVE


def test_relay_acks_or_nacks_for_the_requester() -> None:
    from arceusd.membership.events import PingReqReceived

    cfg = local()
    core = Membership(cfg, "me", "addr-me", b"k", random.Random(3), now=0.0)
    out = core.handle(PingReqReceived("req", "addr-req", 77, "tgt", "addr-tgt"), 1.0)
    relay = next(a for a in out if isinstance(a, SendPing))
    assert relay.to == "tgt" and relay.address == "addr-tgt"
    out = core.handle(AckReceived("tgt", relay.seq), 1.01)
    assert any(isinstance(a, SendAck) and a.to == "req" and a.seq == 77 for a in out)
    out = core.handle(PingReqReceived("req", "addr-req", 78, "tgt", "addr-tgt"), 2.0)
    out = core.handle(Tick(), 2.0 + cfg.probe_timeout)
    assert any(isinstance(a, SendNack) and a.to == "req" and a.seq == 78 for a in out)


def test_ping_for_another_target_is_ignored() -> None:
    core = Membership(local(), "me", "addr-me", b"k", random.Random(0), now=0.0)
    assert not [a for a in core.handle(PingReceived("x", "addr-x", 1, "someone-else"), 0.0) if isinstance(a, SendAck)]
    assert [a for a in core.handle(PingReceived("x", "addr-x", 2, "me"), 0.0) if isinstance(a, SendAck)]


@pytest.mark.parametrize("n", [5, 12])
def test_members_joining_through_one_seed_converge(n: int) -> None:
    cluster = Cluster(n, local(), seed=n, start_converged=False)
    everyone = {peer_name(i) for i in range(n)}
    converged_at = None
    for step in range(1, 101):  # bounded: at most 10 simulated seconds
        cluster.run_until(step * 0.1)
        if all(node.membership.live_peers() == everyone for node in cluster.nodes.values()):
            converged_at = cluster.now
            break
    assert converged_at is not None and converged_at <= 2 * local().push_pull_interval


def test_false_suspicion_is_refuted_by_the_slow_member() -> None:
    cfg = local()
    cluster = Cluster(6, cfg, seed=11)
    cluster.run_until(1.0)
    slow = "p0003"
    # Slow-but-alive: cut it off for less than the minimum suspicion timeout, so others suspect it.
    cluster.partition([[slow]])
    before = cluster.node(slow).membership.incarnation
    for step in range(1, 200):
        cluster.run_until(1.0 + step * 0.01)
        if cluster.marks.get((slow, MemberState.SUSPECT)):
            break
    assert cluster.marks.get((slow, MemberState.SUSPECT)), "nobody suspected the unreachable member"
    cluster.heal()
    cluster.run_until(cluster.now + 3.0)
    assert cluster.node(slow).membership.incarnation > before
    assert not cluster.marks.get((slow, MemberState.DEAD))
    for node in cluster.up_nodes():
        assert node.membership.state_of(slow) is MemberState.ALIVE


@pytest.mark.parametrize(("n", "seed"), [(5, 1), (5, 2), (10, 3), (20, 4)])
def test_crash_is_detected_by_everyone_within_the_preset_bound(n: int, seed: int) -> None:
    cfg = local()
    cluster = Cluster(n, cfg, seed=seed, net=NetworkModel(loss=0.01))
    cluster.run_until(1.5)
    victim = peer_name(seed % n)
    cluster.crash(victim)
    crashed_at = cluster.now
    cluster.run_until(crashed_at + detection_bound(cfg, n))
    marked = cluster.marks.get((victim, MemberState.DEAD), {})
    observers = {node.peer for node in cluster.up_nodes()}
    assert set(marked) == observers
    assert max(marked.values()) - crashed_at <= detection_bound(cfg, n)
    # and nobody healthy was declared dead on the way
    assert [k for k in cluster.marks if k[1] is MemberState.DEAD and k[0] != victim] == []


def test_graceful_leave_is_seen_at_once() -> None:
    cfg = local()
    cluster = Cluster(8, cfg, seed=5)
    cluster.run_until(1.0)
    leaver = cluster.node("p0002")
    cluster.inject(leaver, Leave())
    left_at = cluster.now
    cluster.run_until(left_at + 0.01)  # one network delay, far below one probe interval
    for node in cluster.up_nodes():
        if node is not leaver:
            assert node.membership.state_of("p0002") is MemberState.LEFT
    assert leaver.membership.next_deadline() == math.inf
    assert not cluster.marks.get(("p0002", MemberState.DEAD))


def test_stale_alive_cannot_resurrect_a_dead_member_until_the_tombstone_expires() -> None:
    cfg = local()
    core = Membership(cfg, "me", "addr-me", b"k", random.Random(0), now=0.0)
    alive = Update(UpdateKind.ALIVE, "x", 3, "x", "addr-x", b"kx")
    core.handle(GossipReceived("x", (alive,)), 0.0)
    core.handle(GossipReceived("y", (Update(UpdateKind.ALIVE, "y", 1, "y", "addr-y", b"ky"),)), 0.0)
    core.handle(GossipReceived("y", (Update(UpdateKind.DEAD, "x", 3, "y"),)), 0.1)
    core.handle(GossipReceived("z", (alive,)), 0.2)
    assert core.state_of("x") is MemberState.DEAD
    out = core.handle(Tick(), 0.1 + cfg.tombstone_ttl)
    assert core.state_of("x") is None
    assert any(getattr(a, "peer", None) == "x" and getattr(a, "state", 0) is None for a in out)


def test_duplicate_identity_is_surfaced_not_merged() -> None:
    cfg = local()
    cluster = Cluster(4, cfg, seed=9)
    cluster.run_until(0.5)
    # a copied state directory: same peer id, another address
    twin = cluster.add_node("p0001", "addr-copy")
    cluster.inject(twin, GossipReceived("p0000", ()))
    cluster.inject(twin, Join("addr-p0000"))
    cluster.run_until(2.0)
    assert cluster.duplicates, "no DuplicateIdentity surfaced"
    for observer, dup in cluster.duplicates:
        assert observer == "p0001" and dup.peer == "p0001"
        assert {dup.our_address, dup.their_address} == {"addr-p0001", "addr-copy"}


def test_leave_sends_left_to_every_live_member() -> None:
    core = Membership(local(), "me", "addr-me", b"k", random.Random(0), now=0.0)
    core.bootstrap(tuple(Update(UpdateKind.ALIVE, f"o{i}", 1, f"o{i}", f"a{i}", b"k") for i in range(3)), 0.0)
    out = core.handle(Leave(), 1.0)
    left = Update(UpdateKind.LEFT, "me", core.incarnation, "me")
    sends = [a for a in out if isinstance(a, SendGossip) and left in a.gossip]
    assert sorted(s.to for s in sends) == ["o0", "o1", "o2"]
    assert core.handle(Tick(), 2.0) == []
