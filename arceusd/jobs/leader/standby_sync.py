"""Keeping a standby ready to lead, and the owner's copy of the final checkpoint.

After every commit the leader sends the plan's standby a :class:`protocol.job_wire.StandbySync`: the signed
manifest, the shards to copy from the leader and (once) the data set's files and a stock LM's initial weights
(checked against the signed ``weights_sha256``), so the standby can lead if the leader dies
(:mod:`arceusd.jobs.plans.standby` owns the file side). A leader that is not the job's owner (its standby took over)
sends the owner the final checkpoint the same way, and the owner exports the model too. The bytes travel through
:class:`arceusd.jobs.common.transfers.Transfers`; this module owns who sends what when, the leader's side, and the
standby's word that it holds a step (:class:`protocol.job_wire.StandbyHeld`, :func:`held_refusal`); what the receiver
accepts and copies is :mod:`arceusd.jobs.member.standby_copy`.
:func:`choose_standby` picks the plan member that stands by.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from arceusd.files.checkpoint import MANIFEST_NAME, step_dir
from arceusd.jobs.common.ports import Feed, Leads
from arceusd.jobs.common.transfers import leader_data
from arceusd.jobs.core import leadership
from arceusd.jobs.core.events import FollowsOther
from arceusd.jobs.plans.standby import data_files, offers_to_wire
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
    peers: PeerService
    """The peer network (the standby's and the owner's syncs)."""


class StandbySyncing:
    """The leader's syncs to its standby and to the owner (their receiving ends:
    :mod:`arceusd.jobs.member.standby_copy`)."""

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
