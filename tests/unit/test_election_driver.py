"""Election driver over real PeerServices on the in-memory transport (no sockets, no processes; ~3 s).

Checks the glue, not the core's logic: one leader agreed by all at one term, terms durable in the term file
(and reloaded by a fresh driver), leader-change callbacks, stale commands refused, failover after the leader's
node goes away, and bad ``track`` arguments refused with a message. Real trio clock with the ``local`` presets
(the PeerService stamps envelopes with wall time, so a mock clock racing ahead buys nothing here).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.elections.core import election_local
from arceusd.elections.driver import JobElections, load_terms, write_terms
from arceusd.membership.config import local
from arceusd.network.peers import PeerService, UnaryTransport
from arceusd.transport import Stream
from arceusd.transport.memory import MemoryNetwork

N = 3
JOB = "ab" * 16


async def _refuse(stream: Stream) -> None:
    return None


class Node:
    def __init__(self, peers: PeerService, elections: JobElections, scope: trio.CancelScope) -> None:
        self.peers, self.elections, self.scope = peers, elections, scope


async def _node(net: MemoryNetwork, i: int, terms: Path, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    identity = Identity.generate()
    holder: dict[str, PeerService] = {}

    async def on_call(request: bytes) -> bytes:
        return await holder["peers"].handle_call(request)

    seeds = tuple(f"10.0.0.{j}:7000" for j in range(N) if j != i)
    with trio.CancelScope() as scope:
        async with net.open_transport(
            identity, f"10.0.0.{i}", 7000, unary_handler=on_call, stream_handler=_refuse
        ) as transport:
            peers = PeerService(
                identity, cast(UnaryTransport, transport), local(), transport.address, boot_id=i + 1, seed=i
            )
            holder["peers"] = peers
            elections = JobElections(peers, terms, election_local(), random.Random(i))
            async with trio.open_nursery() as nursery:
                await nursery.start(peers.run, seeds)
                await nursery.start(elections.run)
                task_status.started(Node(peers, elections, scope))
                await trio.sleep_forever()


async def _wait(predicate: Any, timeout: float) -> Any:
    with trio.fail_after(timeout):
        while not (value := predicate()):
            await trio.sleep(0.01)
        return value


def _agreed(nodes: list[Node]) -> tuple[str, int] | None:
    leaders = {n.elections.leader(JOB) for n in nodes}
    if len(leaders) != 1:
        return None
    found = leaders.pop()
    states = sorted(n.elections.state(JOB) for n in nodes)
    return found if found is not None and states.count("leader") == 1 else None


def test_one_leader_durable_terms_callbacks_and_failover(tmp_path: Path) -> None:
    async def main() -> None:
        net = MemoryNetwork()
        async with trio.open_nursery() as nursery:
            nodes: list[Node] = [await nursery.start(_node, net, i, tmp_path / f"terms{i}.json") for i in range(N)]
            ids = [n.peers.identity.peer_id for n in nodes]
            await _wait(lambda: all(len(n.peers.membership.live_peers()) == N for n in nodes), 30)
            changes: list[tuple[str, tuple[str, int] | None]] = []
            nodes[0].elections.on_leader_change(lambda job, leader: changes.append((job, leader)))
            for n in nodes:
                n.elections.track(JOB, ids)
            leader, term = await _wait(lambda: _agreed(nodes), 30)
            assert term >= 1 and changes[-1] == (JOB, (leader, term))
            for i in range(N):
                saved = load_terms(tmp_path / f"terms{i}.json")[JOB]
                assert saved[0] == term and saved[1] == leader  # everyone voted for the winner in its term
                assert nodes[i].elections.summary()[JOB]["members"] == sorted(ids)

            survivors = [n for n in nodes if n.peers.identity.peer_id != leader]
            stale_ok = survivors[0].elections.check_command(JOB, term - 1, leader)
            assert stale_ok is False
            other = survivors[1].peers.identity.peer_id
            assert survivors[0].elections.check_command(JOB, term, other) is False
            assert survivors[0].elections.check_command(JOB, term, leader) is True

            nodes[ids.index(leader)].scope.cancel()  # the leader's node vanishes (no goodbye)
            new_leader, new_term = await _wait(
                lambda: (r := _agreed(survivors)) is not None and r[0] != leader and r, 60
            )
            assert new_term > term and new_leader in ids and new_leader != leader
            assert survivors[0].elections.check_command(JOB, term, leader) is False
            # A fresh driver on the same term file starts at the persisted term, never below.
            fresh = JobElections(survivors[0].peers, survivors[0].elections.terms_path, election_local())
            fresh.track(JOB, ids)
            assert fresh.term(JOB) >= new_term
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_track_rejects_bad_arguments_with_a_message(tmp_path: Path) -> None:
    async def main() -> None:
        net = MemoryNetwork()
        async with trio.open_nursery() as nursery:
            node: Node = await nursery.start(_node, net, 0, tmp_path / "terms.json")
            me = node.peers.identity.peer_id
            with pytest.raises(ValueError, match="32 lowercase hex"):
                node.elections.track("not-a-job", [me])
            with pytest.raises(ValueError, match="not among the members"):
                node.elections.track(JOB, ["cd" * 16])
            with pytest.raises(ValueError, match="member ids"):
                node.elections.track(JOB, [me, "x"])
            assert node.elections.state(JOB) == "untracked" and node.elections.leader(JOB) is None
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_term_file_is_atomic_json_and_corruption_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "terms.json"
    write_terms(path, {JOB: (7, "cd" * 16)})
    assert json.loads(path.read_text())["jobs"][JOB] == {"term": 7, "voted_for": "cd" * 16}
    assert load_terms(path) == {JOB: (7, "cd" * 16)}
    assert not path.with_name("terms.json.tmp").exists()
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="unreadable"):
        load_terms(path)
    path.write_text(json.dumps({"jobs": {JOB: {"term": -1, "voted_for": None}}}))
    with pytest.raises(RuntimeError, match="bad entry"):
        load_terms(path)
