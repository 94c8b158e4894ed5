"""Discovery: advertise this daemon with mDNS (``_arceus._tcp.local.``) and browse for others.

The only module that imports zeroconf. zeroconf runs its own asyncio loop in a thread; its browser callbacks are
forwarded into trio through a memory channel (``trio.from_thread.run_sync`` with the trio token), and its blocking
calls run in trio worker threads. An announcement is only a *hint*: it yields a :class:`Announcement` (peer id,
address, port) that the membership driver must confirm with a signed handshake before the peer enters the view.

Interfaces: by default every IPv4 address of every interface except loopback and virtual bridges (docker, veth,
virbr, ...), which would otherwise leak announcements into containers; ``--interface NAME`` picks one, loopback
included (``--interface lo``: daemons on one machine find each other over 127.0.0.1 and advertise it).

Duplicate identities (a copied state directory): a name clash at registration, or an announcement carrying our own
peer id from another address, is reported (``duplicates`` in the status) and never merged.

Error handling: malformed TXT records are dropped and counted (``rejected``); zeroconf failures at start raise
:class:`DiscoveryError` with what to do (choose an interface, or use ``--no-mdns`` with ``--peer`` seeds).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ifaddr
import trio
from zeroconf import (
    IPVersion,
    NonUniqueNameException,
    ServiceBrowser,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
)

from arceusd.base.failures import UserError
from protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)

SERVICE_TYPE = "_arceus._tcp.local."
VIRTUAL_PREFIXES = (
    "docker",
    "br-",
    "veth",
    "virbr",
    "vmnet",
    "vboxnet",
    "lxc",
    "lxd",
    "cni",
    "flannel",
    "cali",
    "podman",
    "kube",
    "vnet",
    "tap",
    "tun",
    "utun",
    "zt",
    "awdl",
    "llw",
)
_PEER_ID = re.compile(r"^[0-9a-f]{32}$")


class DiscoveryError(UserError):
    """mDNS cannot run as configured; the message says what to do instead."""


@dataclass(frozen=True)
class Announcement:
    """What another daemon announced: a hint to be confirmed by a handshake."""

    peer_id: str
    host: str
    port: int
    protocol_version: int
    fingerprint: str


def candidate_addresses(interface: str | None) -> list[str]:
    """IPv4 addresses to announce on: those of ``interface``, or of every non-virtual, non-loopback interface."""
    found: list[str] = []
    names: list[str] = []
    for adapter in ifaddr.get_adapters():
        name = str(adapter.nice_name or adapter.name)
        names.append(name)
        if interface is not None and name != interface and adapter.name != interface:
            continue
        if interface is None and name.startswith(VIRTUAL_PREFIXES):
            continue
        for ip in adapter.ips:
            # loopback only when named: `--interface lo` is a one-machine swarm; by default it is skipped
            if isinstance(ip.ip, str) and (interface is not None or not ip.ip.startswith("127.")):
                found.append(ip.ip)
    if interface is not None and not found:
        raise DiscoveryError(
            f"interface {interface!r} has no IPv4 address (interfaces here: {', '.join(sorted(set(names)))}); "
            "name one of those with --interface, or use --no-mdns with --peer host:port seeds"
        )
    return sorted(set(found))


def parse_txt(properties: dict[bytes, bytes | None]) -> tuple[str, int, int, str] | None:
    """(peer id, port, protocol version, fingerprint) from TXT properties, or None when malformed."""
    try:
        peer_id = (properties.get(b"id") or b"").decode("ascii")
        port = int((properties.get(b"port") or b"").decode("ascii"))
        version = int((properties.get(b"v") or b"").decode("ascii"))
        fp = (properties.get(b"fp") or b"").decode("ascii")
    except (UnicodeDecodeError, ValueError):
        return None
    if not _PEER_ID.match(peer_id) or not 0 < port <= 65535 or len(fp) > 64:
        return None
    return peer_id, port, version, fp


@dataclass
class DiscoveryStatus:
    addresses: list[str] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        return {
            "mdns_addresses": self.addresses,
            "seen": dict(self.seen),
            "duplicates": list(self.duplicates),
            "rejected": dict(self.rejected),
        }


async def serve_discovery(
    *,
    peer_id: str,
    port: int,
    fingerprint: str,
    interface: str | None,
    found: trio.MemorySendChannel[Announcement],
    status: DiscoveryStatus,
    instance: str = "",
    on_duplicate: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Announce ourselves and send every valid announcement of another daemon to ``found``, until cancelled.

    ``instance`` (the boot id) makes the service name unique per run, so two daemons sharing a copied identity
    never pass zeroconf's name check together and miss each other; they are told apart by the TXT id instead.
    """
    addresses = candidate_addresses(interface)
    if not addresses:
        raise DiscoveryError(
            "no network interface to announce on (only loopback or virtual ones); "
            "use --interface NAME, or --no-mdns with --peer host:port seeds"
        )
    status.addresses = addresses
    token = trio.lowlevel.current_trio_token()
    names_send, names_recv = trio.open_memory_channel[str](256)

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            with contextlib.suppress(trio.WouldBlock, trio.RunFinishedError, trio.ClosedResourceError):
                trio.from_thread.run_sync(names_send.send_nowait, name, trio_token=token)

    def open_zeroconf() -> Zeroconf:
        return Zeroconf(interfaces=addresses, ip_version=IPVersion.V4Only, use_asyncio=False)

    try:
        zc = await trio.to_thread.run_sync(open_zeroconf)
    except OSError as exc:
        raise DiscoveryError(f"cannot open mDNS sockets on {addresses}: {exc}; try --interface or --no-mdns") from exc
    info = ServiceInfo(
        SERVICE_TYPE,
        f"{peer_id}{'-' + instance if instance else ''}.{SERVICE_TYPE}",
        addresses=[socket.inet_aton(a) for a in addresses],
        port=port,
        properties={"id": peer_id, "port": str(port), "v": str(PROTOCOL_VERSION), "fp": fingerprint},
        server=f"arceus-{peer_id[:16]}{'-' + instance if instance else ''}.local.",
    )
    browser: ServiceBrowser | None = None
    try:
        try:
            await trio.to_thread.run_sync(lambda: zc.register_service(info, allow_name_change=False))
        except NonUniqueNameException:
            message = (
                f"another device on this network announces our peer id {peer_id} (a copied state directory?). "
                "Give one of them a fresh identity: stop it, move its identity.key away, start it again."
            )
            log.error("%s", message)
            status.duplicates.append("mdns-name-clash")
            if on_duplicate is not None:
                on_duplicate(message)
        browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change])
        task_status.started()
        own = set(addresses)
        async with names_recv:
            async for name in names_recv:
                resolved = await trio.to_thread.run_sync(
                    functools.partial(zc.get_service_info, SERVICE_TYPE, name, 3000), abandon_on_cancel=True
                )
                if resolved is None:
                    continue
                parsed = parse_txt(dict(resolved.properties))
                hosts = resolved.parsed_addresses(IPVersion.V4Only)
                if parsed is None or not hosts:
                    status.rejected["malformed_txt"] += 1
                    continue
                other_id, other_port, version, fp = parsed
                if other_id == peer_id:
                    if other_port != port or not own.intersection(hosts):
                        where = f"{hosts[0]}:{other_port}"
                        if where not in status.duplicates:
                            status.duplicates.append(where)
                            message = f"a device at {where} uses our peer id {peer_id} (a copied state directory?)"
                            log.error("%s", message)
                            if on_duplicate is not None:
                                on_duplicate(message)
                    continue
                if version != PROTOCOL_VERSION:
                    status.rejected["protocol_version"] += 1
                    continue
                status.seen[other_id] = f"{hosts[0]}:{other_port}"
                try:
                    found.send_nowait(Announcement(other_id, hosts[0], other_port, version, fp))
                except trio.WouldBlock:
                    status.rejected["backlog"] += 1
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(3):
                if browser is not None:
                    await trio.to_thread.run_sync(browser.cancel)
                await trio.to_thread.run_sync(zc.unregister_service, info)
            await trio.to_thread.run_sync(zc.close)
