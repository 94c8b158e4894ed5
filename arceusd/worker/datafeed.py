"""Batches by step number: the job owner's worker serves them, stage 0 fetches inputs, the last stage targets.

Owns: the ``data`` stream protocol and the prefetching client.

- :class:`DataServer` (on the owner's worker) wraps the spec's ``BatchSource``. A client opens one stream with
  purpose ``b"<job>/<term>/data"`` and sends requests, header = JSON ``{"kind": "train"|"eval", "index": k,
  "part": "inputs"|"targets"}``; each answer is one tensor frame (header = ``protocol.tensors`` frame header,
  payload = the raw body). Inputs go only to members of stage 0 and targets only to members of the last stage
  (by proven peer id); anyone else is refused and the stream closed. With data-parallel replicas
  (``config.replicas``) the members of stage 0 / the last stage of every replica are served, and a training
  request from replica r gets the r-th of R equal shares of the step's batch (dim 0), chosen by the proven
  peer id, so the replicas together train on exactly the global batch; eval batches go whole to every replica.
- :class:`DataClient` asks the owner (or, on the owner itself, the server directly) one request at a time.
- :class:`Prefetcher` runs a task that fetches training steps ``[start, stop)`` into a one-slot channel, so
  the
  next step's batch is on hand when the current step ends.

Determinism: step ``k``'s batch is ``BatchSource.batch(k)``, a function of (data, seed, k) only, so a resumed
run sees the batches of the failure-free run; eval batch ``i`` is the ``i``-th of ``eval_batches()``, the same
list every time.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass

import torch
import trio

from arceusd.data.batches import BatchSource
from arceusd.jobs.spec.parsed import JobSpec, MnistDataSpec
from arceusd.transport import Stream
from arceusd.worker.protocol import WorkerConfig
from protocol.decoding import decoder_for
from protocol.errors import RemoteProtocolError
from protocol.tensors import RAW, encode_tensor_parts, read_tensor_header

PARTS = ("inputs", "targets")
RECENT_BATCHES = 4
"""Training batches the owner's :class:`DataServer` keeps (the prefetchers ask at most a step or two ahead)."""
KINDS = ("train", "eval")
MNIST_EVAL_BATCH = 1000
"""Eval batch size of MNIST jobs (``open_batch_source``'s default); every worker derives the count from it."""


def eval_batch_count(spec: JobSpec) -> int:
    """How many eval batches the job has (known to every worker from the spec alone)."""
    if isinstance(spec.data, MnistDataSpec):
        return math.ceil(spec.data.holdout_count / MNIST_EVAL_BATCH)
    return spec.training.eval_iters


@dataclass(frozen=True)
class Request:
    kind: str
    index: int
    part: str

    def encode(self) -> bytes:
        return json.dumps({"kind": self.kind, "index": self.index, "part": self.part}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Request:
        try:
            d = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RemoteProtocolError("bad_data_request", "a data request must be a JSON object") from None
        if not isinstance(d, dict) or set(d) != {"kind", "index", "part"}:
            raise RemoteProtocolError("bad_data_request", f"a data request has kind, index, part; got {d!r}")
        kind, index, part = d["kind"], d["index"], d["part"]
        if kind not in KINDS or part not in PARTS or not isinstance(index, int) or index < 0:
            raise RemoteProtocolError("bad_data_request", f"bad data request {d!r}")
        return cls(kind, index, part)


class DataServer:
    """The owner's batch service (see the module docstring)."""

    def __init__(self, source: BatchSource, config: WorkerConfig, total_steps: int) -> None:
        self.source = source
        self.total_steps = total_steps
        self.config = config
        self.input_peers = set(config.stage_members(0))
        self.target_peers = set(config.stage_members(len(config.stages) - 1))
        self.refused: Counter[str] = Counter()
        self._eval: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.finished: set[str] = set()
        """Peers whose data stream ended (they fetched all they needed)."""
        self._changed = trio.Event()
        self._slots: dict[str, int] = {}  # peers of a rebuilt replica -> its slot (the rest: the config's)
        self._recent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        """The last :data:`RECENT_BATCHES` training batches by step: a step's inputs and targets (and every
        replica's share) are asked for separately, within a step or two of each other; computed once."""

    def admit(self, slot: int, inputs: list[str], targets: list[str]) -> None:
        """A rebuilt replica of ``slot``: its first stage's ``inputs`` and last stage's ``targets`` peers fetch
        that slot's share from now on."""
        if not 0 <= slot < self.config.share_count():
            raise ValueError(f"no slot {slot} among the {self.config.share_count()} shares of each batch")
        for peer in (*inputs, *targets):
            self._slots[peer] = slot
        self.input_peers.update(inputs)
        self.target_peers.update(targets)
        self._changed.set()
        self._changed = trio.Event()

    def remote_clients(self) -> set[str]:
        """Every peer that fetches from this server over a stream (all but the owner itself)."""
        return (self.input_peers | self.target_peers) - {self.config.owner}

    async def wait_clients_done(self, timeout_s: float) -> set[str]:
        """Wait until every remote client closed its data stream (at most ``timeout_s``); returns the ones that
        did not. With replicas the owner's pipeline ends before the other replicas fetched their last eval
        batches, so the owner must not leave first."""
        with trio.move_on_after(timeout_s):
            while not self.remote_clients() <= self.finished:
                await self._changed.wait()
        return self.remote_clients() - self.finished

    def get(self, request: Request, peer_id: str | None = None) -> torch.Tensor:
        """The tensor a request asks for: with replicas, ``peer_id``'s replica's share of a training batch
        (default: this worker's replica). RemoteProtocolError for an index out of range."""
        if request.kind == "train":
            if request.index >= self.total_steps:
                raise RemoteProtocolError("bad_data_request", f"step {request.index} >= {self.total_steps}")
            x, y = self._train_batch(request.index)
            whole = x if request.part == "inputs" else y
            count = self.config.share_count()
            if count == 1:
                return whole
            if whole.shape[0] % count:
                raise RemoteProtocolError(
                    "bad_data_request", f"a batch of {whole.shape[0]} does not split into {count} equal shares"
                )
            slot = self._slots.get(peer_id) if peer_id is not None else None
            return whole.chunk(count)[self.config.slot_of(peer_id) if slot is None else slot]
        if self._eval is None:
            self._eval = list(self.source.eval_batches())
        if request.index >= len(self._eval):
            raise RemoteProtocolError("bad_data_request", f"eval batch {request.index} of {len(self._eval)}")
        x, y = self._eval[request.index]
        return x if request.part == "inputs" else y

    def _train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step ``step``'s whole training batch, from :attr:`_recent` or the source (read-only to callers)."""
        batch = self._recent.get(step)
        if batch is None:
            batch = self.source.batch(step)
            self._recent[step] = batch
            while len(self._recent) > RECENT_BATCHES:  # bounded: the oldest step goes first
                del self._recent[min(self._recent)]
        return batch

    async def serve(self, stream: Stream) -> None:
        """Answer one client's requests until it closes the stream; refuse a peer not entitled to a part."""
        try:
            await self._serve(stream)
        finally:
            self.finished.add(stream.peer_id)
            self._changed.set()
            self._changed = trio.Event()

    async def _serve(self, stream: Stream) -> None:
        while True:
            try:
                header, _ = await stream.receive()
            except trio.EndOfChannel:
                return
            except Exception as exc:
                self.refused[type(exc).__name__] += 1
                return
            try:
                request = Request.decode(header)
                allowed = self.input_peers if request.part == "inputs" else self.target_peers
                if stream.peer_id not in allowed:
                    raise RemoteProtocolError("not_entitled", f"peer {stream.peer_id} may not fetch {request.part}")
                tensor = self.get(request, stream.peer_id)
            except RemoteProtocolError as exc:
                self.refused[exc.reason] += 1
                return
            parts = encode_tensor_parts(tensor.contiguous(), RAW)
            try:
                await stream.send(bytes(parts[0]), memoryview(parts[1]) if len(parts) == 2 else b"")
            except Exception as exc:  # the client is gone (a replica dropped, say): the others are still served
                self.refused[type(exc).__name__] += 1
                return


class DataClient:
    """Fetches inputs/targets from the owner (one request at a time), or locally on the owner."""

    def __init__(self, *, stream: Stream | None = None, local: DataServer | None = None, timeout_s: float) -> None:
        if (stream is None) == (local is None):
            raise ValueError("a DataClient needs exactly one of stream (remote owner) or local (we are the owner)")
        self._stream = stream
        self._local = local
        self._lock = trio.Lock()
        self.timeout_s = timeout_s

    async def fetch(self, kind: str, index: int, part: str) -> torch.Tensor:
        request = Request(kind, index, part)
        if self._local is not None:
            return self._local.get(request).clone()
        stream = self._stream
        if stream is None:
            raise RuntimeError("DataClient has neither a stream nor a local server (a bug)")
        async with self._lock:
            with trio.fail_after(self.timeout_s):
                await stream.send(request.encode(), b"")
                try:
                    header, payload = await stream.receive()
                except trio.EndOfChannel:
                    raise RuntimeError(
                        f"the job owner refused or dropped the data request {request}; see its log"
                    ) from None
        head = read_tensor_header(header)
        if head.body_offset != len(header):
            raise RemoteProtocolError("bad_tensor_frame", "data frame header length mismatch")
        return decoder_for(head.codec_id)(head.params, payload, head.dtype, head.shape)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


Batch = tuple[torch.Tensor | None, torch.Tensor | None]


class Prefetcher:
    """Fetches ``(inputs or None, targets or None)`` of steps ``[start, stop)`` one step ahead."""

    def __init__(self, client: DataClient | None, inputs: bool, targets: bool, start: int, stop: int) -> None:
        self.client = client
        self.inputs = inputs
        self.targets = targets
        self.start = start
        self.stop = stop
        self._send, self._receive = trio.open_memory_channel[tuple[int, Batch]](1)

    async def run(self) -> None:
        async with self._send:
            for step in range(self.start, self.stop):
                await self._send.send((step, await self._fetch("train", step)))

    async def _fetch(self, kind: str, index: int) -> Batch:
        if self.client is None:
            return None, None
        x = await self.client.fetch(kind, index, "inputs") if self.inputs else None
        y = await self.client.fetch(kind, index, "targets") if self.targets else None
        return x, y

    async def next(self, step: int) -> Batch:
        got, batch = await self._receive.receive()
        if got != step:
            raise RuntimeError(f"prefetcher delivered step {got}, the loop is at step {step} (a bug)")
        return batch

    async def eval_batches(self, count: int) -> list[Batch]:
        return [await self._fetch("eval", i) for i in range(count)]
