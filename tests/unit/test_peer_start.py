"""A daemon is not a member until it has started every service (``PeerService.activate``), and says hello to a
member new to its table before its first probe of it.

Measured with five ``local`` daemons started together on two cores: a daemon that joined while it still started
its other services answered probes late and was suspected, and its own late probes suspected others. Here, over
the in-memory transport: before ``activate`` membership messages get no answer (counted as ``not_started``), the
seeds are not contacted and a join waits; after it, the service joins and the two become members of each other.
"""

from __future__ import annotations

from typing import Any, cast

import trio
import trio.testing

from arceusd.base.identity import Identity
from arceusd.membership.config import local
from arceusd.membership.events import MemberState
from arceusd.network.peers import PeerService, UnaryTransport
from arceusd.transport import Stream
from arceusd.transport.memory import MemoryNetwork


async def _refuse(_stream: Stream) -> None:
    return None


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


class _Counting:
    """Wraps a transport and records the payload kind of every outgoing call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, bytes]] = []

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:
        self.calls.append((address, payload[:1]))
        result: bytes = await self.inner.call(address, payload, timeout)
        return result


def test_a_service_that_is_not_started_stays_out_of_the_membership_until_activated() -> None:
    async def main() -> None:
        net = MemoryNetwork()
        async with trio.open_nursery() as nursery:
            services: list[PeerService] = []
            wrapped: list[_Counting] = []
            for i in range(2):
                identity = Identity.generate()
                holder: dict[str, PeerService] = {}

                async def on_call(request: bytes, holder: dict[str, PeerService] = holder) -> bytes:
                    return await holder["p"].handle_call(request)

                transport = _Counting(await nursery.start(_open, net, identity, i, on_call))
                service = PeerService(
                    identity, cast(UnaryTransport, transport), local(), transport.inner.address, 1, active=(i == 0)
                )
                holder["p"] = service
                services.append(service)
                wrapped.append(transport)
            member, starting = services
            await nursery.start(starting.run, (member.address,))  # its seed is the member
            await nursery.start(member.run, ())
            starting.join(member.address)  # e.g. an mDNS announcement: it waits for activate()
            member.join(starting.address)  # the member contacts it: no answer yet
            await trio.sleep(2.0)
            assert not starting.active and not wrapped[1].calls, "a starting service contacts nobody"
            assert starting.dropped["not_started"] >= 1
            assert member.membership.state_of(starting.identity.peer_id) is None
            before = len(wrapped[0].calls)
            starting.activate()
            await trio.sleep(2.0)
            assert starting.membership.state_of(member.identity.peer_id) is MemberState.ALIVE
            assert member.membership.state_of(starting.identity.peer_id) is MemberState.ALIVE
            # the member said hello to the newcomer as it entered its table (a hello is an ``H`` call), before
            # its first probe (an ``E`` call); nothing else made it say hello (its one join got no answer)
            after = wrapped[0].calls[before:]
            assert (starting.address, b"H") in after
            assert after.index((starting.address, b"H")) < after.index((starting.address, b"E"))
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.001))
