"""A member's echo of the leader's link measurement (the leader measures each link before it plans,
:meth:`arceusd.jobs.leader.starting.Starting._measure_links` over
:func:`arceusd.device.link_probe.measure_link`): a peer in this device's membership view gets its payload back;
anyone else is refused."""

from __future__ import annotations

from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import JobAck, LinkEcho


async def on_link_echo(peers: PeerService, header: Header, msg: LinkEcho) -> LinkEcho | JobAck:
    """The payload back to a peer in the membership view (``peers``: the peer network, bound by the service)."""
    if header.sender not in peers.membership.members:
        return JobAck(False, "echoes are for peers in the membership view")
    return LinkEcho(msg.payload)


__all__ = ["on_link_echo"]
