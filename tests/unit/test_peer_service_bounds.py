"""PeerService's own bounds (issue 19): the keyring keeps at most MAX_UNVERIFIED_KEYS keys of peers that only
said hello (least recently used evicted, a member's key never), a send that fails for any reason is counted and
never raised into the membership nursery, and the drops of the core and the driver are merged for ``status``."""

from __future__ import annotations

import time
from typing import cast

import trio

from arceusd.base.identity import Identity
from arceusd.membership.config import local
from arceusd.membership.events import SendGossip, Update, UpdateKind
from arceusd.network.peers import MAX_UNVERIFIED_KEYS, PeerService, UnaryTransport
from protocol import codec
from protocol.gossip import PeerHello


class _Refusing:
    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:
        raise ConnectionRefusedError(address)


def _service() -> PeerService:
    return PeerService(
        Identity.generate(), cast(UnaryTransport, _Refusing()), local(), "127.0.0.1:1", boot_id=1, seed=0
    )


def _hello(identity: Identity) -> bytes:
    hello = PeerHello(identity.peer_id, identity.public_key_raw, "127.0.0.1:9", int(time.time() * 1000), 7, "x")
    hello = PeerHello(**{**hello.__dict__, "signature": identity.sign(hello.signed_bytes())})
    return b"H" + codec.encode(hello)


def test_keyring_of_hello_only_peers_is_bounded_and_members_are_kept() -> None:
    member = Identity.generate()

    async def main() -> PeerService:
        peers = _service()
        alive = Update(UpdateKind.ALIVE, member.peer_id, 1, member.peer_id, "127.0.0.1:2", member.public_key_raw)
        for action in peers.membership.bootstrap((alive,), 0.0):
            peers._dispatch(action)
        for _ in range(MAX_UNVERIFIED_KEYS + 200):
            assert (await peers.handle_call(_hello(Identity.generate())))[:1] == b"H"
        return peers

    peers = trio.run(main)
    assert len(peers.keyring) == 2 + MAX_UNVERIFIED_KEYS  # ourselves, the member, the newest hello-only keys
    assert peers.keyring[member.peer_id] == member.public_key_raw
    assert len(peers.info) <= 1 + MAX_UNVERIFIED_KEYS


def test_a_failing_send_is_counted_not_raised() -> None:
    async def main() -> PeerService:
        peers = _service()
        me = peers.identity.peer_id
        # an update no codec can carry (incarnation above 64 bits): building the message fails inside the send
        bad = SendGossip("someone", "127.0.0.1:3", (Update(UpdateKind.SUSPECT, "someone", 2**64, me),))
        peers.keyring["someone"] = Identity.generate().public_key_raw
        await peers._guarded_send(bad)
        return peers

    peers = trio.run(main)
    assert peers.send_failures["SendGossip"] == 1
    assert peers.drops()["send_failed_SendGossip"] == 1


def test_answering_peers_are_the_alive_then_the_suspects_never_the_dead() -> None:
    """Who a leader may still ask (a dropped replica's spares): a suspect on a loaded machine often answers, so it
    comes after the alive; a member declared dead or left is never asked."""
    from arceusd.membership.events import MemberState

    members = [Identity.generate() for _ in range(4)]
    alive, suspect, dead, left = (m.peer_id for m in members)

    async def main() -> PeerService:
        peers = _service()
        updates = tuple(
            Update(UpdateKind.ALIVE, m.peer_id, 1, m.peer_id, f"127.0.0.1:{2 + i}", m.public_key_raw)
            for i, m in enumerate(members)
        )
        for action in peers.membership.bootstrap(updates, 0.0):
            peers._dispatch(action)
        for peer, state in ((suspect, MemberState.SUSPECT), (dead, MemberState.DEAD), (left, MemberState.LEFT)):
            peers.membership.members[peer].state = state
        return peers

    peers = trio.run(main)
    got = peers.answering_peers()
    assert got.index(alive) < got.index(suspect) and dead not in got and left not in got, got
    assert peers.identity.peer_id in got
