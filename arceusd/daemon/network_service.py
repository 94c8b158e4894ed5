"""The daemon's peer network service: transport + peer service (membership) + discovery, opened together.

Binding: ``listen_host:port``; when the default port is taken (another daemon on this machine) we fall back to a
free port, log it and advertise that one (mDNS and ``arceusd status`` show it), because a fixed port is only
needed for static seeds. A port given explicitly (``--port N``, ``port`` in config.toml) that is taken stops the
start with one line naming the port and the fix (:class:`~arceusd.base.failures.StartupError`). The advertised
address is ``advertise_host`` or, when listening on all interfaces, the first non-virtual IPv4 address.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from arceusd.base.failures import StartupError, leaves
from arceusd.base.fdlimit import nofile
from arceusd.device.config import DEFAULT_PORT
from arceusd.device.node import Node
from arceusd.device.summary import device_summary
from arceusd.elections.driver import install_elections
from arceusd.membership.config import MembershipConfig, lan, local
from arceusd.membership.events import MemberState
from arceusd.network.discovery import Announcement, DiscoveryStatus, candidate_addresses, serve_discovery
from arceusd.network.peers import PeerService
from arceusd.transport import Stream, open_transport
from arceusd.transport.gate_core import limits_for

log = logging.getLogger(__name__)


def membership_config(preset: str) -> MembershipConfig:
    return local() if preset == "local" else lan()


def advertised_host(node: Node) -> str:
    config = node.config
    if config.advertise_host:
        return config.advertise_host
    if config.listen_host not in ("0.0.0.0", "::", ""):
        return config.listen_host
    try:
        addresses = candidate_addresses(config.interface)
    except Exception:
        addresses = []
    return addresses[0] if addresses else "127.0.0.1"


async def _refuse_stream(stream: Stream) -> None:
    log.debug("refused a stream from %s (daemons take no streams yet)", stream.peer_id)


async def serve_peer_network(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    config = node.config
    holder: dict[str, PeerService] = {}

    async def on_call(request: bytes) -> bytes:
        service = holder.get("peers")
        return await service.handle_call(request) if service is not None else b""

    ports = [config.port] + ([0] if config.port == DEFAULT_PORT else [])
    for i, port in enumerate(ports):
        bound = False
        try:
            gate = limits_for(nofile())  # the port's connections, per source and in total, below the files limit
            async with open_transport(
                node.identity, config.listen_host, port, unary_handler=on_call, stream_handler=_refuse_stream, gate=gate
            ) as transport:
                bound = True
                await _run_network(node, transport, holder, task_status)
            return
        except (OSError, BaseExceptionGroup) as exc:  # trio wraps the transport's bind error in a group
            if bound or not _is_bind_error(exc):
                raise
            if i == len(ports) - 1:
                raise StartupError(_port_taken(config.listen_host, port)) from exc
            log.warning("port %d is taken (another daemon here?); listening on a free port instead", port)


def _is_bind_error(exc: BaseException) -> bool:
    found = leaves(exc)
    return bool(found) and all(isinstance(e, OSError) for e in found)


def _port_taken(host: str, port: int) -> str:
    return (
        f"cannot listen on {host}:{port}: the port is taken (another daemon on this machine?); "
        "choose another with --port N, or any free port with --port 0 (or `port = 0` in config.toml)"
    )


async def _run_network(
    node: Node, transport: Any, holder: dict[str, PeerService], task_status: trio.TaskStatus[None]
) -> None:
    config = node.config
    address = f"{advertised_host(node)}:{transport.port}"
    mconfig = membership_config(config.preset)
    # Not a member until the daemon has started every service (see PeerService.activate).
    device = device_summary(node.paths.root, node.config.devices)  # the GPU once measured (and re-sent then)
    peers = PeerService(node.identity, transport, mconfig, address, node.boot_id, device, active=False)
    holder["peers"] = peers
    node.peers = peers
    node.addresses["peer"] = address
    node.sections["peers"] = peers.peers
    node.sections["device"] = lambda: peers.device  # this machine's line, as its peers see it
    node.sections["membership"] = peers.counters
    node.sections["transport"] = transport.counters  # refused calls/streams/frames by reason, slots in use
    # transport.counters() copies under the transport's lock (grpc's threads count refusals concurrently)
    node.sections["dropped"] = lambda: {"membership": peers.drops(), "transport": transport.counters()["rejected"]}
    discovery_status = DiscoveryStatus()
    node.sections["discovery"] = discovery_status.summary

    async def peers_method(_params: dict[str, Any]) -> list[dict[str, Any]]:
        return peers.peers()

    node.methods["peers"] = peers_method
    elections = install_elections(node, peers)
    node.shutdown_hooks.append(peers.leave)
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.run, tuple(config.peers))

        async def activate_when_started() -> None:
            await node.started.wait()
            peers.activate()

        nursery.start_soon(activate_when_started)
        await nursery.start(elections.run)
        if config.mdns:
            found_send, found_recv = trio.open_memory_channel[Announcement](64)

            async def discovery(task_status: trio.TaskStatus[None]) -> None:
                await serve_discovery(
                    peer_id=node.identity.peer_id,
                    port=transport.port,
                    fingerprint=node.identity.fingerprint,
                    interface=config.interface,
                    found=found_send,
                    status=discovery_status,
                    instance=f"{node.boot_id:x}"[:12],
                    task_status=task_status,
                )

            await nursery.start(discovery)
            nursery.start_soon(_join_announced, peers, found_recv)
        task_status.started()


async def _join_announced(peers: PeerService, found: trio.MemoryReceiveChannel[Announcement]) -> None:
    async for announcement in found:
        if peers.membership.state_of(announcement.peer_id) is not MemberState.ALIVE:
            peers.join(f"{announcement.host}:{announcement.port}")
