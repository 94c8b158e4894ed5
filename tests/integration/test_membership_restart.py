"""A daemon that left (``SIGTERM``, as ``arceusd stop`` sends) and starts again with the same identity is alive at
every peer as fast as a new peer joins (issue 17): real daemons on loopback, ``local`` preset, static seeds.

Until the fix, the peers that saw it leave held it ``left`` until they forgot it (the tombstone, 5 s here and 60 s
with ``lan``): the full-state sync carried LEFT as a claim by the sender, which the receiver rightly drops (only
the subject may say it left), so the restarted daemon never heard it was held gone and never refuted.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arceusd.cli.swarm import LocalSwarm
from tests.harness import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
N = 4
JOIN_BOUND_S = 3.0


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    s = LocalSwarm(tmp_path, N)
    try:
        s.start()
        yield s
    finally:
        s.close()


def states(s: LocalSwarm, i: int) -> dict[str, str]:
    return {p["peer_id"]: p["state"] for p in s.call(i, "peers")}


def all_alive(s: LocalSwarm, ids: list[str]) -> bool:
    return all(
        {p for p, st in states(s, i).items() if st == "alive"} == {ids[j] for j in range(N) if j != i} for i in range(N)
    )


@pytest.mark.parametrize("how", ["stop", "crash"])
def test_restarted_daemon_is_alive_everywhere_within_the_join_time(swarm: LocalSwarm, how: str) -> None:
    ids = [swarm.call(i, "status")["peer_id"] for i in range(N)]
    wait_for(lambda: all_alive(swarm, ids), 20, 0.1, "4 daemons converge")
    gone = "left" if how == "stop" else "dead"
    for _round in range(2):  # twice: the second life must beat the first one's refuted incarnation too
        swarm.signal(3, signal.SIGTERM if how == "stop" else signal.SIGKILL)
        swarm.wait(3, timeout=10)
        wait_for(lambda: all(states(swarm, i).get(ids[3]) == gone for i in range(3)), 10, 0.05, f"seen {gone}")
        swarm.restart(3)
        t0 = time.monotonic()
        wait_for(lambda: all_alive(swarm, ids), 10, 0.05, "restarted daemon alive everywhere")
        took = time.monotonic() - t0
        assert took < JOIN_BOUND_S, f"restarted daemon ({how}) took {took:.2f} s to be alive everywhere"
        assert swarm.call(3, "status")["membership"]["incarnation"] >= 2  # it refuted its previous life
