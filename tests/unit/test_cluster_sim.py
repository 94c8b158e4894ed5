"""Randomized cluster simulation: N membership + election cores over a lossy network with crashes, restarts,
partitions and heals (deterministic discrete-event simulator, one seed per schedule, no sleeps).

Invariants checked on every schedule:
* never more than one leader per (job, term);
* persisted terms never decrease, and a peer never changes its vote within a term (across restarts too);
* after the chaos, with a final partition held: a side holding a majority of the job's members has exactly one
  leader that every member on that side follows; every member on a minority side is paused.

``ARCEUS_SIM_SCHEDULES`` raises the number of schedules (default keeps CI to a few seconds).
"""

from __future__ import annotations

import os
import random

import pytest

from arceusd.elections.core import Election, ElectionState
from arceusd.membership import detection_bound, local
from arceusd.membership.events import Join
from arceusd.membership.sim import Cluster, NetworkModel, SimNode, peer_name

SCHEDULES = int(os.environ.get("ARCEUS_SIM_SCHEDULES", "40"))
CHAOS_SECONDS = 2.0
DISCOVERY_PERIOD = 0.5


def discover(cluster: Cluster, rng: random.Random) -> None:
    """What mDNS does for real: each up peer contacts one reachable peer missing from its live view."""
    for node in cluster.up_nodes():
        live = node.membership.live_peers()
        reachable = [
            other
            for other in cluster.up_nodes()
            if other.peer not in live and cluster.group[other.address] == cluster.group[node.address]
        ]
        if reachable:
            cluster.inject(node, Join(rng.choice(reachable).address))


def run_schedule(seed: int) -> Cluster:
    rng = random.Random(seed)
    n = rng.randint(3, 7)
    cfg = local()
    net = NetworkModel(delay_min=0.0002, delay_max=rng.choice([0.002, 0.01, 0.03]), loss=rng.choice([0, 0.01, 0.05]))
    cluster = Cluster(n, cfg, seed=seed, net=net, job_size=n)
    peers = [peer_name(i) for i in range(n)]
    crashed: set[str] = set()
    t = 1.0 + rng.random()
    cluster.run_until(t)
    for _ in range(rng.randint(1, 6)):  # chaos: bounded number of faults
        t += rng.random() * CHAOS_SECONDS / 3
        cluster.run_until(t)
        move = rng.choice(["crash", "restart", "partition", "heal"])
        if move == "crash" and len(crashed) < n - 1:
            victim = rng.choice([p for p in peers if p not in crashed])
            cluster.crash(victim)
            crashed.add(victim)
        elif move == "restart" and crashed:
            back = rng.choice(sorted(crashed))
            cluster.restart(back)
            crashed.discard(back)
        elif move == "partition":
            side = rng.sample(peers, rng.randint(1, n - 1))
            cluster.partition([side])
        else:
            cluster.heal()
    # final topology, held until the end
    if rng.random() < 0.5:
        cluster.partition([rng.sample(peers, rng.randint(1, n - 1))])
    else:
        cluster.heal()
    settle = detection_bound(cfg, n) + 3.0
    end = t + settle
    steps = int(settle / DISCOVERY_PERIOD) + 1
    for step in range(steps):
        discover(cluster, rng)
        cluster.run_until(min(end, t + (step + 1) * DISCOVERY_PERIOD))
    return cluster


def check_safety(cluster: Cluster) -> None:
    for (job, term), leaders in cluster.leaders.items():
        assert len(leaders) <= 1, f"two leaders {sorted(leaders)} in job {job} term {term}"
    for peer, log in cluster.persist_log.items():
        terms = [term for term, _ in log]
        assert terms == sorted(terms), f"{peer} persisted a lower term after a higher one: {terms}"
        votes: dict[int, str] = {}
        for term, voted in log:
            if voted is not None:
                assert votes.setdefault(term, voted) == voted, f"{peer} voted twice in term {term}"


def election_of(node: SimNode) -> Election:
    """The election ``node`` runs for the cluster's job (every job member runs one)."""
    if node.election is None:
        raise AssertionError(f"{node.peer} runs no election")
    return node.election


def check_liveness(cluster: Cluster) -> None:
    sides: dict[int, list[SimNode]] = {}
    for node in cluster.up_nodes():
        sides.setdefault(cluster.group[node.address], []).append(node)
    majority = len(cluster.job_members) // 2 + 1
    for side in sides.values():
        states = {n.peer: (election_of(n).state, election_of(n).term, election_of(n).leader) for n in side}
        if len(side) >= majority:
            leaders = [n for n in side if election_of(n).state is ElectionState.LEADER]
            assert len(leaders) == 1, f"majority side without exactly one leader: {states}"
            leader = leaders[0]
            for node in side:
                view = election_of(node)
                assert view.leader == leader.peer and view.term == election_of(leader).term, states
        else:
            assert all(election_of(n).state is ElectionState.PAUSED for n in side), f"minority not paused: {states}"


@pytest.mark.parametrize("block", range(4))
def test_randomized_schedules(block: int) -> None:
    per_block = max(1, SCHEDULES // 4)
    for seed in range(block * per_block, (block + 1) * per_block):
        cluster = run_schedule(seed)
        check_safety(cluster)
        try:
            check_liveness(cluster)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}") from exc


def test_safety_checker_catches_two_leaders() -> None:
    cluster = Cluster(3, local(), seed=0, job_size=3)
    cluster.leaders[("job", 1)] = {"p0000", "p0001"}
    with pytest.raises(AssertionError, match="two leaders"):
        check_safety(cluster)
