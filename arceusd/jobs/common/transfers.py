"""Files between daemons: chunked serving and fetching of checkpoint shards, resume slices and the data set.

Every file travels the same way: the asker sends a request naming a file and an offset, the holder answers a
:class:`protocol.job_wire.ShardData` with at most :data:`protocol.job_wire.SHARD_CHUNK` bytes of it and its total
size (:func:`serve_chunk`), and :meth:`Transfers.download` asks again until it has the whole file. Who may ask for
what is checked by the holder: a checkpoint shard goes to the job's leader (or an elected newer one) and the
leader's to its standby and the owner; a resume slice to the plan member it was cut for; the data set to the
standby only; a stock LM's initial weights, the tensors of its place to each member of the current plan (the
holder works out the place; :mod:`arceusd.jobs.plans.initial_weights`) and the whole file to the standby. What arrives
is checked before it is kept (against the signed manifest, the resume point, the spec's data digest, or the
signed spec's tensor digests and ``weights_sha256``) and written atomically.

:class:`Transfers` is given exactly what it needs: the peer network to send over, the manager's jobs by id, this
device's peer id (to know which jobs it leads) and the election check for a leader that took over. The job
manager (:mod:`arceusd.jobs.service.manager`) registers its handlers and calls its fetches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from arceusd.base.atomic_files import atomic_write
from arceusd.files.checkpoint import MANIFEST_NAME, SHARD_NAME, ShardRecord, file_matches, matches, step_dir
from arceusd.jobs.plans.initial_weights import (
    Place,
    leader_weights,
    place_layout,
    place_of,
    whole_limit,
    write_parts,
)
from arceusd.jobs.plans.recovery import ResumeError, ResumeFile, check_file
from arceusd.jobs.plans.standby import StandbyError, check_copy, copy_entry, data_files
from arceusd.jobs.record.job import Job
from arceusd.jobs.spec.parsed import resolve_path
from arceusd.models.hf.weights_slice import (
    WeightsSliceError,
    check_slice,
    read_slice,
    slice_file_matches,
    slice_header,
    slice_size,
)
from arceusd.network.peers import PeerService
from arceusd.worker.protocol import ResumeConfig
from protocol.envelope import Header
from protocol.job_wire import (
    SHARD_CHUNK,
    DataRequest,
    JobAck,
    ResumeRequest,
    ShardData,
    ShardRequest,
    StandbySync,
    WeightsRequest,
)

if TYPE_CHECKING:
    from partitioner import ReplicaPlan

log = logging.getLogger(__name__)

ChunkRequest = ShardRequest | ResumeRequest | DataRequest | WeightsRequest
"""A request for one piece of a file another device serves (:meth:`Transfers.download`)."""

MAX_DATA_FILE = 1 << 34
"""A data file the standby copies is checked against the spec's digest once whole; this bounds it until then."""


class Described(Protocol):
    """A file as this device knows it before fetching it: its name and size (a shard record, a resume slice)."""

    @property
    def name(self) -> str: ...
    @property
    def size(self) -> int: ...


class Transfers:
    """Serves this device's files to the peers entitled to them and fetches files from peers."""

    def __init__(
        self, peers: PeerService, jobs: Mapping[str, Job], me: str, elected: Callable[[Job, str], Awaitable[bool]]
    ) -> None:
        self.peers = peers
        self.jobs = jobs
        self.me = me
        self._elected = elected
        self._grown: dict[str, tuple[int, ReplicaPlan]] = {}  # job id -> (epoch, a grown plan its spares start in)
        self.weights_received = 0
        """Bytes of initial weights this device received and kept as a member (chunk digests included)."""
        self.weights_refused = 0
        """Initial-weight slices refused: a tensor, chunk or digest list that did not match the signed spec."""

    def counters(self) -> dict[str, int]:
        """What this device received and refused of its members' initial weights (``status --json``'s
        ``transfers`` section)."""
        return {"weights_received_bytes": self.weights_received, "weights_refused": self.weights_refused}

    def _leads(self, job: Job) -> bool:
        return job.leader == self.me

    def grown(self, job: Job, replica_plan: ReplicaPlan) -> None:
        """Leader: spares start in ``replica_plan`` (a dropped replica rebuilt, :mod:`arceusd.jobs.leader.regrow`) in
        this epoch, before it becomes the job's plan: their places in it may fetch initial weights."""
        self._grown[job.job_id] = (job.epoch, replica_plan)

    def _place(self, job: Job, peer: str) -> Place | None:
        place = place_of(job.replica_plan, peer) if job.replica_plan is not None else None
        epoch, grown = self._grown.get(job.job_id, (-1, None))
        if place is None and epoch == job.epoch and grown is not None:
            place = place_of(grown, peer)
        return place

    # ---------------------------------------------------------------------------------------------- fetching
    async def download(
        self, job: Job, peer: str, address: str, request: Callable[[int], ChunkRequest], limit: int
    ) -> bytes | None:
        """A file of at most ``limit`` bytes in :data:`SHARD_CHUNK` pieces: ``request(offset)`` is the message for
        the next piece. ``limit`` comes from what this device signed or computed (a manifest record, the plan's
        share, a resume record), never from the sender: a larger total is refused before the first byte is kept."""
        data = bytearray()
        for _ in range(10_000):
            reply = await self.peers.request(address, peer, request(len(data)), timeout=60.0, job_id=job.job_id)
            if not isinstance(reply, ShardData) or not 0 <= reply.total <= limit:
                if isinstance(reply, ShardData):
                    log.warning(
                        "job %s: %s offered %d bytes where at most %d are expected; refused",
                        job.job_id,
                        peer[:12],
                        reply.total,
                        limit,
                    )
                return None
            data += reply.data
            if len(data) > limit:
                return None
            if len(data) >= reply.total or not reply.data:
                break
        return bytes(data)

    async def fetch_shard(self, job: Job, peer: str, step: int, record: Described) -> bytes | None:
        """Shard ``record`` (its name derived from the plan or signed in a manifest; at most its size) of
        ``step`` from ``peer``."""
        offer = job.members.get(peer)
        if offer is None:
            return None
        name = record.name
        return await self.download(
            job, peer, offer.address, lambda offset: ShardRequest(job.job_id, step, name, offset), record.size
        )

    async def fetch_resume(self, job: Job, leader: str, step: int, mine: ResumeFile) -> ResumeConfig:
        """Download this device's resume slice from the leader, check it, store it; its ResumeConfig."""
        data = await self.download(
            job,
            leader,
            job.leader_address,
            lambda offset: ResumeRequest(job.job_id, job.epoch, mine.name, offset),
            int(mine.size),
        )
        if data is None:
            raise ResumeError("the leader did not serve it")
        check_file(data, mine)
        path = job.paths.resume(job.epoch) / mine.name
        await trio.to_thread.run_sync(atomic_write, path, data)
        return ResumeConfig(step, str(path), None)

    async def fetch_weights(self, job: Job, leader: str, place: Place) -> Path:
        """Download this device's slice of the job's initial weights (the tensors the blocks of ``place`` are
        built from; a tensor-parallel rank's shards of the split ones) from the leader, check every tensor (every
        chunk) against the signed spec's digests and keep it as this device's own safetensors file (a whole-tensor
        file kept from an earlier plan of the same place is checked and used again); its path.
        :class:`WeightsSliceError` (one line) when the leader serves anything else; counted in
        ``weights_refused``."""
        layout = await trio.to_thread.run_sync(place_layout, job.spec.model, place)
        path = job.paths.weights_slice(place.start, place.end)
        if not await trio.to_thread.run_sync(slice_file_matches, path, layout):
            data = await self.download(
                job,
                leader,
                job.leader_address,
                lambda offset: WeightsRequest(job.job_id, job.epoch, offset),
                slice_size(layout),
            )
            if data is None:
                raise WeightsSliceError("the leader did not serve this device's initial weights")
            try:
                kept = await trio.to_thread.run_sync(check_slice, data, layout, f"the leader {leader[:12]}")
            except WeightsSliceError:
                self.weights_refused += 1
                raise
            await trio.to_thread.run_sync(write_parts, path, (slice_header(layout), *kept))
            self.weights_received += len(data)
            log.info(
                "job %s: received %d bytes of initial weights for blocks [%d, %d)%s; keeping %d bytes of tensors",
                job.job_id,
                len(data),
                place.start,
                place.end,
                f" as tensor-parallel rank {place.split[2]}" if place.split is not None else "",
                sum(e.kept_nbytes for e in layout),
            )
        for old in path.parent.glob("blocks-*.safetensors"):  # one place at a time: the others are stale
            if old != path:
                old.unlink(missing_ok=True)
        return path

    async def copy_weights(self, job: Job, leader: str) -> bool:
        """Standby: download the leader's whole weights file and check it against the spec's ``weights_sha256``
        (what it serves and reads if it takes over); a copy that does not match is never kept. The file goes to
        disk chunk by chunk, hashed as it arrives: the daemon never holds the whole model in memory."""
        path, limit = job.paths.weights_copy, whole_limit(job.spec.model)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        digest, size, total = hashlib.sha256(), 0, -1
        try:
            with tmp.open("wb") as fh:
                while size != total:
                    reply = await self.peers.request(
                        job.leader_address,
                        leader,
                        WeightsRequest(job.job_id, job.epoch, size, whole=True),
                        timeout=60.0,
                        job_id=job.job_id,
                    )
                    if (
                        not isinstance(reply, ShardData)
                        or not 0 <= reply.total <= limit
                        or total not in (-1, reply.total)
                    ):
                        break
                    if not reply.data or size + len(reply.data) > reply.total:
                        break
                    total = reply.total
                    digest.update(reply.data)
                    size += len(reply.data)
                    await trio.to_thread.run_sync(fh.write, reply.data)
                await trio.to_thread.run_sync(os.fsync, fh.fileno())
            if size == total and digest.hexdigest() == getattr(job.spec.model, "weights_sha256", None):
                os.replace(tmp, path)
                log.info("job %s: holding a checked copy of the initial weights as the standby", job.job_id)
                return True
        finally:
            tmp.unlink(missing_ok=True)
        log.warning("job %s: the leader's initial weights did not arrive intact; not standing by", job.job_id)
        return False

    async def copy_step(
        self, job: Job, leader: str, msg: StandbySync, records: Mapping[str, ShardRecord]
    ) -> str | None:
        """Copy the leader's shards ``msg.shards`` of step ``msg.step`` (each checked against its manifest record;
        one already here and intact is kept), then the manifest, last: the step is complete here only when all
        of it is. Returns the name of a shard that did not arrive intact (nothing more is written then)."""
        folder = step_dir(job.paths.checkpoints, msg.step)
        for name in msg.shards:
            if await trio.to_thread.run_sync(file_matches, folder / name, records[name]):
                continue

            def piece(offset: int, n: str = name) -> ShardRequest:
                return ShardRequest(job.job_id, msg.step, n, offset)

            data = await self.download(job, leader, job.leader_address, piece, records[name].size)
            if data is None or not matches(data, records[name]):
                return name
            await trio.to_thread.run_sync(atomic_write, folder / name, data)
        await trio.to_thread.run_sync(atomic_write, folder / MANIFEST_NAME, msg.manifest)
        return None

    async def copy_data(self, job: Job, leader: str, names: tuple[str, ...]) -> bool:
        """Standby: download the leader's data files and check them against the spec's digest; a copy that
        does not arrive whole or does not match is removed, never kept half-written."""
        folder = job.paths.data
        for index, name in enumerate(names):

            def data_piece(offset: int, i: int = index) -> DataRequest:
                return DataRequest(job.job_id, i, offset)

            data = await self.download(job, leader, job.leader_address, data_piece, MAX_DATA_FILE)
            if data is None:
                log.warning("job %s: the leader did not serve data file %s", job.job_id, name)
                break
            await trio.to_thread.run_sync(atomic_write, folder / name, data)
        else:
            entry = copy_entry(job.directory, json.loads(job.spec_bytes)["data"], names)
            try:
                tokenizer_sha256 = getattr(job.spec.data, "tokenizer_sha256", None)  # (a tokens data set)
                await trio.to_thread.run_sync(check_copy, entry, job.spec.data.sha256, tokenizer_sha256)
                job.standby_data = entry
                log.info("job %s: holding a checked copy of the data as the standby", job.job_id)
                return True
            except StandbyError as exc:
                log.warning("job %s: %s", job.job_id, exc)
        await trio.to_thread.run_sync(lambda: shutil.rmtree(folder, ignore_errors=True))
        return False

    # ---------------------------------------------------------------------------------------------- serving
    async def on_shard_request(self, header: Header, msg: ShardRequest) -> ShardData | JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None:
            return JobAck(False, "unknown job")
        to_standby = self._leads(job) and header.sender in (job.standby, job.owner)  # the owner: its model
        if not to_standby and header.sender != job.leader and not await self._elected(job, header.sender):
            return JobAck(False, "shards go to the job's leader (and the leader's to its standby) only")
        if not SHARD_NAME.match(msg.name):
            return JobAck(False, "bad shard name")
        return serve_chunk(step_dir(job.paths.checkpoints, msg.step) / msg.name, msg.offset)

    async def on_resume_request(self, header: Header, msg: ResumeRequest) -> ShardData | JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job):
            return JobAck(False, "not the leader of that job")
        if msg.epoch != job.epoch or job.leading.loop.resume_files.get(header.sender) != msg.name:
            return JobAck(False, "that resume slice is not this device's in the current plan")
        return serve_chunk(job.paths.resume(msg.epoch) / msg.name, msg.offset)

    async def on_weights_request(self, header: Header, msg: WeightsRequest) -> ShardData | JobAck:
        """A plan member's place's initial weights (the holder works out the place from its own plan; the
        sender names only an offset), or the whole file to the standby."""
        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job):
            return JobAck(False, "not the leader of that job")
        path = job_weights(job)
        if path is None:
            return JobAck(False, "this device holds no initial weights of that job")
        if msg.whole:
            if header.sender != job.standby:
                return JobAck(False, "the whole weights file goes to the job's standby only")
            return serve_chunk(path, msg.offset)
        place = self._place(job, header.sender)
        if msg.epoch != job.epoch or place is None or msg.offset < 0:
            return JobAck(False, "that device has no place in the current plan")
        try:
            layout = await trio.to_thread.run_sync(place_layout, job.spec.model, place)
            data = await trio.to_thread.run_sync(read_slice, path, layout, msg.offset, SHARD_CHUNK)
        except (OSError, WeightsSliceError) as exc:
            log.warning("job %s: cannot serve initial weights: %s", job.job_id, exc)
            return JobAck(False, "the initial weights cannot be read here")
        return ShardData(slice_size(layout), data)

    async def on_data_request(self, header: Header, msg: DataRequest) -> ShardData | JobAck:
        job = self.jobs.get(msg.job_id)
        if job is None or not self._leads(job) or header.sender != job.standby:
            return JobAck(False, "the data goes to the job's standby only")
        files = data_files(leader_data(job))
        if not 0 <= msg.index < len(files):
            return JobAck(False, "no such data file")
        return serve_chunk(files[msg.index], msg.offset)


def job_weights(job: Job) -> Path | None:
    """The whole initial-weights file this device holds for ``job`` as its leader (the owner's, or the
    standby's checked copy), or None."""
    return leader_weights(job.directory, job.role == "owner", job.spec.model, job.spec.base_dir)


def leader_data(job: Job) -> dict[str, Any]:
    """The data entry of the leader's worker (it serves the batches): on the owner the spec's files with
    absolute paths (the spec's are relative to its file), on a standby that took over its checked copy."""
    if job.role != "owner":  # a Role (a str enum)
        if job.standby_data is None:
            raise RuntimeError("this device leads the job without a checked copy of its data (a bug)")
        return dict(job.standby_data)
    out = dict(json.loads(job.spec_bytes)["data"])
    for key in ("dir", "path", "tokenizer"):
        if isinstance(out.get(key), str):
            out[key] = str(resolve_path(out[key], job.spec.base_dir).resolve())
    return out


def serve_chunk(path: Path, offset: int) -> ShardData | JobAck:
    """The piece of ``path`` from ``offset`` (at most :data:`SHARD_CHUNK` bytes) with the file's size."""
    try:
        with path.open("rb") as fh:
            total = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return ShardData(total, fh.read(SHARD_CHUNK))
    except OSError:
        return JobAck(False, "no such file")


__all__ = ["Transfers", "job_weights", "leader_data", "serve_chunk"]
