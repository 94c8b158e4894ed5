"""Ring all-reduce between the replicas of one pipeline stage: the pure schedule, the executor, a test ring.

The same stage of R replicas forms a ring (rank r sends to r + 1 and receives from r - 1, modulo R). A flat
tensor is cut into R chunks (``chunk_bounds``); ``ring_steps`` lists, per rank, the 2(R - 1) steps of the classic
algorithm (Patarasuknawin & Yuan 2009; Baidu's ring all-reduce):
- reduce-scatter, R - 1 steps: send chunk (r - k) mod R, receive chunk (r - k - 1) mod R and add it in; after
  them rank r owns the full sum of chunk (r + 1) mod R;
- all-gather, R - 1 steps: send the chunk last completed, receive chunk (r - k) mod R and take it as is.
Each rank sends 2(R - 1)/R of the tensor, whatever R. The all-gather forwards the owner's encoded frame
verbatim, and the owner keeps the decoded copy of what it sent, so every rank ends with bit-identical values
even with a lossy codec (the replicas never drift apart).

``ring_allreduce_`` runs the schedule over a ``RingLink`` (frames are ``protocol.tensors`` frames: a header and
raw or compressed bytes, never pickle; received frames are checked against the chunk's expected shape and
dtype before use). ``InMemoryRing`` is the threaded test ring; it counts the bytes its links carry.

``RingChange`` hands a replacement ring to the compute thread: when the leader drops a replica, the event loop
builds the smaller ring and offers its link; a sync whose ring broke waits for it (``replicas.py``).
"""

from __future__ import annotations

import enum
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import torch

from arceusd.worker.collective import DEFAULT_TIMEOUT_S
from protocol.decoding import decode_tensor_frame
from protocol.tensors import RAW, TensorCodec, encode_tensor_frame


class RingLink(Protocol):
    """One rank's links in a ring (blocking; called from the engine's compute thread).

    ``send_next`` may buffer (at least 2 frames); frames from ``recv_prev`` arrive in send order."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def send_next(self, frame: bytes) -> None: ...

    def recv_prev(self) -> bytes: ...


class RingError(RuntimeError):
    """A ring peer did not answer in time or sent a frame that does not fit the chunk expected."""


class Phase(enum.Enum):
    REDUCE_SCATTER = "reduce-scatter"
    ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class RingStep:
    phase: Phase
    send_chunk: int
    recv_chunk: int


def chunk_bounds(numel: int, world: int) -> tuple[tuple[int, int], ...]:
    """``world`` contiguous [start, end) ranges covering ``numel`` elements, the first ``numel % world`` one
    longer (some may be empty when numel < world)."""
    if world < 1 or numel < 0:
        raise ValueError(f"need world >= 1 and numel >= 0, got world={world}, numel={numel}")
    base, extra = divmod(numel, world)
    out, start = [], 0
    for c in range(world):
        end = start + base + (1 if c < extra else 0)
        out.append((start, end))
        start = end
    return tuple(out)


def ring_steps(rank: int, world: int) -> tuple[RingStep, ...]:
    """The 2(world - 1) steps of ``rank`` (empty for a ring of one)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} out of range for a ring of {world}")
    steps = [RingStep(Phase.REDUCE_SCATTER, (rank - k) % world, (rank - k - 1) % world) for k in range(world - 1)]
    steps += [RingStep(Phase.ALL_GATHER, (rank + 1 - k) % world, (rank - k) % world) for k in range(world - 1)]
    return tuple(steps)


def ring_allreduce_(flat: torch.Tensor, link: RingLink, codec: TensorCodec = RAW) -> None:
    """Sum the 1-D CPU tensor ``flat`` over the ring, in place; every rank ends with the same bits.

    Error handling: raises ``RingError`` if a received frame does not decode to the chunk expected (a peer
    sent something bad; ``protocol`` errors are wrapped) or the link raised it (timeout)."""
    world, rank = link.world_size, link.rank
    if world == 1:
        return
    if flat.dim() != 1:
        raise ValueError(f"ring_allreduce_ takes a flat tensor, got shape {tuple(flat.shape)}")
    bounds = chunk_bounds(flat.numel(), world)
    frame = b""
    for step in ring_steps(rank, world):
        s0, s1 = bounds[step.send_chunk]
        r0, r1 = bounds[step.recv_chunk]
        if step.phase is Phase.REDUCE_SCATTER:
            link.send_next(encode_tensor_frame(flat[s0:s1].contiguous(), codec))
            flat[r0:r1] += _decode(link.recv_prev(), r1 - r0, flat.dtype)
            continue
        if not frame:  # first all-gather step: the chunk this rank completed, as the others will see it
            frame = encode_tensor_frame(flat[s0:s1].contiguous(), codec)
            flat[s0:s1] = _decode(frame, s1 - s0, flat.dtype)
        link.send_next(frame)
        frame = link.recv_prev()
        flat[r0:r1] = _decode(frame, r1 - r0, flat.dtype)


def _decode(frame: bytes, numel: int, dtype: torch.dtype) -> torch.Tensor:
    try:
        return decode_tensor_frame(frame, expected_shape=(numel,), expected_dtype=dtype)
    except Exception as exc:  # protocol's RemoteProtocolError family, re-raised as this module's error
        raise RingError(f"a ring peer sent a chunk that does not fit ({numel} x {dtype}): {exc}") from exc


class RingChange:
    """The hand-off of a replacement ``RingLink`` from the event loop (``offer``) to the compute thread
    (``wait``); the newest offer wins. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._link: RingLink | None = None
        self.offers = 0

    def offer(self, link: RingLink) -> None:
        with self._cond:
            self._link = link
            self.offers += 1
            self._cond.notify_all()

    def wait(self, timeout_s: float, why: str) -> RingLink:
        """The offered link (taken: a later failure waits for a newer one); ``RingError`` naming ``why`` (how
        the old ring broke) when none comes within ``timeout_s``."""
        with self._cond:
            if self._link is None:
                self._cond.wait_for(lambda: self._link is not None, timeout_s)
            link, self._link = self._link, None
        if link is None:
            raise RingError(f"the replica ring broke ({why}) and no smaller ring was offered within {timeout_s}s")
        return link


class InMemoryRing:
    """A ring of ``world`` threads in one process; ``bytes_sent`` counts every frame byte its links carried."""

    def __init__(self, world: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if world < 1:
            raise ValueError(f"a ring needs >= 1 rank, got {world}")
        self.world = world
        self.broken: str | None = None
        self.timeout_s = timeout_s
        self._inbox: list[queue.Queue[bytes]] = [queue.Queue() for _ in range(world)]
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.frames_sent = 0

    def link(self, rank: int) -> InMemoryRingLink:
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} out of range for a ring of {self.world}")
        return InMemoryRingLink(self, rank)

    def _send(self, rank: int, frame: bytes) -> None:
        with self._lock:
            self.bytes_sent += len(frame)
            self.frames_sent += 1
        self._inbox[(rank + 1) % self.world].put(frame)

    def _recv(self, rank: int) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while self.broken is None:
            try:
                return self._inbox[rank].get(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise RingError(f"ring rank {rank} waited {self.timeout_s}s for its predecessor") from None
        raise RingError(f"ring rank {rank}: the ring broke ({self.broken})")

    def break_(self, why: str) -> None:
        """End the ring: every waiting and later receive raises ``RingError`` (a peer died, say)."""
        self.broken = why


class InMemoryRingLink:
    """One rank's ``RingLink`` on an ``InMemoryRing``."""

    def __init__(self, ring: InMemoryRing, rank: int) -> None:
        self._ring = ring
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._ring.world

    def send_next(self, frame: bytes) -> None:
        self._ring._send(self._rank, frame)

    def recv_prev(self) -> bytes:
        return self._ring._recv(self._rank)
