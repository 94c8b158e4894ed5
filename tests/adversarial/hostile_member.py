"""A hostile membership peer: its own process and identity key, speaking the real protocol (the project's
transport, hello, envelopes and gossip messages, each update signed as the protocol wants) to a target daemon.

``python -m tests.adversarial.hostile_member ATTACK --target HOST:PORT [options]`` runs one attack and prints
one JSON line of what it observed. Attacks (issue #19 items 2 and 7, and the membership rate limits):

* ``overflow``: say hello, then one SwimGossip with SUSPECT about the target and DEAD about ``--victim`` at
  incarnation 2**64-1 (a hello-only peer, not a member); then join as a member (our own ALIVE) and send the same
  claims again, and claims just past the incarnation window and at the top of the range;
* ``fake-members``: SwimPushPull messages carrying ``--count`` self-signed ALIVE entries of fresh identities
  (``--per-message`` a message), ``--rounds`` times;
* ``flood``: ``--count`` signed SwimGossip messages as fast as one connection sends them (16 calls in flight).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from arceusd.base.identity import Identity  # noqa: E402
from arceusd.transport import open_transport  # noqa: E402
from protocol import codec  # noqa: E402
from protocol.envelope import seal_message  # noqa: E402
from protocol.gossip import GossipUpdate, PeerHello, SwimGossip, SwimPushPull, UpdateKind  # noqa: E402

TOP = 2**64 - 1


class Hostile:
    """One identity that talks to the target over the real transport."""

    def __init__(self, transport: Any, identity: Identity, address: str, target: str) -> None:
        self.transport, self.identity, self.address, self.target = transport, identity, address, target
        self.target_id = ""
        self.seq = itertools.count(1)
        self.boot_id = 4242
        self.answers: Counter[str] = Counter()

    async def hello(self) -> str:
        hello = PeerHello(
            self.identity.peer_id,
            self.identity.public_key_raw,
            self.address,
            int(time.time() * 1000),
            self.boot_id,
            "hostile",
        )
        hello = PeerHello(**{**hello.__dict__, "signature": self.identity.sign(hello.signed_bytes())})
        answer = await self.transport.call(self.target, b"H" + codec.encode(hello), 5.0)
        assert answer[:1] == b"H", f"no hello answer: {answer[:20]!r}"
        self.target_id = codec.decode_as(PeerHello, answer[1:]).peer_id
        return self.target_id

    def update(
        self, kind: UpdateKind, peer: str, incarnation: int, signer: Identity | None = None, address: str = ""
    ) -> GossipUpdate:
        signer = signer or self.identity
        key = signer.public_key_raw if kind is UpdateKind.ALIVE else b""
        unsigned = GossipUpdate(kind, peer, incarnation, signer.peer_id, address, key)
        return GossipUpdate(**{**unsigned.__dict__, "signature": signer.sign(unsigned.signed_bytes())})

    async def send(self, msg: object, timeout: float = 5.0) -> None:
        frame = b"E" + seal_message(
            self.identity,
            msg,
            boot_id=self.boot_id,
            seq=next(self.seq),
            timestamp_ms=int(time.time() * 1000),
            recipient=self.target_id,
        )
        try:
            answer = await self.transport.call(self.target, frame, timeout)
        except Exception as exc:
            self.answers[f"error:{type(exc).__name__}"] += 1
            return
        self.answers[{b"E": "answered", b"U": "unknown_sender", b"": "nothing"}.get(answer[:1], "other")] += 1


async def overflow(h: Hostile, victim: str) -> dict[str, Any]:
    target = await h.hello()
    claims = (h.update(UpdateKind.SUSPECT, target, TOP), h.update(UpdateKind.DEAD, victim, TOP))
    await h.send(SwimGossip(claims))  # as a peer that only said hello
    await h.send(SwimPushPull((h.update(UpdateKind.ALIVE, h.identity.peer_id, 1, address=h.address),)))
    await trio.sleep(0.3)
    for incarnation in (TOP, 2**62, 2**62 - 1, 2**40, 2**21 + 5):  # as a member: range, then window
        await h.send(
            SwimGossip(
                (h.update(UpdateKind.SUSPECT, target, incarnation), h.update(UpdateKind.DEAD, victim, incarnation))
            )
        )
    return {"target": target}


async def fake_members(h: Hostile, count: int, per_message: int, rounds: int) -> dict[str, Any]:
    await h.hello()
    fakes = [Identity.generate() for _ in range(count)]
    entries = [
        h.update(UpdateKind.ALIVE, f.peer_id, 1, signer=f, address=f"127.0.0.1:{1 + i % 1000}")
        for i, f in enumerate(fakes)
    ]
    for _ in range(rounds):
        for start in range(0, count, per_message):
            await h.send(SwimPushPull(tuple(entries[start : start + per_message])), timeout=15.0)
        await trio.sleep(0.5)
    return {"fakes": count}


FLOOD_IN_FLIGHT = 16


async def flood(h: Hostile, count: int) -> dict[str, Any]:
    """``count`` gossips, 16 calls in flight on the one connection: the rate then does not hang on one call's
    round trip (one at a time, through the peer port's gate on a loaded machine, stayed under the limit)."""
    await h.hello()
    began = time.monotonic()

    async def sender(share: int) -> None:
        for _ in range(share):
            await h.send(SwimGossip(()))

    async with trio.open_nursery() as nursery:
        for i in range(FLOOD_IN_FLIGHT):
            nursery.start_soon(sender, count // FLOOD_IN_FLIGHT + (1 if i < count % FLOOD_IN_FLIGHT else 0))
    return {"sent": count, "seconds": round(time.monotonic() - began, 3)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    identity = Identity.generate()

    async def no_answer(_request: bytes) -> bytes:
        return b""

    async def no_stream(_stream: Any) -> None:
        return

    async with open_transport(identity, "127.0.0.1", 0, unary_handler=no_answer, stream_handler=no_stream) as transport:
        h = Hostile(transport, identity, f"127.0.0.1:{transport.port}", args.target)
        if args.attack == "overflow":
            result = await overflow(h, args.victim)
        elif args.attack == "fake-members":
            result = await fake_members(h, args.count, args.per_message, args.rounds)
        else:
            result = await flood(h, args.count)
    return {**result, "attacker": identity.peer_id, "answers": dict(h.answers)}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hostile_member")
    parser.add_argument("attack", choices=["overflow", "fake-members", "flood"])
    parser.add_argument("--target", required=True)
    parser.add_argument("--victim", default="")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--per-message", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse(sys.argv[1:]))), flush=True)
