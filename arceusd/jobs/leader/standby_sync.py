"""Keeping a standby ready to lead, and the owner's copy of the final checkpoint.

After every commit the leader sends the plan's standby a :class:`protocol.job_wire.StandbySync`: the signed
manifest, the shards to copy from the leader and (once) the data set's files and a stock LM's initial weights
(checked against the signed ``weights_sha256``), so the standby can lead if the leader dies
(:mod:`arceusd.jobs.plans.standby` owns the file side). A leader that is not the job's owner (its standby took over)
sends the owner the final checkpoint the same way, and the owner exports the model too. The bytes travel through
:class:`arceusd.jobs.common.transfers.Transfers`; this module owns who sends what when, and what the receiver accepts.
:func:`choose_standby` picks the plan member that stands by.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from arceusd.files.checkpoint import MANIFEST_NAME, CheckpointError, Manifest, parse_manifest, prune, step_dir
from arceusd.jobs.common.ports import CheckLeader, Feed, Leads, Spawn
from arceusd.jobs.common.transfers import Transfers, leader_data
from arceusd.jobs.core import Role, leadership
from arceusd.jobs.core.events import FollowsOther, StandbyCommitted
from arceusd.jobs.plans.initial_weights import standby_copies
from arceusd.jobs.plans.standby import StandbyError, check_names, data_files, offers_from_wire, offers_to_wire
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import JobAck, StandbyHeld, StandbySync

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StandbySyncingPorts:
    """What :class:`StandbySyncing` uses, built by the composition root (issue 32: a port, not the manager)."""

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
    peers: PeerService
    """The peer network (the standby's and the owner's syncs)."""
    transfers: Transfers
    """Copies of a step's shards, the data and the initial weights, from the leader."""


class StandbySyncing:
    """The leader's syncs to its standby and to the owner, and their receiving ends."""

    def __init__(self, ports: StandbySyncingPorts) -> None:
        self.ports = ports

    async def sync_standby(self, job: Job, step: int, shards: tuple[str, ...]) -> None:
        """Leader: tell the standby that ``step`` is committed (the signed manifest), the shards to copy from us
        (every one but its own: then each shard has three copies, its writer's, ours and the standby's), and the
        data set's files, so it can lead if we die."""
        standby = job.standby
        offer = job.members.get(standby)
        if not standby or offer is None:
            return
        manifest = await trio.to_thread.run_sync((step_dir(job.paths.checkpoints, step) / MANIFEST_NAME).read_bytes)
        names = tuple(p.name for p in data_files(leader_data(job)))
        offers = offers_to_wire(job.members[p] for p in sorted(job.members))  # the plan's and its spares
        sync = StandbySync(job.job_id, step, manifest, shards, names, offers)
        reply = await self.ports.peers.request(
            offer.address, standby, sync, timeout=10.0, job_id=job.job_id, term=job.term, epoch=job.epoch
        )
        if not (isinstance(reply, JobAck) and reply.ok):
            log.warning(
                "job %s: the standby %s refused checkpoint %d: %s",
                job.job_id,
                standby[:12],
                step,
                getattr(reply, "reason", "no answer"),
            )
            leader = leadership.followed_leader(reply.follows) if isinstance(reply, JobAck) else None
            if leader is not None and leader != self.ports.me:
                self.ports.feed(job, FollowsOther(leader, standby))  # with most of the job saying so: hand over

    async def on_standby_held(self, header: Header, msg: StandbyHeld) -> JobAck:
        """Leader: the standby says it holds committed checkpoint ``msg.step`` (its copies checked); kept as the
        newest such step of that standby (``job.leading.commits.standby_held``), what ``status`` calls ready."""
        job = self.ports.jobs.get(msg.job_id)
        if job is None or not self.ports.leads(job):
            return JobAck(False, "not the leader of that job")
        why = held_refusal(job, header.sender, msg.step)
        if why:
            return JobAck(False, why)
        held = job.leading.commits.standby_held
        if held is None or held[0] != header.sender or held[1] < msg.step:
            job.leading.commits.standby_held = (header.sender, msg.step)
        return JobAck(True)

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

    async def sync_owner(self, job: Job, step: int, names: list[str]) -> None:
        """A leader that is not the job's owner (its standby took over): hand the owner, when it joined this
        leader, the final checkpoint (the signed manifest and its shards' names) before exporting, so the model
        lands on the owner's disk as well. The owner copies, checks and exports before it answers; a failure
        only costs the owner its copy (the model is still saved here)."""
        offer = job.members.get(job.owner)
        if job.owner == self.ports.me or offer is None:
            return
        manifest = await trio.to_thread.run_sync((step_dir(job.paths.checkpoints, step) / MANIFEST_NAME).read_bytes)
        sync = StandbySync(job.job_id, step, manifest, tuple(names))
        reply = await self.ports.peers.request(
            offer.address, job.owner, sync, timeout=60.0, job_id=job.job_id, term=job.term, epoch=job.epoch
        )
        if not (isinstance(reply, JobAck) and reply.ok):
            log.warning(
                "job %s: the owner %s did not take the final checkpoint: %s",
                job.job_id,
                job.owner[:12],
                getattr(reply, "reason", "no answer"),
            )

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
        """Standby: tell the leader that committed ``step`` is held here (:meth:`on_standby_held`); without an
        answer it only shows "syncing" a commit longer."""
        if job.leader != leader:
            return
        reply = await self.ports.peers.request(
            job.leader_address, leader, StandbyHeld(job.job_id, step), timeout=10.0, job_id=job.job_id, term=job.term
        )
        if not (isinstance(reply, JobAck) and reply.ok):
            log.info(
                "job %s: the leader did not take step %d as held: %s", job.job_id, step, getattr(reply, "reason", "")
            )


def held_refusal(job: Job, sender: str, step: int) -> str:
    """Why the leader does not take ``sender``'s word that it holds checkpoint ``step`` ("" when it does): only
    the job's standby, of a step this leader committed."""
    if sender != job.standby:
        return "that device is not the job's standby"
    if not 0 < step <= job.committed_step:
        return f"step {step} is not a checkpoint this leader committed (the last is {job.committed_step})"
    return ""


def plan_memory(job: Job) -> dict[str, int]:
    """The bytes the current plan uses on each of its devices (the partitioner's predicted peak: what its worker
    holds while it runs; every replica's devices)."""
    plans = job.replica_plan.replicas if job.replica_plan is not None else (job.plan,) if job.plan else ()
    return {str(p): int(b) for the_plan in plans for p, b in getattr(the_plan, "memory_bytes", ())}


def choose_standby(job: Job, me: str) -> str:
    """The plan member that stands by to lead (and receives the owner's data set): the one whose memory the plan
    uses most (what it can show: its worker holds that much to run; never what it offered, issue #29 item 7: an
    offer of 8 TiB made a member the standby), ties to the smaller offer, then the lowest id; among those whose
    speed was measured in the job (its step times reported, or its speed challenge passed) when there are any,
    never one that was discounted or failed its challenge while another can stand by (issue #19: claims alone
    do not make a standby)."""
    others = [p for p in job.planned_peers() if p != me and p in job.members]  # (before the core takes the plan)
    timed = job.leading.speed.timed
    passed = {p for p, t in timed.items() if not t.why}
    others = [p for p in others if p not in job.leading.speed.discounts and not (p in timed and timed[p].why)] or others
    others = [p for p in others if p in job.leading.speed.measured or p in passed] or others
    if not others:
        return ""
    used = plan_memory(job)

    def shown(p: str) -> int:
        return min(used.get(p, 0), job.members[p].memory_bytes)

    return str(min(others, key=lambda p: (-shown(p), job.members[p].memory_bytes, p)))


__all__ = ["StandbySyncing", "choose_standby", "held_refusal", "plan_memory"]
