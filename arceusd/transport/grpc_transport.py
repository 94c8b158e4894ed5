"""The gRPC transport: a sync grpcio server and channels bridged to trio. The only module that imports grpc.

Design (measured: sync grpcio in threads bridged to trio moves 1.5-1.8 GB/s of 4 MiB messages on loopback):

* One ``grpc.server`` per transport with a ``ThreadPoolExecutor`` of ``max_streams + max_calls + 4``
  threads and ``maximum_concurrent_rpcs`` equal to it (a stream holds a server thread for its lifetime, so an
  RPC beyond that is refused with RESOURCE_EXHAUSTED instead of queueing forever). Inside that, streams and
  unary calls have their own slots, bounded per source and rate-limited (:mod:`arceusd.transport.admission`):
  a stream over its share is refused before it holds a thread, so streams can never starve calls, and a
  stream whose handshake does not progress is cut after ``accept_timeout`` (2 s).
* Message size: every wire message, both ends, is capped at ``TransportConfig.max_message``, the size of one
  signed control message (4 MiB + 64 KiB). gRPC refuses a larger unary call before buffering it (measured: 40
  concurrent 60 MB calls held the server at +19 MB instead of +820 MB), so a stranger cannot make us buffer
  a stream frame's worth per call. A stream frame larger than that leaves in several messages and is
  reassembled by :class:`~arceusd.transport.stream.Stream` against the stream's own frame limits.
* Generic bytes handlers (``grpc.method_handlers_generic_handler``, serializers ``None``): no protoc step.
  Service ``arceus.v1.Peer``: unary ``Call`` (control messages; their authenticity is the signed envelope's
  job) and bidirectional ``Stream`` (tensors; authenticated here by :mod:`protocol.stream_auth`).
* Bridging: outgoing messages go through a :class:`~arceusd.transport.queue.FrameQueue` that grpc's own thread
  iterates (request generator on the client, response generator on the server); incoming messages are pumped
  by one reader thread per stream into a trio memory channel (``send_nowait`` via ``from_thread.run_sync``,
  the blocking ``send`` only when the channel is full: back-pressure reaches the sender through HTTP/2 flow
  control). Server handlers run as trio tasks in the transport's nursery. Unary client calls use
  ``future()`` with a done-callback that wakes trio (no thread per call); a cancelled trio task cancels the
  gRPC call, and a cancelled/expired gRPC call cancels the trio handler's scope.
* Options on both ends: message limits at ``max_message``, ``grpc.so_reuseport`` off (two
  daemons must not share a port silently), proxies off (loopback and LAN peers only).

Addresses are ``"host:port"`` strings. One channel (one HTTP/2 connection) per address is cached and shared by
its calls and streams. A call that fails ``unavailable`` (the connection failed or broke) retires the address's
channel: the next call dials afresh, and the old channel is closed once its last call or stream ended. Channels
keep their own subchannels (``grpc.use_local_subchannel_pool``), so a fresh channel really dials instead of
inheriting the old one's reconnect backoff (see :data:`RECONNECT_BACKOFF_MS`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import trio

from arceusd.transport.admission import Admission, host_of
from arceusd.transport.gate import Gate, open_gate_dir, open_listener, remove_gate_dir
from arceusd.transport.gate_core import GateLimits
from arceusd.transport.queue import Aborted, FrameQueue
from arceusd.transport.stream import (
    Stream,
    TransportConfig,
    TransportError,
    client_handshake,
    server_handshake,
)
from protocol import stream_auth as sa
from protocol.errors import RemoteProtocolError

SERVICE = "arceus.v1.Peer"
CALL_METHOD = f"/{SERVICE}/Call"
STREAM_METHOD = f"/{SERVICE}/Stream"

UnaryHandler = Callable[[bytes], Awaitable[bytes]]
StreamHandler = Callable[[Stream], Awaitable[None]]

# Frames under this size that are queued together leave as one gRPC message (frames are self-delimiting):
# each gRPC message costs a write completion, which capped one-way small frames at ~3,500/s without batching.
_SMALL_FRAME = 16 * 1024
_MAX_BATCH = 256 * 1024


RECONNECT_BACKOFF_MS = (100, 1000)
"""A channel's reconnect backoff after a failed connection attempt (first and longest wait, ms). gRPC's defaults
(1 s growing to 120 s) suit clients of a server that is down; peers restart and start at the same time, and
during the backoff every call on the channel fails at once: a daemon that dialled a peer a moment before that
peer listened could not reach it for a second (its probes failed, so it suspected the peer, and its leave on
``SIGTERM`` never went out). With 100 ms the channel retries before the next probe; with at most 1 s, a peer
that is back is reached within a second.

Even 100 ms is too long for a peer's first contact: peers that start together dial each other's seeds before
they listen, and gRPC shares one subchannel (and its backoff) among all channels to an address. Measured with
five ``local`` daemons: a peer learned of 0.2 s after the last refused dial still failed its gossip and its first
probe at once (``unavailable``, "Connection refused", while it listened), and was suspected. So a call that fails
``unavailable`` retires its channel (the next call dials a fresh one, with its own subchannel); the backoff
only paces gRPC's own background reconnects of a channel nobody calls through."""


def _options(config: TransportConfig) -> list[tuple[str, Any]]:
    first_ms, longest_ms = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_receive_message_length", config.max_message),
        ("grpc.max_send_message_length", config.max_message),
        ("grpc.so_reuseport", 0),
        ("grpc.enable_http_proxy", 0),
        ("grpc.initial_reconnect_backoff_ms", first_ms),
        ("grpc.min_reconnect_backoff_ms", first_ms),
        ("grpc.max_reconnect_backoff_ms", longest_ms),
        ("grpc.use_local_subchannel_pool", 1),
    ]


def _rpc_error(exc: grpc.RpcError) -> TransportError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name.lower() if code is not None else "unknown"
    return TransportError(name, details or name)


def _pump(messages: Iterator[bytes], inbox: FrameQueue, token: trio.lowlevel.TrioToken, done: trio.Event) -> None:
    """Reader thread: queue each received message for trio; once trio stops listening, drain and discard."""
    try:
        for message in messages:
            inbox.put_blocking(message)
        inbox.close()
    except grpc.RpcError as exc:
        error = _rpc_error(exc)
        inbox.abort(error.details, error.code)
    except Exception as exc:  # grpc raises plain exceptions for some local failures; report, never lose them
        inbox.abort(f"reading the stream failed: {exc!r}", "internal")
    finally:
        with suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)


class _GrpcConduit:
    """A gRPC bidirectional call (either end) seen as a Conduit."""

    def __init__(
        self,
        outbox: FrameQueue,
        inbox: FrameQueue,
        flushed: trio.Event,
        cancel: Callable[[], None],
        max_message: int,
    ) -> None:
        self.max_message: int | None = max_message
        self._outbox = outbox
        self._inbox = inbox
        self._flushed = flushed  # client: the call ended (reader done); server: our response generator ended
        self._cancel = cancel

    async def wait_space(self) -> None:
        await self._outbox.wait_space()

    def put_nowait(self, message: bytes | tuple[bytes, ...]) -> None:
        self._outbox.put_nowait(message)

    async def receive(self) -> bytes:
        item = await self._inbox.get()
        if isinstance(item, bytes):
            return item
        if isinstance(item, Aborted):
            raise TransportError(item.code, item.details)
        raise trio.EndOfChannel

    def finish_sending(self) -> None:
        self._outbox.close()

    async def wait_flushed(self) -> None:
        self._inbox.abort("the receiver closed the stream", "closed")  # the reader now discards the rest
        await self._flushed.wait()

    def abort(self, details: str) -> None:
        self._outbox.abort(details)
        self._inbox.abort(details, "closed")
        self._cancel()


def _outgoing(outbox: FrameQueue, context: grpc.ServicerContext | None, limit: int) -> Iterator[bytes]:
    """The generator grpc iterates in its own thread to send our messages (small frames batched, a frame
    over ``limit`` bytes split into messages of at most ``limit``)."""
    while True:
        batch = outbox.get_batch_blocking(_SMALL_FRAME, _MAX_BATCH)
        if isinstance(batch, tuple):  # a frame the stream already cut into messages of at most ``limit``
            yield from batch
        elif isinstance(batch, list):
            message = batch[0] if len(batch) == 1 else b"".join(batch)
            if len(message) <= limit:
                yield message
            else:
                view = memoryview(message)
                for start in range(0, len(message), limit):
                    yield bytes(view[start : start + limit])
        elif isinstance(batch, Aborted):
            if context is not None:
                context.abort(grpc.StatusCode.ABORTED, batch.details)
            return
        else:
            return


class _Channel:
    """A cached channel to one address and the calls and streams in flight on it (trio's thread only)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.in_flight = 0
        self.retired = False


class _StreamSlot:
    """One server stream's admission state (shared by grpc's thread and the trio task; under the lock)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.peer_id = ""
        self.pending = True
        self.released = False


class GrpcTransport:
    """A running transport (see :func:`open_transport`). ``rejected`` counts refused peers/frames by
    reason."""

    def __init__(
        self,
        identity: sa.Signer,
        config: TransportConfig,
        nursery: trio.Nursery,
        unary_handler: UnaryHandler,
        stream_handler: StreamHandler,
    ) -> None:
        self.identity = identity
        self.config = config
        self.rejected: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.port = 0
        self.host = ""
        self._nursery = nursery
        self._token = trio.lowlevel.current_trio_token()
        self._unary_handler = unary_handler
        self._stream_handler = stream_handler
        self._channels: dict[str, _Channel] = {}
        self._retired: set[_Channel] = set()
        self._live_scopes: set[trio.CancelScope] = set()
        self._closing = False
        self._lock = threading.Lock()  # guards admission and the counters, touched from grpc's threads
        self.admission = Admission(config.admission)
        self.gate: Gate | None = None  # the peer port's front, when open_transport was given limits for one

    def counters(self) -> dict[str, Any]:
        """Refused peers and frames by reason, our failed outgoing calls by code, and the slots in use."""
        gate = {"gate": self.gate.counters()} if self.gate is not None else {}
        with self._lock:
            return {
                "rejected": dict(self.rejected),
                "failures": dict(self.failures),
                **self.admission.snapshot(),
                **gate,
            }

    def _source(self, grpc_peer: str) -> str:
        """The remote address of a server call: through the gate, the relayed connection's source."""
        if self.gate is None:
            return host_of(grpc_peer)
        return self.gate.source_of(grpc_peer) or "gone"

    def _refuse(self, context: grpc.ServicerContext, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{reason}: too many calls or streams from you now")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ client side

    def _acquire(self, address: str) -> _Channel:
        """The address's channel (dialled on first use), counted in flight until :meth:`_release`."""
        if self._closing:
            raise TransportError("closed", "the transport is shutting down")
        entry = self._channels.get(address)
        if entry is None:
            entry = _Channel(grpc.insecure_channel(address, options=_options(self.config)))
            self._channels[address] = entry
        entry.in_flight += 1
        return entry

    def _release(self, address: str, entry: _Channel, error: TransportError | None) -> None:
        """One call or stream on ``entry`` ended (``error``: how it failed). A failed connection (``unavailable``)
        retires the channel, so the next call dials afresh; a retired channel closes after its last call."""
        entry.in_flight -= 1
        if error is not None and error.code == "unavailable" and not entry.retired:
            entry.retired = True
            if self._channels.get(address) is entry:
                del self._channels[address]
            self._retired.add(entry)
        if entry.retired and entry.in_flight <= 0:
            self._retired.discard(entry)
            entry.channel.close()

    async def call(self, address: str, payload: bytes, timeout: float) -> bytes:
        """Unary round trip to ``address`` (``host:port``). Raises TransportError on any failure.

        Cancelling the calling task cancels the gRPC call.
        """
        entry = self._acquire(address)
        error: TransportError | None = None
        try:
            stub = entry.channel.unary_unary(CALL_METHOD, request_serializer=None, response_deserializer=None)
            future = stub.future(payload, timeout=timeout)
            done = trio.Event()
            token = self._token

            def wake(_: object) -> None:
                with suppress(trio.RunFinishedError):
                    token.run_sync_soon(done.set)

            future.add_done_callback(wake)
            try:
                await done.wait()
            except BaseException:
                future.cancel()
                raise
            try:
                response: bytes = future.result()
            except grpc.RpcError as exc:
                error = _rpc_error(exc)
                self.failures[error.code] += 1
                raise error from None
            except grpc.FutureCancelledError:
                raise TransportError("cancelled", "the call was cancelled") from None
            return response
        finally:
            self._release(address, entry, error)

    async def connect_stream(self, address: str, purpose: bytes, expect_peer_id: str | None = None) -> Stream:
        """Open an authenticated stream to ``address``; the caller must ``aclose()`` it (or use open_stream).

        ``expect_peer_id``: refuse (RemoteProtocolError "unexpected_peer") anyone else answering there.
        """
        entry = self._acquire(address)
        try:
            stub = entry.channel.stream_stream(STREAM_METHOD, request_serializer=None, response_deserializer=None)
            outbox = FrameQueue(self.config.queue_frames, self._token)
            inbox = FrameQueue(self.config.queue_frames, self._token)
            reader_done = trio.Event()
            call = stub(_outgoing(outbox, None, self.config.max_message))
        except BaseException:
            self._release(address, entry, None)
            raise
        conduit = _GrpcConduit(outbox, inbox, reader_done, call.cancel, self.config.max_message)
        token = self._token

        def read() -> None:
            _pump(call, inbox, token, reader_done)
            # The server ended the call (its response stream is over): nothing we queue can leave any more, so
            # a sender waiting for space fails now instead of waiting forever on a call that is gone.
            outbox.abort("the peer ended the stream")
            code = call.code() if call.done() else None  # done: code() does not block
            error = TransportError("unavailable", "") if code is grpc.StatusCode.UNAVAILABLE else None
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(self._release, address, entry, error)

        threading.Thread(target=read, name="arceus-stream-reader", daemon=True).start()
        try:
            return await client_handshake(
                conduit,
                self.identity,
                purpose=purpose,
                expect_peer_id=expect_peer_id,
                config=self.config,
                rejected=self.rejected,
            )
        except TransportError as exc:
            self.failures[exc.code] += 1
            raise

    @asynccontextmanager
    async def open_stream(
        self, address: str, purpose: bytes, expect_peer_id: str | None = None
    ) -> AsyncIterator[Stream]:
        """``async with transport.open_stream(addr, b"purpose") as stream:`` - closes it on exit."""
        stream = await self.connect_stream(address, purpose, expect_peer_id)
        try:
            yield stream
        finally:
            await stream.aclose()

    # ------------------------------------------------------------------ server side (grpc threads)

    def _unary_rpc(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        peer = context.peer()
        host = self._source(peer)
        with self._lock:
            refused = self.admission.admit_call(host, time.monotonic())
        if refused is not None:
            self._refuse(context, refused)
        gate = self.gate
        if gate is not None:
            gate.enter(peer)
        answered = False
        try:
            answer = self._serve_unary_in_thread(request, context)
            answered = True
            return answer
        finally:
            with self._lock:
                self.admission.release_call(host)
            if gate is not None:
                gate.leave(peer, answered)  # an answered call is the connection's hello

    def _serve_unary_in_thread(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        scope = trio.CancelScope()
        token = self._token

        def on_done() -> None:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

        context.add_callback(on_done)
        try:
            result = trio.from_thread.run(self._serve_unary, request, scope, trio_token=token)
        except RemoteProtocolError as exc:
            with self._lock:
                self.rejected[exc.reason] += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.reason}: {exc.message}")
        except (trio.RunFinishedError, trio.Cancelled):
            context.abort(grpc.StatusCode.UNAVAILABLE, "the peer is shutting down")
        if result is None:
            context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
            raise AssertionError("unreachable: context.abort raises")
        return result

    async def _serve_unary(self, request: bytes, scope: trio.CancelScope) -> bytes | None:
        self._live_scopes.add(scope)
        try:
            with scope:
                return await self._unary_handler(request)
            return None
        finally:
            self._live_scopes.discard(scope)

    def _stream_rpc(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        peer = context.peer()
        host = self._source(peer)
        with self._lock:
            refused = self.admission.admit_stream(host, time.monotonic())
        if refused is not None:
            self._refuse(context, refused)
        slot = _StreamSlot(host)
        gate = self.gate
        if gate is not None:
            gate.enter(peer)

        def release() -> None:
            with self._lock:
                if slot.released:
                    return
                slot.released = True
                self.admission.release_stream(host, slot.peer_id, pending=slot.pending)
                proven = bool(slot.peer_id)
            if gate is not None:
                gate.leave(peer, proven)  # a completed handshake is the connection's hello

        context.add_callback(release)
        return self._stream_messages(requests, context, slot)

    def _stream_messages(
        self, requests: Iterator[bytes], context: grpc.ServicerContext, slot: _StreamSlot
    ) -> Iterator[bytes]:
        token = self._token
        outbox = FrameQueue(self.config.queue_frames, token)
        inbox = FrameQueue(self.config.queue_frames, token)
        reader_done = trio.Event()
        generator_done = trio.Event()
        scope = trio.CancelScope()

        def on_done() -> None:
            outbox.abort("the call ended")
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(scope.cancel)

        def cancel() -> None:
            pass  # ending our response generator (outbox aborted) ends the call with an error status

        conduit = _GrpcConduit(outbox, inbox, generator_done, cancel, self.config.max_message)
        context.add_callback(on_done)
        threading.Thread(
            target=_pump, args=(requests, inbox, token, reader_done), name="arceus-stream-reader", daemon=True
        ).start()
        try:
            trio.from_thread.run_sync(
                self._nursery.start_soon, self._serve_stream, conduit, scope, slot, trio_token=token
            )
        except trio.RunFinishedError:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the peer is shutting down")
        try:
            yield from _outgoing(outbox, context, self.config.max_message)
        finally:
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(generator_done.set)

    def _handshake_done(self, slot: _StreamSlot, peer_id: str) -> str | None:
        """Move the stream's slot from 'in its handshake' to the proven peer (refused over its share)."""
        with self._lock:
            if slot.released or not slot.pending:
                return None
            slot.pending = False
            refused = self.admission.handshake_done(slot.host, peer_id)
            if refused is None:
                slot.peer_id = peer_id
            else:
                self.rejected[refused] += 1
            return refused

    async def _serve_stream(self, conduit: _GrpcConduit, scope: trio.CancelScope, slot: _StreamSlot) -> None:
        self._live_scopes.add(scope)
        try:
            with scope:
                try:
                    stream = await server_handshake(conduit, self.identity, config=self.config, rejected=self.rejected)
                except (RemoteProtocolError, TransportError):
                    self._handshake_done(slot, "")
                    return  # counted in rejected (protocol) or the client went away: nothing to serve
                if self._handshake_done(slot, stream.peer_id) is not None:
                    conduit.abort("too many streams from this peer")
                    return
                # A protocol error is counted by the stream and the connection is cut by aclose.
                async with stream:
                    with suppress(RemoteProtocolError, TransportError):
                        await self._stream_handler(stream)
        finally:
            self._live_scopes.discard(scope)

    async def _shutdown(self, server: grpc.Server, executor: ThreadPoolExecutor) -> None:
        self._closing = True
        stopped = server.stop(grace=None)
        for scope in list(self._live_scopes):
            scope.cancel()
        for entry in [*self._channels.values(), *self._retired]:
            entry.channel.close()
        self._channels.clear()
        self._retired.clear()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(stopped.wait, 10.0)
        executor.shutdown(wait=False)


@asynccontextmanager
async def open_transport(
    identity: sa.Signer,
    host: str,
    port: int,
    *,
    unary_handler: UnaryHandler,
    stream_handler: StreamHandler,
    config: TransportConfig | None = None,
    gate: GateLimits | None = None,
) -> AsyncIterator[GrpcTransport]:
    """Serve ``arceus.v1.Peer`` on ``host:port`` (port 0 picks a free one: see ``.port``) and yield the
    transport.

    ``gate``: accept the port's TCP connections in a :class:`~arceusd.transport.gate.Gate` with these limits
    (per source, in total, hello and idle deadlines, waiting out EMFILE) and relay the kept ones to gRPC on a
    private unix socket; without it gRPC listens on the port itself (a stage worker's port).

    ``unary_handler(request) -> response`` answers ``Call``; raising RemoteProtocolError refuses the request
    (counted, INVALID_ARGUMENT to the caller). ``stream_handler(stream)`` runs once per accepted stream,
    after the handshake proved the peer; the stream is closed when it returns. Both run as tasks of this
    transport.

    Error handling: raises OSError when the address cannot be bound. On exit every call and stream is cut.
    """
    config = config or TransportConfig()
    workers = config.admission.max_streams + config.admission.max_calls + 4
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arceus-grpc")
    options = _options(config)
    if gate is not None:
        # gRPC ends a connection with no call for the idle time itself, with a GOAWAY (the client dials afresh
        # for its next call, instead of having a call cut); the gate's own idle deadline is a later backstop.
        options.append(("grpc.max_connection_idle_ms", int(gate.idle_timeout * 1000)))
        gate = replace(gate, idle_timeout=gate.idle_timeout + 10.0)
    server = grpc.server(executor, options=options, maximum_concurrent_rpcs=workers)
    gate_dir = open_gate_dir() if gate is not None else None
    try:
        async with _serving(
            identity, host, port, config, server, executor, unary_handler, stream_handler, gate, gate_dir
        ) as transport:
            yield transport
    finally:
        if gate_dir is not None:
            remove_gate_dir(gate_dir)


@asynccontextmanager
async def _serving(
    identity: sa.Signer,
    host: str,
    port: int,
    config: TransportConfig,
    server: grpc.Server,
    executor: ThreadPoolExecutor,
    unary_handler: UnaryHandler,
    stream_handler: StreamHandler,
    gate: GateLimits | None,
    gate_dir: Path | None,
) -> AsyncIterator[GrpcTransport]:
    async with trio.open_nursery() as nursery:
        transport = GrpcTransport(identity, config, nursery, unary_handler, stream_handler)
        handlers = {
            "Call": grpc.unary_unary_rpc_method_handler(
                transport._unary_rpc, request_deserializer=None, response_serializer=None
            ),
            "Stream": grpc.stream_stream_rpc_method_handler(
                transport._stream_rpc, request_deserializer=None, response_serializer=None
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        listener = None
        if gate is not None and gate_dir is not None:
            transport.gate = Gate(gate, gate_dir)
            try:
                listener = await open_listener(host, port)
            except OSError as exc:
                executor.shutdown(wait=False)
                raise OSError(
                    f"cannot listen on {host}:{port}: {exc.strerror or exc}; is another daemon using the port?"
                ) from None
            address = f"unix:{transport.gate.upstream}"
        else:
            address = f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            bound, error = 0, f": {exc}"
        else:
            error = ""
        if bound == 0:
            executor.shutdown(wait=False)
            if listener is not None:
                listener.close()
            raise OSError(f"cannot listen on {host}:{port}{error}; is another daemon using the port?")
        transport.host = host
        transport.port = listener.getsockname()[1] if listener is not None else bound
        server.start()
        if listener is not None and transport.gate is not None:
            await nursery.start(transport.gate.serve, listener)
        try:
            yield transport
        finally:
            await transport._shutdown(server, executor)
            nursery.cancel_scope.cancel()


__all__ = ["CALL_METHOD", "SERVICE", "STREAM_METHOD", "GrpcTransport", "open_transport"]
