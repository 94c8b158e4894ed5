"""The peer service's timer loop wakes when a timer is due or an event arrives, never in a spin.

PeerService.run once replaced its wake-up event before feeding its own Tick, which set the event again: the
next wait returned at once and an idle daemon spun on trio checkpoints, using 40% of a core (5 loopback daemons
saturated 2 cores and a 0.3 s SIGSTOP got a member declared dead). The test counts the core's Tick calls over
a real second on the in-memory transport and bound them by the timers' rates.
"""

from __future__ import annotations

from typing import Any, cast

import trio

from arceusd.base.identity import Identity
from arceusd.membership.config import local
from arceusd.membership.events import Tick
from arceusd.network.peers import PeerService, UnaryTransport
from arceusd.transport import Stream
from arceusd.transport.memory import MemoryNetwork

WINDOW_S = 1.0


async def _refuse(stream: Stream) -> None:
    return None


def _count_ticks(membership: Any) -> list[int]:
    """Count the Tick events ``membership.handle`` gets (in the returned one-element list)."""
    count = [0]
    original = membership.handle

    def counting(event: Any, now: float) -> Any:
        count[0] += isinstance(event, Tick)
        return original(event, now)

    membership.handle = counting
    return count


def test_peer_service_ticks_at_its_timers_rate_not_in_a_spin() -> None:
    cfg = local()
    # A probe per interval (direct deadline, probe deadline, next probe), gossip, push/pull: the most ticks a
    # second can need, doubled for events arriving between them.
    most = 2 * WINDOW_S * (3 / cfg.probe_interval + 1 / cfg.gossip_interval + 1 / cfg.push_pull_interval)
    ticks: list[list[int]] = []

    async def main() -> None:
        net = MemoryNetwork()
        async with trio.open_nursery() as nursery:
            services = []
            for i in range(2):
                identity = Identity.generate()
                holder: dict[str, PeerService] = {}

                async def on_call(request: bytes, holder: dict[str, PeerService] = holder) -> bytes:
                    return await holder["peers"].handle_call(request)

                transport = await nursery.start(_open, net, identity, i, on_call)
                address = transport.address
                peers = PeerService(identity, cast(UnaryTransport, transport), cfg, address, boot_id=1, seed=i)
                holder["peers"] = peers
                ticks.append(_count_ticks(peers.membership))
                services.append(peers)
                await nursery.start(peers.run, ("10.0.0.0:7000",) if i else ())
            with trio.fail_after(10):
                while len(services[0].membership.live_peers()) < 2:
                    await trio.sleep(0.01)
            for count in ticks:
                count[0] = 0
            await trio.sleep(WINDOW_S)
            nursery.cancel_scope.cancel()

    trio.run(main)
    for count in ticks:
        assert 0 < count[0] < most, f"{count[0]} ticks in {WINDOW_S} s (timers need at most {most:.0f})"


async def _open(net: MemoryNetwork, identity: Identity, i: int, on_call: Any, *, task_status: Any) -> None:
    async with net.open_transport(
        identity, f"10.0.0.{i}", 7000, unary_handler=on_call, stream_handler=_refuse
    ) as transport:
        task_status.started(transport)
        await trio.sleep_forever()
