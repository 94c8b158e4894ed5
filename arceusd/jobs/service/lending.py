"""What the devices this daemon sees lend, asked at ``submit``: its own offer and its alive peers' answers.

Owns both sides of :class:`protocol.lend_wire.LendQuery`: :func:`seen_lending` asks every alive peer this daemon
knows (at most :data:`MAX_ASKED`, all at once, each within :data:`ASK_TIMEOUT_S`) and :func:`answerer` tells a peer
what this device lends (its offer's memory, capped by ``lend_memory_mib``; 0 while its owner's lending policy
says the machine is theirs now). The offer comes from the device's measurement cached in its state directory
(:func:`cached_lend`, torch-free, what the offer is made of for a day) so a peer answers at once; only a device
never measured measures itself first (a torch child: seconds). Answers are bounded like a join's offer
(``arceusd.jobs.judging.claims``); a peer that does not answer in time is counted as unknown, never as lending nothing
(:mod:`arceusd.jobs.plans.memory_fit`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import trio

from arceusd.device.profile import chosen_measurement, load_or_measure, to_device_profile
from arceusd.jobs.judging.claims import check_offer_bounds
from arceusd.jobs.plans.memory_fit import Lent
from arceusd.market.policy import owner_back
from arceusd.membership.events import MemberState
from protocol.lend_wire import LendQuery, LendReply

log = logging.getLogger(__name__)


class _Identity(Protocol):
    @property
    def peer_id(self) -> str: ...


class _Paths(Protocol):
    @property
    def root(self) -> Path: ...


class _Config(Protocol):
    @property
    def worker_threads(self) -> int: ...

    @property
    def lend_memory_mib(self) -> int: ...

    @property
    def devices(self) -> tuple[str, ...]: ...


class LendingNode(Protocol):
    """What this module reads of the daemon's node (``arceusd.device.node.Node`` fits; its ``market``, when it
    has one, is looked up by name)."""

    @property
    def identity(self) -> _Identity: ...

    @property
    def paths(self) -> _Paths: ...

    @property
    def config(self) -> _Config: ...


class _Member(Protocol):
    @property
    def address(self) -> str: ...

    @property
    def state(self) -> MemberState: ...


class _Membership(Protocol):
    @property
    def members(self) -> Mapping[str, _Member]: ...


class LendingPeers(Protocol):
    """What this module uses of the peer service (``arceusd.network.peers.PeerService`` fits)."""

    @property
    def membership(self) -> _Membership: ...

    async def request(self, address: str, peer: str, msg: object, timeout: float) -> object: ...


class LentOffer(Protocol):
    """What this module reads of an offer (``arceusd.jobs.plans.planning.Offer`` fits)."""

    @property
    def memory_bytes(self) -> int: ...

    @property
    def kind(self) -> str: ...


class LendingContext(Protocol):
    """What this module uses of the job service (:class:`LendingPorts`, built by the composition root, fits)."""

    @property
    def node(self) -> LendingNode: ...

    @property
    def peers(self) -> LendingPeers: ...

    async def offer(self) -> LentOffer: ...


@dataclass(frozen=True)
class LendingPorts:
    """A :class:`LendingContext` the composition root builds (issue 32: a port, not the manager): the node, the peer
    network and this device's offer."""

    node: LendingNode
    peers: LendingPeers
    offer: Callable[[], Coroutine[Any, Any, LentOffer]]


ASK_TIMEOUT_S = 5.0
"""How long a submit waits for a peer's answer (a peer measures itself on its first offer: seconds)."""
MAX_ASKED = 64
"""The most peers one submit asks; the others count as unknown."""


def seen_peers(peers: LendingPeers) -> dict[str, str]:
    """peer id -> address of every member this daemon holds alive or suspects (a suspect is most often alive:
    a busy machine answers its probes late)."""
    return {
        p: m.address for p, m in peers.membership.members.items() if m.state in (MemberState.ALIVE, MemberState.SUSPECT)
    }


async def seen_lending(ctx: LendingContext) -> Lent:
    """What this device and the peers it knows alive (or suspects) lend. Error handling: a peer that fails or says
    something out of bounds counts as unanswered; this device's own offer failing raises as ``ctx.offer`` does."""
    own = await ctx.offer()
    me = ctx.node.identity.peer_id
    alive = sorted((p, a) for p, a in seen_peers(ctx.peers).items() if p != me and a)
    asked, skipped = alive[:MAX_ASKED], max(len(alive) - MAX_ASKED, 0)
    answers: dict[str, int] = {}

    async def ask(peer: str, address: str) -> None:
        reply = await ctx.peers.request(address, peer, LendQuery(), ASK_TIMEOUT_S)
        if isinstance(reply, LendReply) and reply.memory_bytes == 0:
            answers[peer] = 0
        elif isinstance(reply, LendReply) and check_offer_bounds(reply.memory_bytes, 1.0) is None:
            answers[peer] = int(reply.memory_bytes)

    with trio.move_on_after(ASK_TIMEOUT_S + 1.0):
        async with trio.open_nursery() as nursery:
            for peer, address in asked:
                nursery.start_soon(ask, peer, address)
    unanswered = len(asked) - len(answers) + skipped
    if unanswered:
        log.info("%d of %d peer(s) did not say what they lend", unanswered, len(alive))
    return Lent(int(own.memory_bytes), tuple(answers[p] for p in sorted(answers)), unanswered)


class _NotMeasured(Exception):
    pass


def _not_measured() -> NoReturn:
    raise _NotMeasured


def cached_lend(node: LendingNode) -> tuple[int, str] | None:
    """(memory lent, kind) from this device's cached measurement (``arceusd.device.profile``; the offer's memory is 80 %
    of what was free, capped by ``lend_memory_mib``), or None when there is none for its worker threads today."""
    try:
        found = load_or_measure(node.paths.root, threads=node.config.worker_threads, measure=_not_measured)
        device = to_device_profile(chosen_measurement(found, node.config.devices), "this-device")
    except (_NotMeasured, ValueError, OSError):
        return None
    memory = device.memory_bytes
    if node.config.lend_memory_mib:
        memory = min(memory, node.config.lend_memory_mib << 20)
    return memory, device.kind


def lends_now(node: LendingNode) -> bool:
    """Whether this device's owner lets it lend now (no market service: yes)."""
    market = getattr(node, "market", None)
    if market is None:
        return True
    return not owner_back(market.policy, market.snapshot)


def answerer(ctx: LendingContext) -> Callable[[object, LendQuery], Awaitable[LendReply]]:
    """The peer handler answering a :class:`LendQuery` with what this device lends."""

    async def answer(_header: object, _msg: LendQuery) -> LendReply:
        cached = cached_lend(ctx.node)
        if cached is None:
            offer = await ctx.offer()
            cached = int(offer.memory_bytes), str(offer.kind)
        memory, kind = cached
        return LendReply(memory if lends_now(ctx.node) else 0, kind)

    return answer


__all__ = [
    "ASK_TIMEOUT_S",
    "MAX_ASKED",
    "LendingContext",
    "LendingPorts",
    "answerer",
    "cached_lend",
    "lends_now",
    "seen_lending",
    "seen_peers",
]
