"""The peer port's front: a trio accept loop that keeps or refuses each TCP connection and relays the kept ones
to the gRPC server on a private unix socket.

Why a front: gRPC's C-core accepts every connection itself and keeps it as long as the client likes, and its
only bound (``grpc.max_allowed_incoming_connections``) is a total: measured here, 1,100 connections that sent the
HTTP/2 preface from one address took a daemon at 1,024 open files past its limit within a second and it exited
(``too many open files``); with that option alone the descriptors held, but the attacker held every place and a
real peer's new connection failed (``UNAVAILABLE``) for as long as it kept them. gRPC has no per-source bound and
grpcio cannot be handed an accepted socket, so this front accepts, decides with the pure
:class:`~arceusd.transport.gate_core.ConnectionTable` (per source, in total, fair when full, hello and idle
deadlines), and relays bytes both ways for the connections it keeps. It also backs off on ``EMFILE``
(:mod:`arceusd.base.fdlimit`) instead of ending the daemon.

gRPC listens on ``unix:DIR/g`` in a private directory (mode 0700, made by :func:`open_gate_dir`), so nobody can
go around the gate (a loopback TCP port would let any local user in). Each relayed connection dials it from a
socket bound to ``DIR/c<id>`` (the name is removed at once; the peer address stays), so the gRPC handler's
``context.peer()`` names the connection (``unix:DIR/c<id>``): :meth:`Gate.source_of` gives the transport the
real source address for its per-source admission, and :meth:`Gate.enter`/:meth:`Gate.leave` tell the table
when a connection has a call in flight and has completed one (the hello deadline).

Cost: one relayed connection holds three descriptors (:data:`~arceusd.transport.gate_core.FDS_PER_CONNECTION`)
and every byte is copied once more in the daemon's trio thread; the daemon's port carries control messages and
checkpoint shards, not the workers' tensors (a stage worker's own port is not behind a gate).

Error handling: a connection whose relay fails (either side reset, gRPC's socket refused) is closed and
counted (``relay_failed``); the accept loop ends only when cancelled.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from arceusd.base.fdlimit import AcceptBackoff
from arceusd.transport.gate_core import ConnectionTable, GateLimits

#: Bytes read at once from either side of a relayed connection.
_CHUNK = 256 * 1024
#: Seconds between sweeps for connections past their hello or idle deadline.
_SWEEP_S = 0.25
#: Connections accepted in one go before the loop lets other tasks run.
_ACCEPT_BATCH = 64
#: SO_LINGER on, 0 s: close sends a reset.
_RESET = struct.pack("ii", 1, 0)
#: Errors of accept about the one connection it tried to take, not the listener (trio's SocketListener's list).
_TRANSIENT_ACCEPT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EPERM",
        "ECONNABORTED",
        "EPROTO",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
    )
    if hasattr(errno, name)
)


def open_gate_dir() -> Path:
    """A fresh private directory (0700) for the gRPC server's socket and the relays' socket names."""
    return Path(tempfile.mkdtemp(prefix="arceus-"))


def remove_gate_dir(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


async def open_listener(host: str, port: int, backlog: int = 4096) -> socket.socket:
    """A non-blocking listening TCP socket on ``host:port`` (port 0: a free one). ``::`` also takes IPv4. The
    backlog is as long as the system allows (Linux caps it at ``net.core.somaxconn``, 4,096 by default), so a
    burst of a stranger's connections waits there instead of making a real peer's connect time out and retry.

    Error handling: OSError when the address cannot be bound (the port is taken)."""
    infos = await trio.socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host}")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class Gate:
    """The connections the peer port keeps (trio's thread accepts and relays; gRPC's threads look up sources
    and mark calls through the thread-safe methods)."""

    def __init__(self, limits: GateLimits, directory: Path) -> None:
        self.limits = limits
        self.directory = directory
        self.upstream = directory / "g"
        self.table = ConnectionTable(limits)
        self.backoff = AcceptBackoff("peer port")
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._names: dict[str, int] = {}  # gRPC's peer string of a relayed connection -> its id
        self._hosts: dict[int, str] = {}
        self._scopes: dict[int, trio.CancelScope] = {}  # trio's thread only
        self._next = 0

    # ------------------------------------------------------------------ gRPC's threads

    def source_of(self, grpc_peer: str) -> str | None:
        """The remote address of the connection gRPC names ``grpc_peer`` (None: not one of ours, or gone)."""
        with self._lock:
            cid = self._names.get(grpc_peer)
            return self._hosts.get(cid) if cid is not None else None

    def enter(self, grpc_peer: str) -> None:
        """A call or stream began on that connection (its deadlines wait until it ends)."""
        with self._lock:
            cid = self._names.get(grpc_peer)
            if cid is not None:
                self.table.enter(cid, time.monotonic())

    def leave(self, grpc_peer: str, proven: bool) -> None:
        """A call or stream ended; ``proven``: it was answered, or its handshake completed."""
        with self._lock:
            cid = self._names.get(grpc_peer)
            if cid is not None:
                self.table.leave(cid, time.monotonic(), proven)

    def prove(self, grpc_peer: str) -> None:
        with self._lock:
            cid = self._names.get(grpc_peer)
            if cid is not None:
                self.table.prove(cid)

    def counters(self) -> dict[str, Any]:
        """Connections held, the limits, and what was refused or closed by reason."""
        with self._lock:
            return {
                **self.table.snapshot(),
                "max_connections": self.limits.max_connections,
                "max_per_source": self.limits.max_per_source,
                **dict(self.table.counts),
                **{f"accept_{k}": v for k, v in self.backoff.counts.items()},
                **dict(self.failures),
            }

    # ------------------------------------------------------------------ trio

    async def serve(self, listener: socket.socket, *, task_status: trio.TaskStatus[None]) -> None:
        """Accept on ``listener`` (non-blocking) until cancelled; it is closed on exit.

        Accepts run in batches of plain ``accept`` calls between waits for the socket to be readable: a refused
        connection costs an accept, a table lookup and a close (a reset), none of trio's per-call scheduling."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sweep)
                task_status.started()
                while True:
                    await trio.lowlevel.wait_readable(listener)
                    for _ in range(_ACCEPT_BATCH):
                        try:
                            sock, address = listener.accept()
                        except BlockingIOError:
                            break
                        except OSError as exc:
                            if exc.errno in _TRANSIENT_ACCEPT_ERRNOS:
                                continue
                            await self.backoff.wait(exc)  # out of descriptors: wait; anything else is raised
                            break
                        self.backoff.ok()
                        self._admit(sock, address, nursery)
                    await trio.lowlevel.checkpoint()
        finally:
            listener.close()

    def _admit(self, sock: socket.socket, address: Any, nursery: trio.Nursery) -> None:
        host = str(address[0]) if isinstance(address, tuple) else "unknown"
        with self._lock:
            cid = self._next
            self._next += 1
            answer = self.table.admit(cid, host, time.monotonic())
            if answer.refused is None:
                self._hosts[cid] = host
        if answer.refused is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)  # close with a reset: no FIN states
            sock.close()
            return
        if answer.evict is not None:
            evicted = self._scopes.get(answer.evict)
            if evicted is not None:
                evicted.cancel()
        scope = trio.CancelScope()
        self._scopes[cid] = scope
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        nursery.start_soon(self._relay, cid, stream, scope)

    async def _sweep(self) -> None:
        while True:
            await trio.sleep(_SWEEP_S)
            with self._lock:
                expired = self.table.expired(time.monotonic())
            for cid in expired:
                scope = self._scopes.get(cid)
                if scope is not None:
                    scope.cancel()

    async def _relay(self, cid: int, client: trio.SocketStream, scope: trio.CancelScope) -> None:
        upstream_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = self.directory / f"c{cid}"
        try:
            with scope:
                await upstream_sock.bind(str(name))
                await upstream_sock.connect(str(self.upstream))
                with self._lock:
                    self._names[f"unix:{name}"] = cid
                os.unlink(name)  # gRPC still reports it as our address; nothing needs the file
                upstream = trio.SocketStream(upstream_sock)
                async with trio.open_nursery() as pumps:
                    pumps.start_soon(self._pump, cid, client, upstream, True, pumps.cancel_scope)
                    pumps.start_soon(self._pump, cid, upstream, client, False, pumps.cancel_scope)
        except OSError:
            self.failures["relay_failed"] += 1
        finally:
            with self._lock:
                self.table.release(cid)
                self._names.pop(f"unix:{name}", None)
                self._hosts.pop(cid, None)
            self._scopes.pop(cid, None)
            upstream_sock.close()
            client.socket.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    async def _pump(
        self, cid: int, source: trio.SocketStream, sink: trio.SocketStream, inbound: bool, both: trio.CancelScope
    ) -> None:
        """Copy ``source`` to ``sink`` until its end (passed on as a half-close); a broken side ends both.
        ``inbound``: ``source`` is the client."""
        try:
            while True:
                data = await source.receive_some(_CHUNK)
                if not data:
                    if not inbound:  # gRPC closed the connection: nothing more to say either way
                        both.cancel()
                        return
                    await sink.send_eof()  # the client is done sending; gRPC may still answer
                    return
                with self._lock:
                    self.table.touch(cid, time.monotonic(), inbound)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            both.cancel()


__all__ = ["Gate", "open_gate_dir", "open_listener", "remove_gate_dir"]
