"""The authenticated stream that callers use, and the handshake drivers; independent of grpc.

This module owns :class:`Stream` (send/receive header+payload frames, authenticated per frame by
:mod:`protocol.stream_auth`), the client/server handshake drivers over any :class:`Conduit` (a bidirectional
pipe of whole wire messages: a gRPC bidirectional call, or a pair of in-memory queues for the twin),
:class:`TransportConfig` and :class:`TransportError`.

Error handling:

* the peer sent something bad (bad signature, stale hello, wrong peer, bad MAC, oversize frame, a stream cut
  without its CLOSE frame): :class:`protocol.errors.RemoteProtocolError`; the frame is dropped before use, the
  stream is aborted, and ``reason`` is counted in the transport's ``rejected`` counter;
* the network failed or the peer refused or vanished: :class:`TransportError` (``code`` says which);
* the peer closed its side cleanly: ``receive`` raises :class:`trio.EndOfChannel`;
* our own misuse (frame over our limits, send after close): :class:`protocol.errors.LocalProtocolError` or
  :class:`trio.ClosedResourceError`.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

import trio

from arceusd.transport.admission import AdmissionConfig
from protocol import stream_auth as sa
from protocol.errors import RemoteProtocolError
from protocol.limits import MAX_MESSAGE_SIZE

#: A signed control message's largest wire size: the biggest message plus room for its envelope.
MAX_CONTROL_MESSAGE = MAX_MESSAGE_SIZE + 64 * 1024


class TransportError(Exception):
    """A network-level failure: unreachable, timed out, refused, cancelled, aborted by the peer.

    ``code`` is a short identifier (a lowercase gRPC status name such as ``unavailable``,
    ``deadline_exceeded``,
    ``aborted``, or ``closed``/``refused``/``rejected``); ``details`` is the human part.
    """

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TransportConfig:
    """Limits and sizes of a transport (the same values should be used on every peer)."""

    limits: sa.Limits = field(default_factory=sa.Limits)
    #: Slots and rate limits of the server side (streams apart from unary calls; per source; per peer).
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    #: Frames queued per direction before ``send`` waits (back-pressure).
    queue_frames: int = 4
    #: Seconds the whole handshake may take on the client side.
    handshake_timeout: float = 10.0
    #: Seconds the server waits for each step of a client's handshake (its Hello, then its Finish): a stream
    #: that does not progress is closed, and its slot freed, this soon.
    accept_timeout: float = 2.0
    #: Seconds ``aclose`` waits for the peer to finish after our CLOSE frame before cutting the call.
    close_linger: float = 5.0
    max_skew_ms: int = sa.DEFAULT_MAX_SKEW_MS
    clock_ms: Callable[[], int] = wall_clock_ms
    random_bytes: Callable[[int], bytes] = os.urandom
    #: The largest wire message (a unary call, or one message of a stream), both ends. A unary call carries
    #: one signed control message (at most ``protocol.limits.MAX_MESSAGE_SIZE`` plus its envelope); a stream
    #: frame larger than this travels in several messages and is reassembled (see :class:`Stream`), so a
    #: stream's frame limit never raises what an unauthenticated call may make us buffer.
    max_message: int = MAX_CONTROL_MESSAGE


#: What a conduit queues: one wire message, or one frame already cut into consecutive messages.
Outgoing = bytes | tuple[bytes, ...]


def split_parts(parts: tuple[bytes | memoryview, ...], limit: int) -> tuple[bytes, ...]:
    """Cut the concatenation of ``parts`` into messages of at most ``limit`` bytes, copying each byte once."""
    messages: list[bytes] = []
    pending: list[bytes | memoryview] = []
    room = limit
    for part in parts:
        view = memoryview(part)
        while view.nbytes:
            take = min(room, view.nbytes)
            pending.append(view[:take])
            view, room = view[take:], room - take
            if room == 0:
                messages.append(b"".join(pending))
                pending, room = [], limit
    if pending:
        messages.append(b"".join(pending))
    return tuple(messages)


class Conduit(Protocol):
    """A bidirectional pipe of whole messages (trio side). Implemented for gRPC and in memory.

    ``max_message``: the largest message the pipe carries (None: no limit); a frame over it is queued as a
    tuple of messages that the receiving :class:`Stream` puts back together."""

    max_message: int | None

    async def wait_space(self) -> None:
        """Return once put_nowait will succeed; trio.ClosedResourceError when sending is over."""

    def put_nowait(self, message: Outgoing) -> None: ...

    async def receive(self) -> bytes:
        """The next message; trio.EndOfChannel at a clean end, TransportError when the pipe broke."""

    def finish_sending(self) -> None:
        """Send what is queued, then end our direction."""

    async def wait_flushed(self) -> None:
        """Stop listening (discard what still arrives) and return once what we queued has left (or the pipe
        broke), so that cutting the pipe afterwards loses nothing."""

    def abort(self, details: str) -> None:
        """Cut the pipe now, both directions, dropping what is queued."""


class Stream:
    """One authenticated, ordered stream of (header, payload) frames with a proven peer.

    ``peer_id``/``peer_public_key`` are proven by the handshake; ``purpose`` is what the client asked for.
    """

    def __init__(
        self,
        conduit: Conduit,
        session: sa.Session,
        rejected: Counter[str],
        config: TransportConfig,
        pending: bytes = b"",
    ) -> None:
        self._conduit = conduit
        self._session = session
        self._rejected = rejected
        self._config = config
        self._send_lock = trio.Lock()
        self._receive_lock = trio.Lock()
        self._closed = False
        self._peer_closed = False
        # The message being read (it may hold several batched frames) and where its next frame starts.
        self._pending = memoryview(pending)
        self._offset = 0
        # A frame that spans several wire messages, while it is being put together, and its bytes so far.
        self._assembly: bytearray | None = None
        self._filled = 0
        self.peer_id = session.peer_id
        self.peer_public_key = session.peer_public_key
        self.purpose = session.purpose

    @property
    def frames_sent(self) -> int:
        return self._session.sealer.sequence

    @property
    def frames_received(self) -> int:
        return self._session.opener.sequence

    async def send(self, header: bytes, payload: bytes | bytearray | memoryview = b"") -> None:
        """Queue one frame. Waits while ``queue_frames`` are in flight (back-pressure).

        The payload is copied into the wire message before this returns, so the caller may reuse its buffer.
        Cancel-safe: if cancelled, the frame was not queued and the stream stays usable.
        """
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed with aclose()")
        async with self._send_lock:
            await self._conduit.wait_space()
            sealer, limit = self._session.sealer, self._conduit.max_message
            size = sa.FRAME_PREFIX.size + len(header) + memoryview(payload).nbytes + sa.TAG_BYTES
            if limit is not None and size > limit:
                self._conduit.put_nowait(split_parts(sealer.seal_parts(header, payload), limit))
            else:
                self._conduit.put_nowait(sealer.seal(header, payload))

    async def receive(self) -> tuple[bytes, memoryview]:
        """The next (header, payload) frame; payload is a view into the received message (no copy).

        Raises trio.EndOfChannel once the peer closed its side, RemoteProtocolError (counted, stream aborted)
        for a bad frame, TransportError when the connection failed.
        """
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed with aclose()")
        async with self._receive_lock:
            if self._peer_closed:
                raise trio.EndOfChannel
            try:
                view, start = await self._next_frame()
                frame, end = self._session.opener.open_next(view, start)
            except RemoteProtocolError as exc:
                self._reject(exc)
            if view is self._pending:
                self._offset = end
            if frame.kind == sa.FRAME_CLOSE:
                self._peer_closed = True
                raise trio.EndOfChannel
            return frame.header, frame.payload

    async def _message(self) -> memoryview:
        try:
            return memoryview(await self._conduit.receive())
        except trio.EndOfChannel:
            raise RemoteProtocolError("truncated", "the peer ended the stream without its CLOSE frame") from None

    async def _next_frame(self) -> tuple[memoryview, int]:
        """A buffer and the offset of the next whole frame in it.

        Usually that is the current message (several small frames may share one). A frame larger than one
        wire message arrives in several: its length is read from its prefix and checked against the limits
        (the opener refuses ``frame_too_large`` before anything is allocated), then the pieces are copied
        into one buffer of exactly that size; what follows the frame in the last piece stays pending. The
        partial frame is kept on the stream, so a cancelled ``receive`` loses nothing.
        """
        opener = self._session.opener
        while self._assembly is None:
            if self._offset >= self._pending.nbytes:
                self._pending, self._offset = await self._message(), 0
            have = self._pending.nbytes - self._offset
            need = opener.frame_length(self._pending, self._offset)
            if need is not None and need <= have:
                return self._pending, self._offset
            if need is None:  # fewer bytes than a frame prefix (a peer that splits frames oddly): join
                head = bytes(self._pending[self._offset :]) + bytes(await self._message())
                self._pending, self._offset = memoryview(head), 0
                continue
            self._assembly = bytearray(need)
            self._assembly[:have] = self._pending[self._offset :]
            self._filled = have
            self._pending, self._offset = memoryview(b""), 0
        buffer = self._assembly
        while self._filled < len(buffer):
            message = await self._message()
            take = min(message.nbytes, len(buffer) - self._filled)
            buffer[self._filled : self._filled + take] = message[:take]
            self._filled += take
            self._pending, self._offset = message[take:], 0
        self._assembly = None
        return memoryview(buffer), 0

    def _reject(self, exc: RemoteProtocolError) -> NoReturn:
        self._rejected[exc.reason] += 1
        self._closed = True
        self._conduit.abort(f"{exc.reason}: {exc.message}")
        raise exc

    async def send_eof(self) -> None:
        """Send our CLOSE frame: the peer's ``receive`` raises EndOfChannel; we can still receive."""
        if self._closed:
            raise trio.ClosedResourceError("this stream was closed with aclose()")
        async with self._send_lock:
            if self._session.sealer.closed:
                return
            await self._conduit.wait_space()
            self._conduit.put_nowait(self._session.sealer.seal(b"", b"", kind=sa.FRAME_CLOSE))
            self._conduit.finish_sending()

    async def aclose(self) -> None:
        """Send our CLOSE frame and let queued frames leave (at most ``close_linger`` s, else cut the call).

        Frames the peer sends meanwhile are discarded. Safe to call twice, and when cancelled it still cuts.
        """
        if self._closed:
            return
        self._closed = True
        clean = False
        try:
            with trio.move_on_after(self._config.close_linger):
                if not self._session.sealer.closed:
                    await self._conduit.wait_space()
                    self._conduit.put_nowait(self._session.sealer.seal(b"", b"", kind=sa.FRAME_CLOSE))
                    self._conduit.finish_sending()
                await self._conduit.wait_flushed()
                clean = True
        except trio.ClosedResourceError:
            pass  # the pipe is already broken: nothing to flush
        finally:
            if not clean:
                self._conduit.abort("stream closed before its frames were delivered")

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _send_raw(conduit: Conduit, message: bytes) -> None:
    try:
        await conduit.wait_space()
    except trio.ClosedResourceError:
        raise TransportError("closed", "the connection closed during the handshake") from None
    conduit.put_nowait(message)


async def _receive_raw(conduit: Conduit, stage: str) -> bytes:
    try:
        return await conduit.receive()
    except trio.EndOfChannel:
        raise TransportError("refused", f"the peer ended the stream before sending its {stage}") from None


async def client_handshake(
    conduit: Conduit,
    signer: sa.Signer,
    *,
    purpose: bytes,
    expect_peer_id: str | None,
    config: TransportConfig,
    rejected: Counter[str],
) -> Stream:
    """Run the client side of the handshake over ``conduit`` and return the Stream (aborts it on failure)."""
    try:
        with trio.fail_after(config.handshake_timeout):
            hs = sa.ClientHandshake(
                signer,
                purpose=purpose,
                expect_peer_id=expect_peer_id,
                now_ms=config.clock_ms(),
                random_bytes=config.random_bytes,
                limits=config.limits,
                max_skew_ms=config.max_skew_ms,
            )
            await _send_raw(conduit, hs.hello)
            ack = await _receive_raw(conduit, "handshake Ack")
            try:
                session, finish = hs.receive_ack(ack, now_ms=config.clock_ms())
            except RemoteProtocolError as exc:
                rejected[exc.reason] += 1
                raise
            await _send_raw(conduit, finish)
            return Stream(conduit, session, rejected, config)
    except trio.TooSlowError:
        conduit.abort("handshake timed out")
        raise TransportError("deadline_exceeded", "the stream handshake did not finish in time") from None
    except BaseException as exc:
        conduit.abort(f"handshake failed: {exc}")
        raise


async def server_handshake(
    conduit: Conduit, signer: sa.Signer, *, config: TransportConfig, rejected: Counter[str]
) -> Stream:
    """Run the server side of the handshake; raises (and aborts the conduit) when the client fails it.

    Each step must progress within ``config.accept_timeout`` (the Hello after the call arrived, the Finish
    after our Ack), so a silent stream gives its slot back within seconds.
    """
    try:
        with trio.fail_after(config.accept_timeout):
            hello = await _receive_raw(conduit, "Hello")
        try:
            hs = sa.ServerHandshake(
                signer,
                hello,
                now_ms=config.clock_ms(),
                random_bytes=config.random_bytes,
                limits=config.limits,
                max_skew_ms=config.max_skew_ms,
            )
            with trio.fail_after(config.accept_timeout):
                await _send_raw(conduit, hs.ack)
                # The client may batch its first frames behind the Finish in one message.
                message = await _receive_raw(conduit, "Finish")
            session = hs.receive_finish(message[: sa.FINISH_BYTES])
        except RemoteProtocolError as exc:
            rejected[exc.reason] += 1
            raise
        return Stream(conduit, session, rejected, config, pending=message[sa.FINISH_BYTES :])
    except trio.TooSlowError:
        rejected["handshake_timeout"] += 1
        conduit.abort("handshake timed out")
        raise TransportError("deadline_exceeded", "the client did not finish the handshake in time") from None
    except BaseException as exc:
        reason = exc.reason if isinstance(exc, RemoteProtocolError) else type(exc).__name__
        conduit.abort(f"handshake refused: {reason}")
        raise
