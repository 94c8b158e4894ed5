"""A bounded frame queue from trio producers to one consumer that is either a plain thread or a trio task.

This module owns the hand-off of outgoing wire messages. The grpc side consumes from a thread (a request or
response generator that grpc iterates in its own thread); the in-memory twin consumes from trio. Producers
never block the trio thread: they ``await wait_space()`` (cancel-safe, no side effect) and then ``put_nowait``
in the same scheduling step, so a frame is either queued or not, never half-sent. That is what lets
:class:`~arceusd.transport.stream.Stream` seal a frame (which consumes a sequence number) only once it can be
queued.

The same queue carries incoming messages the other way round: a reader thread ``put_blocking``s what grpc
delivered and a trio task ``get``s it; trio is woken only when it is actually waiting, so a burst of small
messages costs one thread-to-trio hop, not one per message.

Closing: ``close()`` lets the consumer drain what is queued and then see :data:`END`; ``abort(details)`` drops
everything and makes the consumer see an :class:`Aborted` marker. Both wake every waiter, from any thread.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Final

import trio


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()


@dataclass(frozen=True)
class Aborted:
    """The queue was aborted; ``details`` says why (sent to the peer as the gRPC status details)."""

    details: str
    code: str = "aborted"


#: One queued item: a wire message, or a frame cut into consecutive messages (sent one after another, never
#: batched with others; it counts as one item against the capacity).
Item = bytes | tuple[bytes, ...]


class FrameQueue:
    """Bounded FIFO of :data:`Item`; producers are trio tasks, the single consumer a thread or a trio task."""

    def __init__(self, capacity: int, token: trio.lowlevel.TrioToken) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._token = token
        self._cond = threading.Condition(threading.Lock())
        self._items: deque[Item] = deque()
        self._closed = False
        self._aborted: Aborted | None = None
        self._space_waiters: list[trio.Event] = []
        self._item_waiters: list[trio.Event] = []

    # ------------------------------------------------------------------ producer side (trio)

    async def wait_space(self) -> None:
        """Return once ``put_nowait`` will succeed. Raises trio.ClosedResourceError after close/abort."""
        while True:
            with self._cond:
                if self._closed or self._aborted is not None:
                    raise trio.ClosedResourceError("the stream is closed for sending")
                if len(self._items) < self._capacity:
                    return
                event = trio.Event()
                self._space_waiters.append(event)
            await event.wait()

    def put_nowait(self, item: Item) -> None:
        """Queue ``item``; call only right after ``wait_space`` returned (no await in between)."""
        with self._cond:
            if self._closed or self._aborted is not None:
                raise trio.ClosedResourceError("the stream is closed for sending")
            if len(self._items) >= self._capacity:
                raise trio.WouldBlock
            self._items.append(item)
            self._cond.notify()
            waiters, self._item_waiters = self._item_waiters, []
        self._wake(waiters)

    def close(self) -> None:
        """No more items: the consumer drains the queue, then gets END."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            waiters = self._space_waiters + self._item_waiters
            self._space_waiters, self._item_waiters = [], []
        self._wake(waiters)

    def abort(self, details: str, code: str = "aborted") -> None:
        """Drop everything queued; the consumer gets Aborted(details, code) (first abort wins)."""
        with self._cond:
            if self._aborted is None:
                self._aborted = Aborted(details, code)
            self._items.clear()
            self._cond.notify_all()
            waiters = self._space_waiters + self._item_waiters
            self._space_waiters, self._item_waiters = [], []
        self._wake(waiters)

    def put_blocking(self, item: bytes) -> bool:
        """From a thread producer: wait for space and queue ``item``; False (dropped) after close/abort."""
        with self._cond:
            while len(self._items) >= self._capacity and not self._closed and self._aborted is None:
                self._cond.wait()
            if self._closed or self._aborted is not None:
                return False
            self._items.append(item)
            self._cond.notify()
            waiters, self._item_waiters = self._item_waiters, []
        self._wake(waiters)
        return True

    # ------------------------------------------------------------------ consumer side

    def get_batch_blocking(self, small: int, max_bytes: int) -> list[bytes] | tuple[bytes, ...] | _End | Aborted:
        """From a thread: the next item, plus any further queued items while all are under ``small`` bytes
        and the total stays under ``max_bytes`` (so bursts of small frames travel as one message). A split
        frame (a tuple) comes alone, as it is."""
        with self._cond:
            self._cond.wait_for(self._ready)
            first = self._take()
            if isinstance(first, tuple):
                batch: list[bytes] | tuple[bytes, ...] = first
            elif not isinstance(first, bytes):
                return first
            else:
                batch, total = [first], len(first)
                while total < small and self._items:
                    item = self._items[0]
                    if not isinstance(item, bytes) or len(item) >= small or total + len(item) > max_bytes:
                        break
                    self._items.popleft()
                    batch.append(item)
                    total += len(item)
            self._cond.notify_all()
            waiters, self._space_waiters = self._space_waiters, []
        self._wake(waiters)
        return batch

    async def get(self) -> Item | _End | Aborted:
        """From trio: the next item, END or Aborted."""
        while True:
            with self._cond:
                if self._ready():
                    result = self._take()
                    self._cond.notify_all()
                    waiters, self._space_waiters = self._space_waiters, []
                    break
                event = trio.Event()
                self._item_waiters.append(event)
            await event.wait()
        self._wake(waiters)
        return result

    def _ready(self) -> bool:
        return bool(self._items) or self._closed or self._aborted is not None

    def _take(self) -> Item | _End | Aborted:
        if self._aborted is not None:
            return self._aborted
        if self._items:
            return self._items.popleft()
        return END

    def _wake(self, events: list[trio.Event]) -> None:
        if not events:
            return
        if trio.lowlevel.in_trio_run():
            for event in events:
                event.set()
            return
        for event in events:
            try:
                self._token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                return
