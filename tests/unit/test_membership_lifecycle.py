"""Issue 17, generalised in the simulator: seeded random sequences of stop, start, crash, restart and SIGSTOP
over up to 8 members (local preset, no loss) converge to the true view, and no running member is held ``left``
or ``dead`` by a running observer for longer than the suspicion timeout.

"Running" excludes a paused (SIGSTOPped) process. An episode of an observer holding a member gone is timed only
while both are running: a member that is paused longer than the suspicion timeout is rightly declared dead,
and the clock of the property starts when it resumes. The bound is the smallest suspicion timeout for 8 members
(0.6 s with ``local``). 16 seeds by default (~3 s); ``LIFECYCLE_SEEDS=400`` for a longer search (400 passed
when this was written). Every loop is bounded by the sequence length.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import pytest

from arceusd.membership import local
from arceusd.membership.events import MemberState
from arceusd.membership.sim import Cluster, peer_name

POOL = 8
STEPS = 30
SAMPLE = 0.02
GONE = (MemberState.DEAD, MemberState.LEFT)


@dataclass
class Life:
    """What the test knows is true: which members run, and since when (start or resume)."""

    running: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    down: set[str] = field(default_factory=set)  # stopped or crashed (may start again)
    since: dict[str, float] = field(default_factory=dict)


def _check(cluster: Cluster, life: Life, episodes: dict[tuple[str, str], float], bound: float) -> None:
    """Every (observer, member) pair that runs: time how long the observer has held the member gone."""
    now = cluster.now
    for observer in life.running:
        view = cluster.node(observer).membership
        for member in life.running - {observer}:
            key = (observer, member)
            state = view.state_of(member)
            if state is not None and state in GONE:
                start = max(episodes.setdefault(key, now), life.since[member], life.since[observer])
                assert now - start <= bound, (
                    f"{observer} has held running {member} {state.value} for {now - start:.2f} s "
                    f"(bound {bound:.2f} s) at t={now:.2f}"
                )
            else:
                episodes.pop(key, None)
    for key in [k for k in episodes if k[0] not in life.running or k[1] not in life.running]:
        del episodes[key]


def _advance(
    cluster: Cluster,
    life: Life,
    episodes: dict[tuple[str, str], float],
    until: float,
    bound: float,
    pauses: dict[str, float],
) -> None:
    for _ in range(int((until - cluster.now) / SAMPLE) + 2):
        if cluster.now >= until:
            return
        cluster.run_until(min(until, cluster.now + SAMPLE))
        for peer in [p for p, t in pauses.items() if t <= cluster.now]:
            del pauses[peer]
            cluster.resume(peer)
            life.paused.discard(peer)
            life.running.add(peer)
            life.since[peer] = cluster.now
        cluster.rejoin_isolated()
        _check(cluster, life, episodes, bound)


@pytest.mark.parametrize("seed", range(int(os.environ.get("LIFECYCLE_SEEDS", "16"))))
def test_random_lifecycles_converge_and_nobody_running_stays_gone(seed: int) -> None:
    cfg = local()
    rng = random.Random(seed)
    bound = cfg.suspicion_min_timeout(POOL)
    first = rng.randint(3, POOL)
    cluster = Cluster(first, cfg, seed=seed)
    life = Life(running={peer_name(i) for i in range(first)}, since={peer_name(i): 0.0 for i in range(first)})
    never = [peer_name(i) for i in range(first, POOL)]
    episodes: dict[tuple[str, str], float] = {}
    pauses: dict[str, float] = {}
    _advance(cluster, life, episodes, 1.0, bound, pauses)
    ops: list[str] = []
    for _step in range(STEPS):
        op = rng.choice(["stop", "crash", "start", "start", "pause"])
        candidates = sorted(life.running)
        if op in ("stop", "crash", "pause") and len(candidates) > 2:
            peer = rng.choice(candidates)
            life.running.discard(peer)
            if op == "pause":
                life.paused.add(peer)
                cluster.pause(peer)
                pauses[peer] = cluster.now + rng.uniform(0.05, 2.0)
            else:
                life.down.add(peer)
                cluster.stop(peer) if op == "stop" else cluster.crash(peer)
            ops.append(f"{op} {peer} @{cluster.now:.2f}")
        elif op == "start" and (life.down or never):
            peer = rng.choice(sorted(life.down) + never)
            if peer in never:
                never.remove(peer)
            life.down.discard(peer)
            cluster.restart(peer)
            life.running.add(peer)
            life.since[peer] = cluster.now
            ops.append(f"start {peer} @{cluster.now:.2f}")
        _advance(cluster, life, episodes, cluster.now + rng.uniform(0.05, 2.5), bound, pauses)
    # let the last pauses end, then the view must settle on the truth
    _advance(cluster, life, episodes, cluster.now + 2.5, bound, pauses)
    settle = cluster.now + 10.0
    for _ in range(int(10.0 / SAMPLE) + 2):
        if all(
            {p for p, m in cluster.node(o).membership.members.items() if m.state is MemberState.ALIVE} == life.running
            for o in life.running
        ):
            break
        assert cluster.now < settle, f"no convergence to {sorted(life.running)} after {ops}"
        _advance(cluster, life, episodes, cluster.now + SAMPLE, bound, pauses)
    for o in life.running:
        view = cluster.node(o).membership
        for peer in life.down:
            assert view.state_of(peer) in (*GONE, None), f"{o} holds stopped {peer} {view.state_of(peer)}"
