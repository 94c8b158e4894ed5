"""The receiving ends of the leader's syncs (:mod:`arceusd.jobs.leader.standby_sync` sends them): the standby's copy
of each committed checkpoint, and the owner's copy of the final one.

A :class:`protocol.job_wire.StandbySync` is taken only from the job's leader (its term; any epoch). On the plan's
standby it names the signed manifest of a committed step, the shards to copy from the leader and (once) the data
set's files and a stock LM's initial weights: each is checked before it is kept (the data's names against the spec,
the weights against the signed ``weights_sha256``, every shard against the manifest), the manifest written last;
once the standby holds the data (and weights) it stands second in the job's election, and once a step is held it
tells the leader (:class:`protocol.job_wire.StandbyHeld`: what the leader's ``status`` calls ready). On an owner
that handed its job over (:meth:`arceusd.jobs.leader.joining.Joining.hand_over`) it is the final checkpoint: copied,
checked, and the model exported here too before the answer. The bytes travel through
:class:`arceusd.jobs.common.transfers.Transfers`; the files' side is :mod:`arceusd.jobs.plans.standby`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from arceusd.files.checkpoint import CheckpointError, Manifest, parse_manifest, prune, step_dir
from arceusd.jobs.common.ports import CheckLeader, Feed, Leads, Spawn
from arceusd.jobs.common.transfers import Transfers
from arceusd.jobs.core import Role
from arceusd.jobs.core.events import StandbyCommitted
from arceusd.jobs.plans.initial_weights import standby_copies
from arceusd.jobs.plans.standby import StandbyError, check_names, offers_from_wire
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import JobAck, StandbyHeld, StandbySync

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StandbyCopiesPorts:
    """What :class:`StandbyCopies` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: Mapping[str, Job]
    """The jobs this daemon holds, by id."""
    feed: Feed
    leads: Leads
    spawn: Spawn
    check_leader: CheckLeader
    export: Callable[[Job, int, list[Path]], Awaitable[None]]
    """The model assembled from a step's shards and the job finished (the driver's export)."""
    standby_ready: Callable[[Job], None]
    """The standby's copies are checked: it stands second in the job's election."""
    transfers: Transfers
    """Copies of a step's shards, the data and the initial weights, from the leader."""
    peers: PeerService
    """The peer network (the standby tells the leader which step it holds)."""


class StandbyCopies:
    """The standby's and the owner's side of the leader's syncs (see the module docstring)."""

    def __init__(self, ports: StandbyCopiesPorts) -> None:
        self.ports = ports

    async def on_standby_sync(self, header: Header, msg: StandbySync) -> JobAck:
        job = self.ports.jobs.get(msg.job_id)
        if job is None:
            return JobAck(False, "unknown job")
        why = await self.ports.check_leader(header, job, epochs=False)
        if why is not None:
            return JobAck(False, why.reason, why.follows)
        if job.role == Role.OWNER and not self.ports.leads(job):
            return await self._receive_final(job, header.sender, msg)
        if job.standby != self.ports.me:
            return JobAck(False, "this device is not the job's standby")
        try:
            manifest, _ = parse_manifest(msg.manifest, sorted(job.leaders), "the leader's manifest")
            if manifest.job_id != job.job_id or manifest.step != msg.step:
                raise CheckpointError("the manifest is for another job or step")
            if not set(msg.shards) <= {r.name for r in manifest.shards}:
                raise CheckpointError("the sync names shards the manifest does not list")
            if job.standby_data is None:
                check_names(job.spec.data.kind, msg.data_files)
            offers = offers_from_wire(msg.offers, job.plan_peers(), job.told_members)
        except (CheckpointError, StandbyError) as exc:
            log.warning("job %s: refusing a standby sync: %s", job.job_id, exc)
            return JobAck(False, f"refused: {exc}")
        job.standby_offers = offers
        self.ports.spawn(self._standby_copy, job, header.sender, msg, manifest)
        return JobAck(True)

    async def _receive_final(self, job: Job, leader: str, msg: StandbySync) -> JobAck:
        """Owner that handed its job over: copy the final checkpoint from the leader, check every shard against
        the leader's signed manifest, and export the model here (the answer says whether that worked)."""
        try:
            manifest, _ = parse_manifest(msg.manifest, sorted(job.leaders), "the leader's manifest")
            if manifest.job_id != job.job_id or manifest.step != msg.step or msg.step < job.total_steps:
                raise CheckpointError("the owner takes the final checkpoint of its own job only")
            if set(msg.shards) != {r.name for r in manifest.shards}:
                raise CheckpointError("the sync must name exactly the manifest's shards")
        except CheckpointError as exc:
            log.warning("job %s: refusing the final checkpoint: %s", job.job_id, exc)
            return JobAck(False, f"refused: {exc}")
        folder = step_dir(job.paths.checkpoints, msg.step)
        async with job.sync_lock:
            failed = await self.ports.transfers.copy_step(job, leader, msg, {r.name: r for r in manifest.shards})
            if failed is not None:
                return JobAck(False, f"shard {failed} of step {msg.step} did not arrive intact")
            self.ports.feed(job, StandbyCommitted(msg.step))
            if not job.model_path:  # "" until exported (a repeated sync exports once)
                await self.ports.export(job, msg.step, [folder / r.name for r in manifest.shards])
        return JobAck(bool(job.model_path), job.error[:400])

    async def _standby_copy(self, job: Job, leader: str, msg: StandbySync, manifest: Manifest) -> None:
        """Standby: copy the data and the initial weights (once) and the leader's shards of a committed step;
        each is checked before it is kept; the manifest is written last, so a step is complete here only when all
        of it is."""
        async with job.sync_lock:
            data_missing = job.standby_data is None and bool(msg.data_files)
            if data_missing and not await self.ports.transfers.copy_data(job, leader, msg.data_files):
                return
            weights_missing = standby_copies(job.spec.model) and not job.paths.weights_copy.is_file()
            if weights_missing and not await self.ports.transfers.copy_weights(job, leader):
                return
            if data_missing or weights_missing:  # it may lead now: it stands in the job's election
                self.ports.standby_ready(job)
            failed = await self.ports.transfers.copy_step(job, leader, msg, {r.name: r for r in manifest.shards})
            if failed is not None:
                log.warning(
                    "job %s: the leader's shard %s of step %d did not arrive intact", job.job_id, failed, msg.step
                )
                return
            await trio.to_thread.run_sync(prune, job.paths.checkpoints, job.spec.checkpoint.keep)
            self.ports.feed(job, StandbyCommitted(msg.step))
        self.ports.spawn(self._tell_held, job, leader, msg.step)

    async def _tell_held(self, job: Job, leader: str, step: int) -> None:
        """Standby: tell the leader that committed ``step`` is held here
        (:meth:`arceusd.jobs.leader.standby_sync.StandbySyncing.on_standby_held`); without an answer it only shows
        "syncing" a commit longer."""
        if job.leader != leader:
            return
        reply = await self.ports.peers.request(
            job.leader_address, leader, StandbyHeld(job.job_id, step), timeout=10.0, job_id=job.job_id, term=job.term
        )
        if not (isinstance(reply, JobAck) and reply.ok):
            log.info(
                "job %s: the leader did not take step %d as held: %s", job.job_id, step, getattr(reply, "reason", "")
            )


__all__ = ["StandbyCopies", "StandbyCopiesPorts"]
