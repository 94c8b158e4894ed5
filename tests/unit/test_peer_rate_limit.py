"""Job and election messages are rate-limited per authenticated sender (membership messages have their own
limiter): one key cannot make a daemon handle more than OTHER_RATE a second (twice that in a burst); the excess is
dropped and counted, and another key is not affected."""

from __future__ import annotations

from typing import Any, cast

import trio
import trio.testing

from arceusd.base.identity import Identity
from arceusd.membership.config import local
from arceusd.network.peers import OTHER_RATE, PeerService, UnaryTransport, wall_ms
from arceusd.transport import Stream
from arceusd.transport.memory import MemoryNetwork
from protocol.envelope import seal
from protocol.job_wire import JobAck
from protocol.messages import Address, JoinRequest, type_id_of


async def _refuse(_stream: Stream) -> None:
    return None


def test_non_membership_messages_are_rate_limited_per_sender() -> None:
    burst = int(2 * OTHER_RATE)
    handled: list[str] = []

    async def main() -> None:
        net = MemoryNetwork()
        services: list[PeerService] = []
        async with trio.open_nursery() as nursery:
            for i in range(3):
                identity = Identity.generate()
                holder: dict[str, PeerService] = {}

                async def on_call(request: bytes, holder: dict[str, PeerService] = holder) -> bytes:
                    return await holder["p"].handle_call(request)

                transport: Any = await nursery.start(_open, net, identity, i, on_call)
                service = PeerService(identity, cast(UnaryTransport, transport), local(), transport.address, 1)
                holder["p"] = service
                services.append(service)
            victim, flooder, other = services

            async def on_join(header: Any, msg: JoinRequest) -> JobAck:
                handled.append(header.sender)
                return JobAck(True)

            victim.register(JoinRequest, on_join)
            msg = JoinRequest("ab" * 16, flooder.identity.peer_id, Address("10.0.0.1", 7000))
            for _ in range(burst + 200):  # the clock is frozen: no tokens come back
                await flooder.request(victim.address, victim.identity.peer_id, msg, timeout=5)
            await other.request(victim.address, victim.identity.peer_id, msg, timeout=5)
            assert victim.dropped["rate_limited_other"] == 200
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())
    assert handled.count(handled[0]) == burst and len(handled) == burst + 1


def test_the_limit_applies_before_the_payload_is_decoded() -> None:
    """Issue 29: a key that floods undecodable payloads is limited before its payloads are decoded (a payload
    decoded is work done for the sender), so past its burst none of them is even read."""
    burst = int(2 * OTHER_RATE)

    async def main() -> None:
        net = MemoryNetwork()
        services: list[PeerService] = []
        async with trio.open_nursery() as nursery:
            for i in range(2):
                identity = Identity.generate()
                holder: dict[str, PeerService] = {}

                async def on_call(request: bytes, holder: dict[str, PeerService] = holder) -> bytes:
                    return await holder["p"].handle_call(request)

                transport: Any = await nursery.start(_open, net, identity, i, on_call)
                service = PeerService(identity, cast(UnaryTransport, transport), local(), transport.address, 1)
                holder["p"] = service
                services.append(service)
            victim, flooder = services
            assert await flooder.hello(victim.address, 5) is not None
            junk = b"\x81\xa6job_id" + b"\xdc\x00\x10" + b"\x80" * 16  # a map where a str belongs
            for seq in range(burst + 200):
                frame = seal(
                    flooder.identity,
                    msg_type=type_id_of(JoinRequest),
                    payload=junk,
                    boot_id=1,
                    seq=seq + 1,
                    timestamp_ms=wall_ms(),
                    recipient=victim.identity.peer_id,
                )
                assert await victim.handle_call(b"E" + frame) == b""
            assert victim.rejected["wrong_type"] == burst
            assert victim.dropped["rate_limited_other"] == 200
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock())


async def _open(
    net: MemoryNetwork,
    identity: Identity,
    i: int,
    on_call: Any,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with net.open_transport(
        identity, f"10.0.0.{i}", 7000, unary_handler=on_call, stream_handler=_refuse
    ) as transport:
        task_status.started(transport)
        await trio.sleep_forever()
