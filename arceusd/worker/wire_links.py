"""``Links`` and ``Collective`` over the authenticated transport: stage workers in separate processes.

Owns: the worker-to-worker streams of one job, their routing and framing, and the calls the compute thread
makes. The compute thread (``StageEngine.run_step`` in ``trio.to_thread.run_sync``) never waits on the event
loop: a send queues its frame on the route's ordered, bounded outbox and returns (a trio task per outgoing
stream sends them in order), a receive pops the route's inbox, which the stream handlers fill
(``route_queues.py``). So torch never runs on the event loop, the event loop never waits on torch, and the
sealing (AES-GMAC) and gRPC writes of one micro-batch overlap the compute of the next. A failed send is
raised on the compute thread at its next link call, and at the latest by ``allreduce_scalars`` (which flushes
the outboxes; it is the engine's last call of every step).

Streams: one authenticated transport stream per (kind, sender, receiver), opened by the *sender* with
``expect_peer_id`` = the peer the plan names for that address, purpose ``b"<job>/<term>/<kind>"``. The
receiving side routes an incoming stream by (kind, proven peer id) to an unbounded in-order inbox; a stream
from a peer the plan does not name for that kind (or a second stream for the same route) is
refused and counted in ``refused``. Kinds:

- ``act``: stage s rank 0 -> every rank of stage s + 1; ``grad``: stage s rank 0 -> every rank of stage s - 1
  (the engine's contract: only tensor-parallel rank 0 sends; inboxes buffer without bound, so a send never
  waits for the receiver's compute);
- ``sum`` / ``sumres``: ``allreduce_scalars`` is a star over worker 0 (stage 0 rank 0), which adds each value
  in global worker order (stage, then rank) and sends the sums back, so every worker gets the same floats;
  header ``(round u64, k x f64)`` (k = 1 is the one-scalar frame of earlier versions, byte for byte);
- ``tp`` / ``tpres``: a tensor-parallel group's ``all_reduce_sum``, a star over the group's rank 0 adding in
  rank order (bit-identical results on every rank, like the in-memory collective);
- ``tie``: a tied weight's two ends (``tied.py``: a stock LM's embedding on stage 0, its head on the last stage),
  rank 0 of each to the other, when the fabric is made with ``tied=True``: each step's gradient of the weight,
  header ``(phase u8, step u64, 0 u32)`` + a raw tensor frame (:meth:`WireFabric.tied_link`);
- ``data``: the owner's batch service (``datafeed.py``), handed to ``data_handler``;
- ``ring`` (``ring.<g>`` after a replica is dropped): data-parallel replicas (``config.replicas``), this worker
  -> the worker at the same (stage, rank) of the next replica; on queues of their own, owned by
  ``ring_links.WireRing`` (:meth:`WireFabric.ring_link` is the ``ring.RingLink`` that ``replicas.ReplicaSync``
  all-reduces over; ``ring_bytes`` counts what this worker handed to its ring streams).

Frames: ``act``/``grad`` headers are ``(phase u8, step u64, micro-batch u32)`` + the tensor frame header of
``protocol.tensors``; the payload is the frame body (raw: a zero-copy view of the tensor's memory). The
job's compression codec (``protocol.compression``) applies to ``act``/``grad`` only; tensor-parallel
all-reduces and scalars are always exact. A receiver checks phase/step/micro-batch/sequence against what it
expects and raises ``LinkError`` on a mismatch or after ``timeout_s`` without a message.
"""

from __future__ import annotations

import contextlib
import struct
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence

import torch
import trio

from arceusd.transport import Stream, TransportError
from arceusd.worker.links import LinkError
from arceusd.worker.protocol import WorkerConfig
from arceusd.worker.ring_links import RING_KIND, StreamOpener, WireRing, WireRingLink
from arceusd.worker.route_queues import RouteQueues
from protocol.decoding import decoder_for
from protocol.errors import RemoteProtocolError
from protocol.tensors import RAW, TensorCodec, encode_tensor_parts, read_tensor_header

PHASE_TRAIN = 0
PHASE_EVAL = 1

_PIPE = struct.Struct(">BQI")  # phase, step, micro-batch
_SEQ = struct.Struct(">Q")  # collective call sequence number

PIPE_KINDS = ("act", "grad")
KINDS = ("act", "grad", "sum", "sumres", "tp", "tpres", "tie")


def _encode(t: torch.Tensor, codec: TensorCodec) -> tuple[bytes, bytes | memoryview]:
    """(tensor frame header, body) of ``t``; the raw body is a view of ``t``'s memory (no copy)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_floating_point():
        codec = RAW
    parts = encode_tensor_parts(t, codec)
    head = bytes(parts[0])
    body: bytes | memoryview = memoryview(parts[1]) if len(parts) == 2 else b"".join(parts[1:])
    return head, body


def _decode(tensor_head: bytes, payload: memoryview) -> torch.Tensor:
    head = read_tensor_header(tensor_head)
    if head.body_offset != len(tensor_head):
        raise LinkError(f"tensor header of {len(tensor_head)} bytes declares {head.body_offset}")
    return decoder_for(head.codec_id)(head.params, payload, head.dtype, head.shape)


class WireFabric:
    """One worker's streams to the other workers of its job (see the module docstring).

    Lifecycle: construct from the config (inboxes exist at once, so early streams from faster peers are
    accepted), pass :meth:`handle_stream` as the transport's stream handler, :meth:`connect` once the
    addresses are known, hand :meth:`links` / :meth:`collective` to the engine, :meth:`aclose` at the end.
    """

    def __init__(
        self,
        config: WorkerConfig,
        codec: TensorCodec = RAW,
        data_handler: Callable[[Stream], Awaitable[None]] | None = None,
        tied: bool = False,
    ) -> None:
        """``tied``: the model ties a weight of the first stage to one of the last (``tied.py``); the two
        stages' rank 0 then open a ``tie`` stream to each other."""
        self.config = config
        self.codec = codec
        self.data_handler = data_handler
        self.timeout_s = config.link_timeout_s
        self.stage, self.rank = config.position()
        self.num_stages = len(config.stages)
        self.workers = config.workers()
        self.root = self.workers[0][2]
        self.is_root = config.peer_id == self.root
        self.group = [m.peer_id for m in config.stages[self.stage].members]
        self.tied_peer = self._tied_peer() if tied else None
        """The other end of the tied weight (rank 0 of the last stage, or of stage 0), or None."""
        self.refused: Counter[str] = Counter()
        self._prefix = f"{config.job_id}/{config.term}/".encode()
        self._outgoing: dict[tuple[str, str], Stream] = {}
        self.ring = WireRing(config.ring_slots(), config.peer_id, self.timeout_s, self.purpose, config.ring_generation)
        self.queues = RouteQueues(self._incoming_routes(), self.outgoing_routes(), timeout_s=self.timeout_s)
        self._claimed: set[tuple[str, str]] = set()
        self.phase = PHASE_TRAIN
        self.step = 0
        self._sum_seq = 0
        self._tp_seq = 0

    def purpose(self, kind: str) -> bytes:
        return self._prefix + kind.encode()

    # -- routes ---------------------------------------------------------------------------------------------

    def _tied_peer(self) -> str | None:
        last = self.num_stages - 1
        if self.rank != 0 or last == 0 or self.stage not in (0, last):
            return None
        return self.config.peer(last if self.stage == 0 else 0, 0)

    def _incoming_routes(self) -> list[tuple[str, str]]:
        s, r, c = self.stage, self.rank, self.config
        routes: list[tuple[str, str]] = []
        if s > 0:
            routes.append(("act", c.peer(s - 1, 0)))
        if s < self.num_stages - 1:
            routes.append(("grad", c.peer(s + 1, 0)))
        if self.tied_peer is not None:
            routes.append(("tie", self.tied_peer))
        if self.is_root:
            routes += [("sum", p) for _, _, p in self.workers if p != self.root]
        else:
            routes.append(("sumres", self.root))
        if len(self.group) > 1:
            if r == 0:
                routes += [("tp", p) for p in self.group[1:]]
            else:
                routes.append(("tpres", self.group[0]))
        return routes

    def outgoing_routes(self) -> list[tuple[str, str]]:
        """(kind, receiving peer) of every stream this worker opens."""
        s, r, c = self.stage, self.rank, self.config
        routes: list[tuple[str, str]] = []
        if r == 0 and s < self.num_stages - 1:
            routes += [("act", m.peer_id) for m in c.stages[s + 1].members]
        if r == 0 and s > 0:
            routes += [("grad", m.peer_id) for m in c.stages[s - 1].members]
        if self.tied_peer is not None:
            routes.append(("tie", self.tied_peer))
        if self.is_root:
            routes += [("sumres", p) for _, _, p in self.workers if p != self.root]
        else:
            routes.append(("sum", self.root))
        if len(self.group) > 1:
            if r == 0:
                routes += [("tpres", p) for p in self.group[1:]]
            else:
                routes.append(("tp", self.group[0]))
        return routes

    # -- trio side ------------------------------------------------------------------------------------------

    async def handle_stream(self, stream: Stream) -> None:
        """The transport's stream handler: route by purpose and proven peer, or refuse."""
        purpose = stream.purpose
        if not purpose.startswith(self._prefix):
            self.refused["foreign_job"] += 1
            return
        kind = purpose[len(self._prefix) :].decode("ascii", "replace")
        if kind.startswith(RING_KIND):
            await self.ring.handle_stream(kind, stream)
            return
        if kind == "data":
            if self.data_handler is None:
                self.refused["no_data_service"] += 1
                return
            await self.data_handler(stream)
            return
        key = (kind, stream.peer_id)
        if not self.queues.has_inbox(key) or key in self._claimed:
            self.refused["unexpected_peer" if kind in KINDS else "unknown_kind"] += 1
            return
        self._claimed.add(key)
        await self.queues.fill(key, stream, self.refused)

    async def connect(self, opener: StreamOpener, addresses: Mapping[str, str], nursery: trio.Nursery) -> None:
        """Open every outgoing stream (concurrently) and start its sender task in ``nursery``.

        Refuses a peer answering with another id."""
        missing = sorted({p for _, p in self.outgoing_routes()} - set(addresses))
        if missing:
            raise LinkError(f"the start command lacks the address of peer(s) {missing}")

        async def open_one(kind: str, peer: str) -> None:
            try:
                self._outgoing[(kind, peer)] = await opener.connect_stream(
                    addresses[peer], self.purpose(kind), expect_peer_id=peer
                )
            except (TransportError, RemoteProtocolError) as exc:
                raise LinkError(
                    f"cannot open the {kind} stream to peer {peer} at {addresses[peer]}: {exc} (a different "
                    "peer answering there is refused; check the addresses in the start command)"
                ) from exc

        async with trio.open_nursery() as opening:
            for kind, peer in self.outgoing_routes():
                opening.start_soon(open_one, kind, peer)
        self.queues.bind(trio.lowlevel.current_trio_token())
        for route, stream in self._outgoing.items():
            nursery.start_soon(self.queues.run_sender, route, stream)
        await self.ring.connect(opener, addresses, nursery)

    async def aclose(self) -> None:
        """Send what is still queued (at most ``timeout_s``), stop the links, close the streams."""
        await self.ring.aclose()
        await self.queues.drain_senders(self.timeout_s)
        self.queues.close("the worker closed its links")
        for stream in list(self._outgoing.values()):
            with contextlib.suppress(Exception):  # closing at the end: the peer may be gone already
                await stream.aclose()
        self._outgoing.clear()

    # -- blocking side (compute thread) ---------------------------------------------------------------------

    def links(self) -> WireLinks:
        return WireLinks(self)

    def collective(self) -> WireCollective:
        return WireCollective(self)

    def tied_link(self) -> WireTiedLink:
        """This worker's ``tied.TiedLink`` to the other end of the tied weight (a fabric made with ``tied=True``,
        on rank 0 of the first or the last stage)."""
        if self.tied_peer is None:
            raise LinkError(f"stage {self.stage} rank {self.rank} holds no end of a tied weight on another stage")
        return WireTiedLink(self)

    def ring_link(self) -> WireRingLink:
        return self.ring.link()

    @property
    def ring_bytes(self) -> int:
        """Bytes this worker handed to its ring streams, every generation."""
        return self.ring.bytes_sent

    def _post(self, kind: str, peers: list[str], header: bytes, body: bytes | memoryview) -> None:
        for peer in peers:
            self.queues.post((kind, peer), header, body)

    def send_pipe(self, kind: str, micro_batch: int, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` for the neighbouring stage and return at once (the send is asynchronous: do not
        modify ``tensor`` afterwards). A failed earlier send raises here or at the step's end."""
        s = self.stage
        if self.rank != 0:
            raise LinkError(f"stage {s} rank {self.rank} sent a {kind}: only rank 0 of a stage sends")
        target = s + 1 if kind == "act" else s - 1
        if not 0 <= target < self.num_stages:
            raise LinkError(f"stage {s} sent a {kind} to stage {target}, which does not exist")
        self.queues.check()
        head, body = _encode(tensor, self.codec)
        header = _PIPE.pack(self.phase, self.step, micro_batch) + head
        self._post(kind, [m.peer_id for m in self.config.stages[target].members], header, body)

    def recv_pipe(self, kind: str, micro_batch: int) -> torch.Tensor:
        source = self.stage - 1 if kind == "act" else self.stage + 1
        if not 0 <= source < self.num_stages:
            raise LinkError(f"stage {self.stage} has no neighbour sending it a {kind}")
        header, payload = self.queues.take((kind, self.config.peer(source, 0)))
        if len(header) < _PIPE.size:
            raise LinkError(f"a {kind} header of {len(header)} bytes is too short")
        got = _PIPE.unpack_from(header)
        want = (self.phase, self.step, micro_batch)
        if got != want:
            raise LinkError(f"expected {kind} (phase, step, micro-batch) {want}, got {got}")
        return _decode(header[_PIPE.size :], payload)

    def flush(self) -> None:
        """Wait until every queued send was handed to its stream; raise the first failed send."""
        self.queues.flush()

    def allreduce_scalar(self, value: float) -> float:
        return self.allreduce_scalars((value,))[0]

    def allreduce_scalars(self, values: Sequence[float]) -> list[float]:
        """Sum each of ``values`` over every worker (a star over worker 0, which adds in global worker order);
        every worker passes the same number of values. Also flushes this worker's queued sends before
        returning, so a failed send of the step is raised here at the latest (the engine's last link call of
        a step is this one)."""
        seq = self._sum_seq
        self._sum_seq += 1
        n = len(values)
        if n < 1:
            raise LinkError("allreduce_scalars needs at least one value")
        if len(self.workers) == 1:
            self.flush()
            return [float(v) for v in values]
        size = _SEQ.size + 8 * n
        if not self.is_root:
            self._post("sum", [self.root], _SEQ.pack(seq) + struct.pack(f">{n}d", *values), b"")
            header, _ = self.queues.take(("sumres", self.root))
            if len(header) != size:
                raise LinkError(f"scalar all-reduce {seq}: worker 0 sent {len(header)} bytes, not {size}")
            (got,) = _SEQ.unpack_from(header)
            if got != seq:
                raise LinkError(f"scalar all-reduce {seq}: worker 0 answered round {got}")
            self.flush()
            return list(struct.unpack_from(f">{n}d", header, _SEQ.size))
        columns: list[list[float]] = [[float(v)] for v in values]
        others = [p for _, _, p in self.workers if p != self.root]
        for peer in others:
            header, _ = self.queues.take(("sum", peer))
            if len(header) != size:
                raise LinkError(f"scalar all-reduce {seq}: peer {peer} sent {len(header)} bytes, not {size}")
            (got,) = _SEQ.unpack_from(header)
            if got != seq:
                raise LinkError(f"scalar all-reduce {seq}: peer {peer} sent round {got}")
            for column, v in zip(columns, struct.unpack_from(f">{n}d", header, _SEQ.size), strict=True):
                column.append(v)
        totals = [float(sum(column)) for column in columns]
        self._post("sumres", others, _SEQ.pack(seq) + struct.pack(f">{n}d", *totals), b"")
        self.flush()
        return totals

    def exchange_tied(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send ``tensor`` to the tied weight's other end and return what it sent for the same step (exact: raw
        frames, never the job's compression)."""
        peer = self.tied_peer
        if peer is None:
            raise LinkError(f"stage {self.stage} rank {self.rank} holds no end of a tied weight on another stage")
        self.queues.check()
        head, body = _encode(tensor, RAW)
        self._post("tie", [peer], _PIPE.pack(self.phase, self.step, 0) + head, body)
        header, payload = self.queues.take(("tie", peer))
        if len(header) < _PIPE.size:
            raise LinkError(f"a tie header of {len(header)} bytes is too short")
        got, want = _PIPE.unpack_from(header), (self.phase, self.step, 0)
        if got != want:
            raise LinkError(f"expected the tied weight's gradient of (phase, step) {want[:2]}, got {got[:2]}")
        self.flush()  # ``tensor`` is the caller's gradient: its frame must have left before it may change
        return _decode(header[_PIPE.size :], payload)

    def all_reduce_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        seq = self._tp_seq
        self._tp_seq += 1
        if len(self.group) == 1:
            return tensor.detach().clone()
        head, body = _encode(tensor, RAW)
        if self.rank != 0:
            leader = self.group[0]
            self._post("tp", [leader], _SEQ.pack(seq) + head, body)
            header, payload = self.queues.take(("tpres", leader))
            (got,) = _SEQ.unpack_from(header)
            if got != seq:
                raise LinkError(f"tensor all-reduce {seq}: rank 0 answered round {got}")
            # ``tensor`` may be reused by the caller: its frame must have left before we return.
            self.flush()
            return _decode(header[_SEQ.size :], payload).to(tensor.device)
        out = tensor.detach().cpu().clone()
        for peer in self.group[1:]:
            header, payload = self.queues.take(("tp", peer))
            (got,) = _SEQ.unpack_from(header)
            if got != seq:
                raise LinkError(f"tensor all-reduce {seq}: peer {peer} sent round {got}")
            out.add_(_decode(header[_SEQ.size :], payload))
        head, body = _encode(out, RAW)
        self._post("tpres", self.group[1:], _SEQ.pack(seq) + head, body)
        self.flush()  # the caller may modify ``out`` in place: its frames must have been sealed first
        return out.to(tensor.device)


class WireLinks:
    """``Links`` (see ``links.py``) over a :class:`WireFabric`; blocking, for the compute thread."""

    def __init__(self, fabric: WireFabric) -> None:
        self._fabric = fabric

    def send_activation(self, micro_batch: int, tensor: torch.Tensor) -> None:
        self._fabric.send_pipe("act", micro_batch, tensor)

    def recv_activation(self, micro_batch: int) -> torch.Tensor:
        return self._fabric.recv_pipe("act", micro_batch)

    def send_grad(self, micro_batch: int, tensor: torch.Tensor) -> None:
        self._fabric.send_pipe("grad", micro_batch, tensor)

    def recv_grad(self, micro_batch: int) -> torch.Tensor:
        return self._fabric.recv_pipe("grad", micro_batch)

    def allreduce_scalar(self, value: float) -> float:
        return self._fabric.allreduce_scalar(value)

    def allreduce_scalars(self, values: Sequence[float]) -> list[float]:
        return self._fabric.allreduce_scalars(values)


class WireTiedLink:
    """``tied.TiedLink`` over a :class:`WireFabric`; blocking, for the compute thread."""

    def __init__(self, fabric: WireFabric) -> None:
        self._fabric = fabric

    def exchange(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._fabric.exchange_tied(tensor)


class WireCollective:
    """The stage's tensor-parallel ``Collective`` over a :class:`WireFabric`; blocking, for the compute
    thread."""

    def __init__(self, fabric: WireFabric) -> None:
        self._fabric = fabric

    @property
    def rank(self) -> int:
        return self._fabric.rank

    @property
    def world_size(self) -> int:
        return len(self._fabric.group)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._fabric.all_reduce_tensor(tensor)
