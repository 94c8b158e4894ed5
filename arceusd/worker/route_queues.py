"""``RouteQueues``: the hand-off of frames between a stage worker's compute thread and its trio streams.

Owns: per-route ordered queues in both directions and the first link failure of a job's step. A *route* is
``(kind, peer id)``: one authenticated stream per outgoing route, one inbox per incoming route (see
``wire_links.py``).

Why: the compute thread (torch, in ``trio.to_thread.run_sync``) used to block in ``trio.from_thread.run``
for every send (until the frame was sealed and queued) and every receive (a round trip through the event
loop even when the frame had arrived long before). Here neither waits on the event loop:

- ``post(route, header, body)`` appends the frame to the route's outbox and wakes that route's sender task
  with ``TrioToken.run_sync_soon`` (no waiting); the task sends the route's frames one by one, in order. Back-
  pressure: at most ``capacity`` frames per route are queued or being sent; ``post`` waits for room (bounded
  memory). ``body`` may be a view of a tensor's memory: the caller must not modify the tensor afterwards
  (the stream copies it into the wire message when it seals the frame).
- ``take(route)`` pops the route's next received frame, waiting on a condition variable the trio side
  notifies; a frame that arrived while the compute thread was busy costs no thread switch at all.
- ``flush()`` waits until every posted frame has been handed to its stream.

Error handling: a failed send (stream broken, peer gone) records a ``LinkError`` naming the kind and the
peer; ``post``, ``take`` and ``flush`` raise it on the compute thread at its next call, so no failure is
swallowed: the engine's last link call of a step (``allreduce_scalars``) flushes. A route whose peer ended its
stream raises ``LinkError`` from ``take`` once its inbox is empty; waiting longer than ``timeout_s`` (for a
frame or for room) raises ``LinkError``; after ``close`` every call raises ``LinkError``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from typing import Protocol

import trio

from arceusd.worker.links import LinkError

Route = tuple[str, str]  # (kind, peer id)
Received = tuple[bytes, memoryview]
Outgoing = tuple[bytes, bytes | memoryview]

DEFAULT_SEND_CAPACITY = 8


class FrameSink(Protocol):
    """What a sender task writes to (``arceusd.transport.Stream``)."""

    async def send(self, header: bytes, payload: bytes | bytearray | memoryview = b"") -> None: ...


class FrameSource(Protocol):
    """What a stream handler reads from (``arceusd.transport.Stream``)."""

    async def receive(self) -> tuple[bytes, memoryview]: ...


class RouteQueues:
    """Ordered, bounded, asynchronous outboxes and thread-readable inboxes (see the module docstring).

    Trio side: :meth:`deliver` / :meth:`end_incoming` from the stream handlers, :meth:`run_sender` as one
    task per outgoing route, :meth:`drain_senders` then :meth:`close` at the end. Compute thread:
    :meth:`post`, :meth:`take`, :meth:`flush`, :meth:`check`.
    """

    def __init__(
        self,
        incoming: Iterable[Route],
        outgoing: Iterable[Route],
        *,
        timeout_s: float,
        capacity: int = DEFAULT_SEND_CAPACITY,
        token: trio.lowlevel.TrioToken | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 frame per route, got {capacity}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._token = token
        self._cond = threading.Condition(threading.Lock())
        self._inbox: dict[Route, deque[Received]] = {r: deque() for r in incoming}
        self._ended: dict[Route, str] = {}
        self._outbox: dict[Route, deque[Outgoing]] = {r: deque() for r in outgoing}
        self._wakeup: dict[Route, trio.Event] = {}
        self._sender_done: dict[Route, trio.Event] = {}
        self._draining = False
        self._failure: LinkError | None = None
        self._closed: str | None = None

    # -- shared -------------------------------------------------------------------------------------------

    @property
    def failure(self) -> LinkError | None:
        return self._failure

    def fail(self, error: LinkError) -> None:
        """Record ``error`` (the first one wins) and wake every waiting call, which raises it."""
        with self._cond:
            if self._failure is None:
                self._failure = error
            self._cond.notify_all()

    def close(self, reason: str) -> None:
        """No more link calls: waiting and later calls raise ``LinkError(reason)``; senders stop."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._cond.notify_all()
        self._draining = True
        if trio.lowlevel.in_trio_run():
            for event in self._wakeup.values():
                event.set()

    def _raise_if_broken(self) -> None:  # call with the lock held
        if self._failure is not None:
            raise self._failure
        if self._closed is not None:
            raise LinkError(f"the links are closed: {self._closed}")

    def _wait(self, what: str, deadline: float) -> None:  # with the lock held; the caller re-checks
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LinkError(f"waited {self.timeout_s}s for {what}")
        self._cond.wait(remaining)

    # -- incoming (trio side fills, compute thread drains) -------------------------------------------------

    def has_inbox(self, route: Route) -> bool:
        return route in self._inbox

    def deliver(self, route: Route, frame: Received) -> None:
        """A frame arrived on ``route`` (never blocks)."""
        with self._cond:
            self._inbox[route].append(frame)
            self._cond.notify_all()

    def end_incoming(self, route: Route, why: str) -> None:
        """The peer's stream for ``route`` ended (``why`` says how); frames already delivered stay readable."""
        with self._cond:
            self._ended.setdefault(route, why)
            self._cond.notify_all()

    async def fill(self, route: Route, stream: FrameSource, refused: Counter[str]) -> None:
        """Deliver ``stream``'s frames to ``route``'s inbox until it ends (trio side, a stream handler); a broken
        stream is counted in ``refused`` by its error's type and reported by the waiting receive."""
        why = "closed"
        try:
            while True:
                try:
                    frame = await stream.receive()
                except trio.EndOfChannel:
                    return
                self.deliver(route, frame)
        except Exception as exc:  # a broken peer: the waiting receive reports it
            refused[type(exc).__name__] += 1
            why = f"broke ({type(exc).__name__}: {exc})"
        finally:
            self.end_incoming(route, why)

    def take(self, route: Route) -> Received:
        """The next frame of ``route`` (compute thread; see the module docstring for the errors)."""
        kind, peer = route
        inbox = self._inbox.get(route)
        if inbox is None:
            raise LinkError(f"no {kind} route from peer {peer}: the plan does not route it (a bug)")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                self._raise_if_broken()
                if inbox:
                    return inbox.popleft()
                if route in self._ended:
                    raise LinkError(f"peer {peer} {self._ended[route]} its {kind} stream (it stopped or failed)")
                self._wait(f"a {kind} message from peer {peer}", deadline)

    # -- outgoing (compute thread fills, one trio task per route drains) -----------------------------------

    def check(self) -> None:
        """Raise the recorded failure (or closure), if any."""
        with self._cond:
            self._raise_if_broken()

    def post(self, route: Route, header: bytes, body: bytes | memoryview) -> None:
        """Queue one frame on ``route`` and return without waiting for the send (compute thread)."""
        kind, peer = route
        outbox = self._outbox.get(route)
        if outbox is None:
            raise LinkError(f"no {kind} stream to peer {peer}: the plan does not route it (a bug)")
        token = self._token
        if token is None:
            raise LinkError("the links are not connected yet (no sender tasks)")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                self._raise_if_broken()
                if len(outbox) < self.capacity:
                    outbox.append((header, body))
                    break
                self._wait(f"room to send a {kind} message to peer {peer}", deadline)
        try:
            token.run_sync_soon(self._wake, route)
        except trio.RunFinishedError:
            raise LinkError("the worker's event loop has stopped; cannot send") from None

    def flush(self) -> None:
        """Wait until every posted frame was handed to its stream; raise the first failure (compute thread)."""
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while True:
                self._raise_if_broken()
                if not any(self._outbox.values()):
                    return
                self._wait("the queued messages to leave", deadline)

    def _wake(self, route: Route) -> None:  # trio thread
        event = self._wakeup.get(route)
        if event is not None:
            event.set()

    async def run_sender(self, route: Route, stream: FrameSink) -> None:
        """Send ``route``'s frames in order until :meth:`drain_senders` / :meth:`close` (trio task).

        A failed send is recorded with :meth:`fail` (naming the kind and the peer) and ends the task."""
        kind, peer = route
        outbox = self._outbox[route]
        done = self._sender_done.setdefault(route, trio.Event())
        try:
            while True:
                self._wakeup[route] = wakeup = trio.Event()
                with self._cond:
                    frame = outbox[0] if outbox else None
                    stop = self._failure is not None or self._closed is not None
                if stop:
                    return
                if frame is None:
                    if self._draining:
                        return
                    await wakeup.wait()
                    continue
                try:
                    await stream.send(*frame)
                except Exception as exc:  # recorded, raised on the compute thread at its next link call
                    self.fail(LinkError(f"sending {kind} to peer {peer} failed: {_describe(exc)}"))
                    return
                with self._cond:
                    outbox.popleft()
                    self._cond.notify_all()
        finally:
            done.set()

    def bind(self, token: trio.lowlevel.TrioToken) -> None:
        """Use ``token``'s event loop for the sender wake-ups (call before :meth:`post`)."""
        self._token = token

    async def drain_senders(self, timeout_s: float) -> bool:
        """Let the sender tasks send what is queued, then end; False if they did not finish in time."""
        self._draining = True
        for event in self._wakeup.values():
            event.set()
        with trio.move_on_after(timeout_s):
            for done in list(self._sender_done.values()):
                await done.wait()
            return True
        return False


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
