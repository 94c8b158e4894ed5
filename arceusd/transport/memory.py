"""The in-memory twin of the gRPC transport, for tests of the code that calls the transport.

Same interface as :class:`~arceusd.transport.grpc_transport.GrpcTransport` (``port``, ``address``,
``rejected``, ``call``, ``connect_stream``, ``open_stream``) and the same handshake and per-frame
authentication (:class:`~arceusd.transport.stream.Stream` over a pair of
:class:`~arceusd.transport.queue.FrameQueue`), but no sockets or threads: messages move between trio tasks. A
:class:`MemoryNetwork` is the "LAN": transports opened on it reach each other by ``"host:port"``.

Tests may break the wire on purpose: ``MemoryNetwork.tamper`` is applied to every message that crosses it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import trio

from arceusd.transport.grpc_transport import StreamHandler, UnaryHandler
from arceusd.transport.queue import END, Aborted, FrameQueue
from arceusd.transport.stream import (
    Stream,
    TransportConfig,
    TransportError,
    client_handshake,
    server_handshake,
)
from protocol import stream_auth as sa
from protocol.errors import RemoteProtocolError


class _MemoryConduit:
    def __init__(self, outbox: FrameQueue, inbox: FrameQueue, network: MemoryNetwork) -> None:
        self._outbox = outbox
        self._inbox = inbox
        self._network = network
        self._peer_done = trio.Event()

    async def wait_space(self) -> None:
        await self._outbox.wait_space()

    max_message: int | None = None  # whole frames, however large

    def put_nowait(self, message: bytes | tuple[bytes, ...]) -> None:
        whole = message if isinstance(message, bytes) else b"".join(message)
        self._outbox.put_nowait(self._network.tamper(whole))

    async def receive(self) -> bytes:
        item = await self._inbox.get()
        if isinstance(item, bytes):
            return item
        self._peer_done.set()
        if isinstance(item, Aborted):
            raise TransportError("aborted", item.details)
        if item is END:
            raise trio.EndOfChannel
        raise TransportError("internal", f"unexpected queue item {item!r}")

    def finish_sending(self) -> None:
        self._outbox.close()

    async def wait_flushed(self) -> None:
        # We stop listening: what the peer still sends is dropped (as the gRPC reader discards it). What we
        # queued stays in the queue for the peer to read: nothing to wait for.
        self._inbox.abort("the receiver closed the stream")

    def abort(self, details: str) -> None:
        self._outbox.abort(details)
        self._inbox.abort(details)


class MemoryNetwork:
    """A set of in-memory transports that can reach each other by address."""

    def __init__(self) -> None:
        self.transports: dict[str, MemoryTransport] = {}
        self._next_port = 40000
        self.tamper: Callable[[bytes], bytes] = lambda message: message

    @asynccontextmanager
    async def open_transport(
        self,
        identity: sa.Signer,
        host: str,
        port: int,
        *,
        unary_handler: UnaryHandler,
        stream_handler: StreamHandler,
        config: TransportConfig | None = None,
    ) -> AsyncIterator[MemoryTransport]:
        """Like :func:`arceusd.transport.open_transport`, on this network."""
        if port == 0:
            self._next_port += 1
            port = self._next_port
        address = f"{host}:{port}"
        if address in self.transports:
            raise OSError(f"cannot listen on {address}: address already in use")
        async with trio.open_nursery() as nursery:
            transport = MemoryTransport(
                self,
                identity,
                host,
                port,
                config or TransportConfig(),
                nursery,
                unary_handler,
                stream_handler,
            )
            self.transports[address] = transport
            try:
                yield transport
            finally:
                del self.transports[address]
                nursery.cancel_scope.cancel()


class MemoryTransport:
    """The in-memory transport (see :class:`MemoryNetwork`)."""

    def __init__(
        self,
        network: MemoryNetwork,
        identity: sa.Signer,
        host: str,
        port: int,
        config: TransportConfig,
        nursery: trio.Nursery,
        unary_handler: UnaryHandler,
        stream_handler: StreamHandler,
    ) -> None:
        self.network = network
        self.identity = identity
        self.host = host
        self.port = port
        self.config = config
        self.rejected: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._nursery = nursery
        self._unary_handler = unary_handler
        self._stream_handler = stream_handler

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _peer(self, address: str) -> MemoryTransport:
        peer = self.network.transports.get(address)
        if peer is None:
            self.failures["unavailable"] += 1
            raise TransportError("unavailable", f"nothing listens on {address}")
        return peer

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:
        peer = self._peer(address)
        if len(payload) > self.config.max_message:
            raise TransportError("resource_exhausted", "message larger than the configured limit")
        try:
            with trio.fail_after(timeout):
                return await peer._unary_handler(self.network.tamper(payload))
        except trio.TooSlowError:
            self.failures["deadline_exceeded"] += 1
            raise TransportError("deadline_exceeded", f"no answer from {address} in {timeout} s") from None
        except RemoteProtocolError as exc:
            peer.rejected[exc.reason] += 1
            raise TransportError("invalid_argument", f"{exc.reason}: {exc.message}") from None

    async def connect_stream(self, address: str, purpose: bytes, expect_peer_id: str | None = None) -> Stream:
        peer = self._peer(address)
        c2s = FrameQueue(self.config.queue_frames, trio.lowlevel.current_trio_token())
        s2c = FrameQueue(self.config.queue_frames, trio.lowlevel.current_trio_token())
        peer._nursery.start_soon(peer._serve_stream, _MemoryConduit(s2c, c2s, self.network))
        return await client_handshake(
            _MemoryConduit(c2s, s2c, self.network),
            self.identity,
            purpose=purpose,
            expect_peer_id=expect_peer_id,
            config=self.config,
            rejected=self.rejected,
        )

    @asynccontextmanager
    async def open_stream(
        self, address: str, purpose: bytes, expect_peer_id: str | None = None
    ) -> AsyncIterator[Stream]:
        stream = await self.connect_stream(address, purpose, expect_peer_id)
        try:
            yield stream
        finally:
            await stream.aclose()

    async def _serve_stream(self, conduit: _MemoryConduit) -> None:
        try:
            stream = await server_handshake(conduit, self.identity, config=self.config, rejected=self.rejected)
        except (RemoteProtocolError, TransportError):
            return
        async with stream:
            with suppress(RemoteProtocolError, TransportError):
                await self._stream_handler(stream)
