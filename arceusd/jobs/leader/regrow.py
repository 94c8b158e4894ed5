"""Rebuilding a dropped data-parallel replica on spare members while the replicas left hold (issue 22).

When a replica is dropped and idle members could take its place, the job core asks the replicas left to hold after
a checkpoint step (:func:`arceusd.jobs.leader.replica_drop.hold_step`); once that checkpoint is committed it answers
:class:`arceusd.jobs.core.actions.Regrow`, which :meth:`Regrowing.regrow` carries out on the leader's loop:

1. spare members (alive, else suspected: never one declared dead; not excluded, in the plan nowhere) take the
   places of the first replica's devices (:func:`partitioner.replicas.with_devices`: the same cuts) in a free slot
   (a share of each batch);
2. each gets a ``JobStart`` with the grown plan and :class:`~arceusd.jobs.plans.grow_start.GrowStart` (its slot,
   the slots, the shares, the ring generation), and as its resume file the committed shard of its place (the
   state every replica holds alike at that step); it checks the plan
   (:func:`arceusd.jobs.plans.planning.verify_grown_start`) and starts its worker there;
3. ``go`` to the new workers, then :class:`protocol.job_wire.JobGrowReplica` to every device left (and this
   device's worker): each checks it against its own plan
   (:meth:`arceusd.jobs.member.replica_changes.ReplicaChanges.on_grow`; the leader for itself:
   :func:`arceusd.jobs.common.replica_change.grow_here`) and tells its worker, which grows its ring and goes on.
   The core takes the replica back (``Regrown``).

Anything failing on the way (too few spares, a refused start, no ``go``) stops the new workers and releases the
hold (``release``: the replicas left go on without it), and the core hears ``RegrowFailed``. No worker of the
replicas left restarts, and nothing committed is run again.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from arceusd.files.checkpoint import CheckpointError, read_manifest, step_dir
from arceusd.jobs.common.ports import Feed
from arceusd.jobs.common.replica_change import go_on, grow_here, grown_plan
from arceusd.jobs.core import actions, events
from arceusd.jobs.plans.grow_start import GrowStart
from arceusd.jobs.plans.recovery import ResumeFile, ResumePoint, file_name
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from partitioner import inputs_bytes, replica_plan_bytes
from partitioner.replicas import ReplicaPlan
from protocol.job_wire import JobAck, JobGo, JobGrowReplica, JobStart, JobStartReply, JobStop, PeerAddress

log = logging.getLogger(__name__)

GROW_TIMEOUT_S = 10.0
"""How long the leader waits for a device left to acknowledge the rebuilt replica."""


class RegrowError(Exception):
    """The dropped replica cannot be rebuilt now (the message says why); the replicas left go on without it."""


def _resume_files(job: Job, step: int, plan: ReplicaPlan, position: int) -> dict[str, ResumeFile]:
    """The committed shard of each place, linked (or copied) for the new replica's device there, described by the
    step's signed manifest (what we signed, not read again; blocking: a thread). ``RegrowError`` when the step's
    manifest does not verify or lacks a shard."""
    folder = step_dir(job.paths.checkpoints, step)
    try:
        manifest, _ = read_manifest(folder, sorted(job.leaders))
    except CheckpointError as exc:
        raise RegrowError(f"checkpoint {step}: {exc}") from None
    records = {r.name: r for r in manifest.shards}
    target = job.paths.resume(job.epoch)
    target.mkdir(parents=True, exist_ok=True)
    out = {}
    for s, stage in enumerate(plan.replicas[position].stages):
        for r, share in enumerate(stage.shares):
            record = records.get(file_name(s, r))
            if record is None:
                raise RegrowError(f"checkpoint {step} has no shard of stage {s} rank {r}")
            name = f"grow-{step}-{record.name}"
            (target / name).unlink(missing_ok=True)
            try:
                os.link(folder / record.name, target / name)
            except OSError:  # another file system, or links not allowed there
                shutil.copyfile(folder / record.name, target / name)
            out[share.peer_id] = ResumeFile(name, record.sha256, record.size)
    return out


@dataclass(frozen=True)
class RegrowingPorts:
    """What :class:`Regrowing` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    feed: Feed
    peers: PeerService
    """The peer network (the spares that answer; starts, ``go`` and the grown plan told)."""
    grown: Callable[[Job, ReplicaPlan], None]
    """The grown plan's places served their base weights from here (``Transfers.grown``)."""
    send_go: Callable[[Job, JobGo, list[str], dict[str, str]], Awaitable[dict[str, str]]]
    """``go`` sent in plan order; the devices that did not acknowledge it, with why (``Starting.send_go``)."""


class Regrowing:
    """The leader's side of a replica's rebuild (see the module docstring; a member's:
    :mod:`arceusd.jobs.member.replica_changes`)."""

    def __init__(self, ports: RegrowingPorts) -> None:
        self.ports = ports

    async def regrow(self, job: Job, action: actions.Regrow) -> None:
        """The core's ``Regrow`` (the leader's loop): rebuild, or release the hold; feed back what came of it."""
        try:
            _, devices = await self._rebuild(job, action)
        except RegrowError as exc:
            log.warning("job %s: the dropped replica is not rebuilt: %s", job.job_id, exc)
            await self.release(job)
            self.ports.feed(job, events.RegrowFailed(action.stamp, str(exc)))
            return
        log.info(
            "job %s: the dropped replica was rebuilt on %s from step %d",
            job.job_id,
            ", ".join(p[:12] for p in devices),
            action.step,
        )

    async def _rebuild(self, job: Job, action: actions.Regrow) -> tuple[int, tuple[str, ...]]:
        plan, inputs = job.replica_plan, job.inputs
        if plan is None or inputs is None or job.core.stamp != action.stamp:
            raise RegrowError("the plan changed")
        slots, shares = job.slots(), job.data_shares or len(job.slots())
        free = sorted(set(range(shares)) - set(slots))
        me = self.ports.me  # (its worker serves the data: not a spare, even when retired)
        # the alive first, then suspects (a loaded member is often suspected for a moment: it answers the start
        # or is refused like any other)
        spares = [
            p
            for p in self.ports.peers.answering_peers()
            if p in job.members and p not in plan.peer_ids and p != me and p not in job.leading.checks.excluded
        ]
        need = len(plan.replicas[0].peer_ids)
        if not free or len(spares) < need:
            raise RegrowError(f"{len(spares)} spare member(s) answer; a replica needs {need}")
        slot, devices = free[0], tuple(spares[:need])
        grown, position = grown_plan(plan, slots, slot, devices)
        grow = GrowStart(slot, tuple(sorted((*slots, slot))), shares, job.ring_generation + 1)
        files = await trio.to_thread.run_sync(_resume_files, job, action.step, grown, position)
        job.leading.loop.resume_files.update({p: f.name for p, f in files.items()})
        self.ports.grown(job, grown)  # a LoRA job's spares fetch their place's base weights from us
        start = JobStart(
            job.job_id,
            job.term,
            job.epoch,
            job.spec_bytes,
            replica_plan_bytes(grown),
            inputs_bytes(inputs),
            action.step,
            ResumePoint(action.step, files).to_wire(),
            job.standby,
            grow.to_wire(),
            tuple(sorted(job.members)),
        )
        addresses: dict[str, str] = {}
        refused: list[str] = []

        async def start_one(peer: str) -> None:
            got = await self.ports.peers.request(
                job.members[peer].address, peer, start, timeout=240.0, job_id=job.job_id, term=job.term, epoch=job.epoch
            )
            if isinstance(got, JobStartReply) and got.accepted:
                addresses[peer] = got.worker_address
            else:
                refused.append(f"{peer[:12]}: {got.reason if isinstance(got, JobStartReply) else 'no answer'}")

        async with trio.open_nursery() as nursery:
            for peer in devices:
                nursery.start_soon(start_one, peer)
        if refused or job.core.stamp != action.stamp:
            await self._stop(job, list(addresses))
            raise RegrowError("; ".join(refused) or "the plan changed")
        job.leading.loop.go_addresses.update(addresses)
        go = JobGo(
            job.job_id,
            job.term,
            job.epoch,
            tuple(PeerAddress(p, a) for p, a in sorted(job.leading.loop.go_addresses.items())),
        )
        unacknowledged = await self.ports.send_go(job, go, list(devices), {p: job.members[p].address for p in devices})
        if unacknowledged:
            await self._stop(job, list(devices))
            raise RegrowError(f"go not acknowledged by {', '.join(p[:12] for p in unacknowledged)}")
        message = JobGrowReplica(
            job.job_id,
            action.step,
            slot,
            grow.generation,
            devices,
            tuple(PeerAddress(p, addresses[p]) for p in devices),
        )
        left = [p for p in plan.peer_ids if p != self.ports.me]
        await grow_here(job, message)
        # the core takes the replica back now, before the others are told: the plan's devices (the core's) hold
        # the rebuilt replica as soon as its workers may report
        self.ports.feed(job, events.Regrown(action.stamp, position, devices))
        async with trio.open_nursery() as nursery:
            for peer in left:
                nursery.start_soon(self._send, job, peer, message)
        return position, devices

    async def release(self, job: Job) -> None:
        """No rebuild: the replicas left (and this device's worker) go on."""
        message = JobGrowReplica(job.job_id, 0, release=True)
        await go_on(job)
        plan = job.replica_plan
        if plan is None:
            return
        async with trio.open_nursery() as nursery:
            for peer in plan.peer_ids:
                if peer != self.ports.me:
                    nursery.start_soon(self._send, job, peer, message)

    async def _send(self, job: Job, peer: str, message: JobGrowReplica) -> None:
        offer = job.members.get(peer)
        if offer is None:
            return
        answer = await self.ports.peers.request(
            offer.address, peer, message, timeout=GROW_TIMEOUT_S, job_id=job.job_id, term=job.term, epoch=job.epoch
        )
        if not isinstance(answer, JobAck) or not answer.ok:
            why = answer.reason if isinstance(answer, JobAck) else "no answer"
            log.warning("job %s: %s did not take the rebuilt replica: %s", job.job_id, peer[:12], why[:200])

    async def _stop(self, job: Job, peers: list[str]) -> None:
        stop = JobStop(job.job_id, job.term, "replanning")
        for peer in peers:
            offer = job.members.get(peer)
            if offer is not None:
                await self.ports.peers.request(
                    offer.address, peer, stop, timeout=GROW_TIMEOUT_S, job_id=job.job_id, term=job.term, epoch=job.epoch
                )


__all__ = ["GROW_TIMEOUT_S", "RegrowError", "Regrowing", "RegrowingPorts"]
