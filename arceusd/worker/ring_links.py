"""The replica ring over the authenticated transport, one generation per shape (``WireRing``).

Owns: this worker's ``ring`` streams (to the same place of the next replica, from the previous one) on queues of
their own, so a ring that breaks does not break the pipeline's links, and their replacement when the leader drops
a replica, and again when the replica is rebuilt. Generation 0 is the plan's ring (stream purpose
``<job>/<term>/ring``); :meth:`WireRing.drop` makes generation g + 1 without the dropped replica (purpose
``ring.<g + 1>``): it closes the old generation's queues and streams (a receive waiting on them ends at once),
opens the stream to the new next peer and hands the new ``RingLink`` to the compute thread through ``change``
(``ring.RingChange``), which redoes the broken sync over it (``replicas.py``). :meth:`WireRing.grow` makes the
next generation with a rebuilt replica's worker in its slot, between two steps; that worker starts its ring at
that generation. Replicas are named by slot (their share of each batch), which a rebuilt one takes over. A stream
for a generation this worker has not made yet waits for it (at most ``timeout_s``); one from a peer the
generation does not name, or a second one, is refused and counted.

Frames: header ``round u64`` (per generation, from 0), payload one ``protocol.tensors`` frame (checked by
``ring.py`` against the chunk expected). ``bytes_sent`` counts what this worker handed to its ring streams.
"""

from __future__ import annotations

import contextlib
import struct
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import trio

from arceusd.transport import Stream, TransportError
from arceusd.worker.links import LinkError
from arceusd.worker.ring import RingChange
from arceusd.worker.route_queues import RouteQueues
from protocol.errors import RemoteProtocolError

_SEQ = struct.Struct(">Q")
RING_KIND = "ring"
MAX_GENERATIONS = 1024
"""Ring shapes one worker may go through (one per dropped replica; a plan has at most 1024 replicas)."""


class StreamOpener(Protocol):
    async def connect_stream(self, address: str, purpose: bytes, expect_peer_id: str | None = None) -> Stream: ...


def ring_kind(generation: int) -> str:
    """The stream kind of a ring generation (``ring`` for the plan's own, for older peers)."""
    return RING_KIND if generation == 0 else f"{RING_KIND}.{generation}"


def generation_of(kind: str) -> int | None:
    """The generation a stream kind names, or None when it is not a ring kind."""
    if kind == RING_KIND:
        return 0
    head, dot, tail = kind.partition(".")
    if head != RING_KIND or not dot or not tail.isdigit() or len(tail) > 4:
        return None
    g = int(tail)
    return g if 0 < g <= MAX_GENERATIONS else None


def drop_from(replicas: tuple[int, ...], count: int, index: int, mine: int) -> tuple[int, ...]:
    """The replicas left (their slots) after dropping the ``index``-th of the ``count`` in the ring now;
    ``ValueError`` when the command does not fit this ring or would drop this worker's own replica."""
    if count != len(replicas):
        raise ValueError(f"drop of replica {index} of {count}, but this ring has {len(replicas)} replicas")
    if not 0 <= index < count or count < 2:
        raise ValueError(f"no replica {index} to drop from a ring of {count}")
    if replicas[index] == mine:
        raise ValueError("a worker cannot drop its own replica (the daemon stops it instead)")
    return replicas[:index] + replicas[index + 1 :]


@dataclass
class Generation:
    """One shape of the ring: its peers (replica order), this worker's rank, its queues and counters."""

    number: int
    peers: tuple[str, ...]
    rank: int
    queues: RouteQueues
    sent: int = 0
    received: int = 0

    @property
    def kind(self) -> str:
        return ring_kind(self.number)

    @property
    def next(self) -> str:
        return self.peers[(self.rank + 1) % len(self.peers)]

    @property
    def prev(self) -> str:
        return self.peers[(self.rank - 1) % len(self.peers)]


class WireRing:
    """This worker's ring (see the module docstring). ``slots``: the peer at this worker's place in every replica
    of the plan, by replica slot; ``me``: this worker's peer id; ``generation``: the ring's first generation
    (more than 0 for a worker that rebuilds a dropped replica)."""

    def __init__(
        self, slots: Mapping[int, str], me: str, timeout_s: float, purpose: Callable[[str], bytes], generation: int = 0
    ) -> None:
        self.by_slot = dict(slots)
        self.me = me
        self.mine = next(slot for slot, peer in self.by_slot.items() if peer == me)
        self.timeout_s = timeout_s
        self.purpose = purpose
        self.replicas: tuple[int, ...] = tuple(sorted(self.by_slot))
        """The slots of the replicas in the ring now."""
        self.change = RingChange()
        self.refused: Counter[str] = Counter()
        self.bytes_sent = 0
        self.frames_sent = 0
        self._generations = {generation: self._generation(generation, self.replicas)}
        self._number = generation
        self._changed = trio.Event()  # set when a new generation is made (a stream waiting for it goes on)
        self._claimed: set[tuple[int, str]] = set()
        self._outgoing: dict[int, Stream] = {}
        self._opener: StreamOpener | None = None
        self._addresses: dict[str, str] = {}
        self._nursery: trio.Nursery | None = None

    def _generation(self, number: int, replicas: tuple[int, ...]) -> Generation:
        peers = tuple(self.by_slot[i] for i in replicas)
        rank, kind, n = peers.index(self.me), ring_kind(number), len(peers)
        ins, outs = ([(kind, peers[(rank - 1) % n])], [(kind, peers[(rank + 1) % n])]) if n > 1 else ([], [])
        return Generation(number, peers, rank, RouteQueues(ins, outs, timeout_s=self.timeout_s))

    @property
    def current(self) -> Generation:
        return self._generations[self._number]

    @property
    def first_replica(self) -> int:
        """The slot of the first replica in the ring (its devices write the checkpoint shards)."""
        return self.replicas[0]

    def link(self) -> WireRingLink:
        """The ``RingLink`` of the current generation."""
        return WireRingLink(self, self.current)

    # -- trio side ------------------------------------------------------------------------------------------

    async def handle_stream(self, kind: str, stream: Stream) -> None:
        """A peer's ring stream (``kind`` is a ring kind): fill that generation's inbox until it ends."""
        number = generation_of(kind)
        if number is None:
            self.refused["unknown_kind"] += 1
            return
        if number > self._number:
            with trio.move_on_after(self.timeout_s):
                while number > self._number:  # a faster peer took the drop (or grow) first: wait for ours
                    await self._changed.wait()
        gen = self._generations.get(number)
        if gen is None:
            self.refused["unknown_ring"] += 1
            return
        route = (kind, stream.peer_id)
        if not gen.queues.has_inbox(route) or (number, stream.peer_id) in self._claimed:
            self.refused["unexpected_peer"] += 1
            return
        self._claimed.add((number, stream.peer_id))
        await gen.queues.fill(route, stream, self.refused)

    async def connect(self, opener: StreamOpener, addresses: Mapping[str, str], nursery: trio.Nursery) -> None:
        """Open the current generation's stream to the next peer and start its sender (in ``nursery``); kept
        for the generations a drop makes."""
        self._opener, self._addresses, self._nursery = opener, dict(addresses), nursery
        await self._open(self.current)

    async def _open(self, gen: Generation) -> None:
        gen.queues.bind(trio.lowlevel.current_trio_token())
        if len(gen.peers) < 2 or self._opener is None or self._nursery is None:
            return
        peer = gen.next
        if peer not in self._addresses:
            raise LinkError(f"the start command lacks the address of ring peer {peer}")
        try:
            stream = await self._opener.connect_stream(
                self._addresses[peer], self.purpose(gen.kind), expect_peer_id=peer
            )
        except (TransportError, RemoteProtocolError) as exc:
            raise LinkError(f"cannot open the {gen.kind} stream to peer {peer}: {exc}") from exc
        self._outgoing[gen.number] = stream
        self._nursery.start_soon(gen.queues.run_sender, (gen.kind, peer), stream)

    async def drop(self, count: int, index: int) -> None:
        """The leader dropped the ``index``-th of the ``count`` replicas in the ring now: end this generation,
        make the next one without it, offer its link to the compute thread. ``ValueError`` when the command
        does not fit this ring."""
        left = drop_from(self.replicas, count, index, self.mine)
        gen = await self._replace(left, f"replica {index} of {count} was dropped from the ring")
        self.change.offer(WireRingLink(self, gen))

    async def grow(self, slot: int, peer: str, address: str, generation: int) -> WireRingLink:
        """The dropped replica of ``slot`` was rebuilt; ``peer`` (at ``address``) holds this worker's place in it.
        Make ``generation`` (the next one) with it and return its link; for a worker between two steps (nothing
        in flight on the ring). ``ValueError`` when the command does not fit this ring."""
        if generation != self._number + 1:
            raise ValueError(f"the rebuilt replica's ring is generation {generation}, this one is at {self._number}")
        if slot in self.replicas or peer in self.by_slot.values():
            raise ValueError(f"slot {slot} or peer {peer} is in the ring already")
        self.by_slot[slot] = peer
        self._addresses[peer] = address
        gen = await self._replace(tuple(sorted((*self.replicas, slot))), f"the replica of slot {slot} was rebuilt")
        return WireRingLink(self, gen)

    async def _replace(self, replicas: tuple[int, ...], why: str) -> Generation:
        """End the current generation (``why``) and start the next one over ``replicas``."""
        if self._number >= MAX_GENERATIONS:
            raise ValueError(f"the ring changed more than {MAX_GENERATIONS} times")
        old = self.current
        gen = self._generation(old.number + 1, replicas)
        self._generations[gen.number] = gen
        self._number, self.replicas = gen.number, replicas
        self._changed.set()
        self._changed = trio.Event()
        old.queues.close(why)
        stream = self._outgoing.pop(old.number, None)
        if stream is not None:
            with contextlib.suppress(Exception):  # the peer may be gone: that is why we drop it
                await stream.aclose()
        await self._open(gen)
        return gen

    async def aclose(self) -> None:
        """Send what the current generation still has queued (at most ``timeout_s``), then close everything."""
        await self.current.queues.drain_senders(self.timeout_s)
        for gen in self._generations.values():
            gen.queues.close("the worker closed its links")
        for stream in list(self._outgoing.values()):
            with contextlib.suppress(Exception):  # closing at the end: the peer may be gone already
                await stream.aclose()
        self._outgoing.clear()


class WireRingLink:
    """``ring.RingLink`` over one generation of a :class:`WireRing`; blocking, for the compute thread."""

    def __init__(self, ring: WireRing, gen: Generation) -> None:
        self._ring = ring
        self._gen = gen

    @property
    def rank(self) -> int:
        return self._gen.rank

    @property
    def world_size(self) -> int:
        return len(self._gen.peers)

    def send_next(self, frame: bytes) -> None:
        """Queue one frame for the next replica's worker (asynchronous; counted in ``bytes_sent``)."""
        gen = self._gen
        if len(gen.peers) < 2:
            raise LinkError("this worker has no replica ring (one replica)")
        header = _SEQ.pack(gen.sent)
        gen.sent += 1
        gen.queues.post((gen.kind, gen.next), header, frame)
        self._ring.bytes_sent += len(header) + len(frame)
        self._ring.frames_sent += 1

    def recv_prev(self) -> bytes:
        """The previous replica's next frame (its tensor frame, checked for order here)."""
        gen = self._gen
        if len(gen.peers) < 2:
            raise LinkError("this worker has no replica ring (one replica)")
        header, payload = gen.queues.take((gen.kind, gen.prev))
        if len(header) != _SEQ.size:
            raise LinkError(f"a ring header from peer {gen.prev} has {len(header)} bytes, not {_SEQ.size}")
        (got,) = _SEQ.unpack_from(header)
        if got != gen.received:
            raise LinkError(f"ring frame {gen.received} expected from peer {gen.prev}, got frame {got}")
        gen.received += 1
        return bytes(payload)
