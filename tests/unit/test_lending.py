"""What a device says it lends (``arceusd.jobs.service.lending``): from its cached measurement without torch, capped by
``lend_memory_mib``, 0 while its owner has the machine back; and what a submit counts of its peers' answers."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from arceusd.device.profile import CACHE_FILE, CACHE_VERSION, DeviceMeasurement
from arceusd.jobs.plans.memory_fit import MIB
from arceusd.jobs.service import lending
from arceusd.jobs.service.lending import answerer, cached_lend, seen_lending
from arceusd.market.policy import Policy
from arceusd.market.probes import Snapshot
from arceusd.membership.events import MemberState
from protocol.lend_wire import LendQuery, LendReply


@dataclass
class Config:
    worker_threads: int = 1
    lend_memory_mib: int = 0
    devices: tuple[str, ...] = ()


@dataclass
class Paths:
    root: Path


@dataclass
class Identity:
    peer_id: str = "aa" * 16


@dataclass
class Node:
    paths: Paths
    config: Config = field(default_factory=Config)
    identity: Identity = field(default_factory=Identity)
    market: Any = None


@dataclass
class Offer:
    memory_bytes: int
    kind: str = "cpu"


class Peers:
    def __init__(self, replies: dict[str, object]) -> None:
        self.replies = replies
        states = {"aa" * 16: MemberState.ALIVE, "d1" * 16: MemberState.DEAD, "d2" * 16: MemberState.LEFT}
        states.update({p: MemberState.SUSPECT if p == "b2" * 16 else MemberState.ALIVE for p in replies})
        self.membership = SimpleNamespace(
            members={p: SimpleNamespace(address=f"{p}:1", state=s) for p, s in states.items()}
        )

    async def request(self, address: str, peer: str, msg: object, timeout: float) -> object:
        assert isinstance(msg, LendQuery)
        reply = self.replies[peer]
        if reply == "slow":
            await trio.sleep(timeout + 5)
        return reply


class Ctx:
    def __init__(self, node: Node, peers: Peers | None = None, offer_mib: int = 64) -> None:
        self.node, self.peers, self.offers = node, peers or Peers({}), 0
        self.offer_mib = offer_mib

    async def offer(self) -> Offer:
        self.offers += 1
        return Offer(self.offer_mib * MIB)


def write_profile(root: Path, free_mib: int, threads: int = 1) -> None:
    m = DeviceMeasurement("cpu", 1e10, free_mib * MIB, threads, "test cpu", time.time())
    (root / CACHE_FILE).write_text(
        json.dumps({"version": CACHE_VERSION, "measured_at": time.time(), "devices": [asdict(m)]})
    )


def test_the_cached_measurement_gives_the_offers_memory_without_measuring(tmp_path: Path) -> None:
    node = Node(Paths(tmp_path))
    assert cached_lend(node) is None  # never measured: the answer waits for the offer
    write_profile(tmp_path, 1000)
    assert cached_lend(node) == (800 * MIB, "cpu")  # the offer lends 80 % of what was free
    node.config.lend_memory_mib = 4
    assert cached_lend(node) == (4 * MIB, "cpu")
    node.config.worker_threads = 2  # measured at another thread count: the offer will measure again
    assert cached_lend(node) is None
    assert not (tmp_path / "device_profile.tmp").exists()


def test_the_answer_is_the_cache_or_the_offer_and_nothing_while_the_owner_is_back(tmp_path: Path) -> None:
    node = Node(Paths(tmp_path), Config(lend_memory_mib=4))
    ctx = Ctx(node)
    answer = answerer(ctx)
    assert trio.run(answer, None, LendQuery()) == LendReply(64 * MIB, "cpu") and ctx.offers == 1
    write_profile(tmp_path, 1000)
    assert trio.run(answer, None, LendQuery()) == LendReply(4 * MIB, "cpu") and ctx.offers == 1

    @dataclass
    class Market:
        policy: Policy
        snapshot: Snapshot

    node.market = Market(Policy(lend=False), Snapshot(None, None, None, None, 3))
    assert trio.run(answer, None, LendQuery()) == LendReply(0, "cpu")


def test_a_submit_counts_answers_within_bounds_and_the_rest_as_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lending, "ASK_TIMEOUT_S", 0.2)
    peers = Peers(
        {
            "b1" * 16: LendReply(8 * MIB),
            "b2" * 16: LendReply(0),
            "b3" * 16: LendReply(1 << 60),
            "b4" * 16: None,
            "b5" * 16: "slow",
        }
    )
    lent = trio.run(seen_lending, Ctx(Node(Paths(tmp_path)), peers, offer_mib=4))
    assert lent.own_bytes == 4 * MIB and sorted(lent.peer_bytes) == [0, 8 * MIB], lent
    assert lent.unanswered == 3  # past 16 TiB, no answer, too late; the suspect one is asked, the dead and left not
