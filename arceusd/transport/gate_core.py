"""Which TCP connections the peer port keeps: per source and in total, with deadlines. Pure (a clock is passed in).

This module owns the bookkeeping of :mod:`arceusd.transport.gate` (the trio front that accepts the peer port's
connections and relays them to gRPC). gRPC's C-core accepts every connection it is offered and keeps it for as
long as the client likes: 1,100 connections that sent the HTTP/2 preface and went quiet took a daemon past its
1,024 open files within a second, and it exited. Here:

* **Bounded in total and per source**: at most ``max_connections`` connections, at most ``max_per_source`` from
  one source (an IPv4 address; an IPv6 /64, which one host usually holds whole). :func:`limits_for` derives both
  from the open-files limit, keeping a reserve for everything else the daemon opens.
* **Fair when full**: a newcomer from a source holding less than half as many connections as the heaviest
  source (at least two fewer) takes the place of one of that source's connections (its unproven ones first,
  then its longest quiet), so a stranger with many addresses cannot keep a real peer's first connection out;
  other newcomers are refused. (Half, not merely fewer: a stranger's own sources, each near its share, would
  otherwise evict each other in turn, and every eviction and reconnect costs the daemon a relay and a gRPC
  connection: measured, 432 evictions and 1,103 connections kept in 12 s under 1,124 connections from 32 hosts.)
* **Deadlines**: a connection must complete a call (or a stream handshake) before it has been quiet for
  ``hello_timeout`` (no byte from the client) and within ``hello_limit`` of opening (a first call may be a
  4 MiB message on a slow link, so bytes still arriving hold the first deadline off, never the second); a
  connection with nothing in flight is closed after ``idle_timeout`` without a byte either way. A call in
  flight holds all of them off (a handler may take its time).

Refusals and closes are counted by reason (``source_full``, ``total_full``, ``evicted``, ``hello_timeout``,
``idle_timeout``) in :attr:`ConnectionTable.counts`.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field

#: Descriptors one relayed connection costs the daemon: the accepted socket, the gate's socket to gRPC and
#: gRPC's end of that.
FDS_PER_CONNECTION = 3


@dataclass(frozen=True)
class GateLimits:
    """How many connections the peer port keeps, and for how long (see the module docstring)."""

    max_connections: int = 256
    max_per_source: int = 32
    hello_timeout: float = 3.0
    idle_timeout: float = 30.0
    hello_limit: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_per_source <= self.max_connections:
            raise ValueError("need 1 <= max_per_source <= max_connections")
        if not 0 < self.hello_timeout <= self.hello_limit or self.idle_timeout <= 0:
            raise ValueError("need 0 < hello_timeout <= hello_limit and idle_timeout > 0")


def reserve_for(nofile: int) -> int:
    """Descriptors kept for everything but the peer port's connections (control socket, dashboard, outgoing
    channels, checkpoints, workers' pipes): a quarter of the limit, and at least 256 or half of it."""
    return max(nofile // 4, min(256, nofile // 2))


def limits_for(nofile: int, hello_timeout: float = 3.0, idle_timeout: float = 30.0) -> GateLimits:
    """The gate's limits under an open-files limit of ``nofile``: its connections and their descriptors stay
    below ``nofile - reserve_for(nofile)``; at most 1,024 connections, and a source at most an eighth of them
    (at most 64, at least 2). 1,024 files give 256 connections, 32 per source."""
    total = max(8, min(1024, (nofile - reserve_for(nofile)) // FDS_PER_CONNECTION))
    per_source = max(2, min(64, total // 8))
    return GateLimits(total, per_source, hello_timeout, idle_timeout)


def source_key(host: str) -> str:
    """The unit one source's budget is counted in: the IPv4 address, or the IPv6 /64 (an IPv4-mapped IPv6
    address counts as its IPv4 address); anything else as it is."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))
    return str(address)


@dataclass
class Connection:
    """One kept connection's state."""

    source: str
    opened: float
    last_active: float
    last_inbound: float
    proven: bool = False
    busy: int = 0


@dataclass(frozen=True)
class Admit:
    """The answer to a new connection: ``refused`` (a reason) or kept, taking the place of ``evict`` if set."""

    refused: str | None = None
    evict: int | None = None


@dataclass
class ConnectionTable:
    """The kept connections by id, their sources' counts, and the counters of what was refused or closed."""

    limits: GateLimits
    connections: dict[int, Connection] = field(default_factory=dict)
    per_source: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)

    def admit(self, cid: int, host: str, now: float) -> Admit:
        """Keep connection ``cid`` from ``host``, or refuse it; when the table is full, the answer may name a
        connection to close in its place (already removed here)."""
        source = source_key(host)
        held = self.per_source[source]
        if held >= self.limits.max_per_source:
            self.counts["source_full"] += 1
            return Admit(refused="source_full")
        evict: int | None = None
        if len(self.connections) >= self.limits.max_connections:
            evict = self._victim(held)
            if evict is None:
                self.counts["total_full"] += 1
                return Admit(refused="total_full")
            self.release(evict)
            self.counts["evicted"] += 1
        self.connections[cid] = Connection(source, now, now, now)
        self.per_source[source] += 1
        self.counts["accepted"] += 1
        return Admit(evict=evict)

    def _victim(self, newcomer_held: int) -> int | None:
        """A connection of the heaviest source, if the newcomer's holds less than half as many (two fewer)."""
        if not self.per_source:
            return None
        heaviest, held = max(self.per_source.items(), key=lambda item: (item[1], item[0]))
        if held < 2 * newcomer_held + 2:
            return None
        candidates = [
            (c.busy > 0, c.proven, c.last_active, cid) for cid, c in self.connections.items() if c.source == heaviest
        ]
        return min(candidates)[3] if candidates else None

    def release(self, cid: int) -> None:
        """Forget ``cid`` (closed by either side); unknown ids are ignored."""
        conn = self.connections.pop(cid, None)
        if conn is None:
            return
        self.per_source[conn.source] -= 1
        if self.per_source[conn.source] <= 0:
            del self.per_source[conn.source]

    def touch(self, cid: int, now: float, inbound: bool) -> None:
        """Bytes moved on ``cid`` (``inbound``: from the client)."""
        conn = self.connections.get(cid)
        if conn is not None:
            conn.last_active = now
            if inbound:
                conn.last_inbound = now

    def enter(self, cid: int, now: float) -> None:
        """A call or stream began on ``cid``."""
        conn = self.connections.get(cid)
        if conn is not None:
            conn.busy += 1
            conn.last_active = now

    def leave(self, cid: int, now: float, proven: bool) -> None:
        """A call or stream on ``cid`` ended; ``proven``: it was answered (a call) or its handshake completed."""
        conn = self.connections.get(cid)
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            conn.last_active = now
            conn.proven = conn.proven or proven

    def prove(self, cid: int) -> None:
        """``cid`` completed a call or a stream handshake: the hello deadline no longer applies."""
        conn = self.connections.get(cid)
        if conn is not None:
            conn.proven = True

    def expired(self, now: float) -> list[int]:
        """Connections past a deadline, removed and counted by reason: to close now."""
        out: list[int] = []
        for cid, conn in list(self.connections.items()):
            if conn.busy > 0:
                continue
            if not conn.proven and (
                now - conn.last_inbound >= self.limits.hello_timeout or now - conn.opened >= self.limits.hello_limit
            ):
                self.counts["hello_timeout"] += 1
            elif now - conn.last_active >= self.limits.idle_timeout:
                self.counts["idle_timeout"] += 1
            else:
                continue
            self.release(cid)
            out.append(cid)
        return out

    def snapshot(self) -> dict[str, int]:
        """Connections and sources held now."""
        return {"connections": len(self.connections), "sources": len(self.per_source)}


__all__ = [
    "FDS_PER_CONNECTION",
    "Admit",
    "Connection",
    "ConnectionTable",
    "GateLimits",
    "limits_for",
    "reserve_for",
    "source_key",
]
