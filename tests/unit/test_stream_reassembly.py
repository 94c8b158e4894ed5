"""Stream frames that span several wire messages (the transport splits a frame over max_message) are put back
together exactly, wherever the messages were cut, and a frame over the limits is refused from its prefix."""

from __future__ import annotations

import os
import random
from collections import Counter

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.transport.stream import Stream, TransportConfig, split_parts
from protocol import stream_auth as sa
from protocol.errors import RemoteProtocolError


class ListConduit:
    """Delivers a fixed list of messages, then a clean end."""

    max_message: int | None = None

    def __init__(self, messages: list[bytes]) -> None:
        self.messages = list(messages)
        self.aborted = ""

    async def wait_space(self) -> None:
        return None

    def put_nowait(self, message: bytes | tuple[bytes, ...]) -> None:
        return None

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint()
        if not self.messages:
            raise trio.EndOfChannel
        return self.messages.pop(0)

    def finish_sending(self) -> None:
        return None

    async def wait_flushed(self) -> None:
        return None

    def abort(self, details: str) -> None:
        self.aborted = details


def sessions(limits: sa.Limits, server_limits: sa.Limits | None = None) -> tuple[sa.Session, sa.Session]:
    client, server = Identity.generate(), Identity.generate()
    hs = sa.ClientHandshake(client, purpose=b"p", expect_peer_id=None, now_ms=1, random_bytes=os.urandom, limits=limits)
    srv = sa.ServerHandshake(server, hs.hello, now_ms=1, random_bytes=os.urandom, limits=server_limits or limits)
    client_session, finish = hs.receive_ack(srv.ack, now_ms=1)
    return client_session, srv.receive_finish(finish)


def receiver(messages: list[bytes], session: sa.Session, rejected: Counter[str]) -> Stream:
    return Stream(ListConduit(messages), session, rejected, TransportConfig())


def test_split_parts_copies_into_messages_of_at_most_the_limit() -> None:
    parts = (b"head", memoryview(bytes(range(256)) * 40), b"tag-16-bytes....")
    whole = b"".join(bytes(p) for p in parts)
    for limit in (1, 7, 100, 4096, len(whole) - 1, len(whole), len(whole) + 5):
        messages = split_parts(parts, limit)
        assert b"".join(messages) == whole
        assert all(0 < len(m) <= limit for m in messages)
        assert len(messages) == -(-len(whole) // limit)


@pytest.mark.parametrize("seed", range(20))
def test_frames_cut_anywhere_come_back_whole(seed: int) -> None:
    rng = random.Random(seed)
    limits = sa.Limits(max_header=64, max_payload=50_000)
    sender, receiving = sessions(limits)
    frames = [(b"h%d" % i, rng.randbytes(rng.choice([0, 1, 7, 100, 4_000, 50_000]))) for i in range(30)]
    wire = b"".join(sender.sealer.seal(h, p) for h, p in frames) + sender.sealer.seal(b"", b"", kind=sa.FRAME_CLOSE)
    cuts = sorted(rng.sample(range(1, len(wire)), 60))
    messages = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    rejected: Counter[str] = Counter()

    async def run() -> list[tuple[bytes, bytes]]:
        stream = receiver(messages, receiving, rejected)
        got: list[tuple[bytes, bytes]] = []
        while True:
            try:
                header, payload = await stream.receive()
            except trio.EndOfChannel:
                return got
            got.append((header, bytes(payload)))

    assert trio.run(run) == frames
    assert not rejected


def test_a_frame_over_the_limits_is_refused_from_its_prefix() -> None:
    sender, receiving = sessions(sa.Limits(max_payload=1 << 30), sa.Limits(max_payload=1_000))
    wire = sender.sealer.seal(b"h", bytes(2_000))
    rejected: Counter[str] = Counter()

    async def run() -> None:
        stream = receiver([wire[:20], wire[20:]], receiving, rejected)
        with pytest.raises(RemoteProtocolError):
            await stream.receive()

    trio.run(run)
    assert rejected["frame_too_large"] == 1
