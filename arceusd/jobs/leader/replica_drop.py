"""Dropping a data-parallel replica whose device is gone, so that the other replicas train on (issue 22).

The job core decides (``JobCore._lose`` answers :class:`arceusd.jobs.core.actions.DropReplica`: one replica per
checkpoint interval, never the leader's); this module is the I/O on both sides:

- the leader (:meth:`ReplicaDrops.drop`): the plan without that replica (:func:`dropped_plan`; the first replica
  left writes the shards from now on), reports of steps not yet committed from devices no longer in the plan
  forgotten, the devices left told (:class:`protocol.job_wire.JobDropReplica`, stamped with the plan's term and
  epoch) and this device's worker (its ``drop_replica`` command). The dropped replica's devices are stopped by
  the core's ``StopWorkers``; they stay members and get work again at the next checkpoint (a rebalance).
- a member (:meth:`ReplicaDrops.on_drop`): the command is checked before it is used: from the job's leader in
  the plan's term and epoch, a replica count equal to its own plan's (a repeated or stale drop does not fit),
  an index in range, not its own replica; then the same plan change and its worker's command.

Each side records the drop (:class:`arceusd.jobs.record.job.ReplicaDrop`), shown by ``arceusd status JOB``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import trio

from arceusd.jobs.common.ports import Commanded, Feed, RequestRestart, Spawn
from arceusd.jobs.core import actions, events
from arceusd.jobs.plans.planning import replica_flops_shares
from arceusd.jobs.procs.supervisor import WorkerFailed
from arceusd.jobs.record.job import Job, ReplicaDrop
from arceusd.network.peers import PeerService
from partitioner.replicas import ReplicaPlan, ReplicaSyncMode
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobDropReplica

log = logging.getLogger(__name__)

DROP_TIMEOUT_S = 10.0
"""How long the leader waits for a device left to acknowledge a drop (its ring waits much longer)."""


def hold_step(job: Job) -> int:
    """The checkpoint step after which the replicas left hold for the dropped replica's rebuild: the first one
    every survivor is still before (this device's worker is at ``job.step``; with DiLoCo the replicas may be up to
    ``h`` steps apart); 0 when none comes before the end."""
    interval = job.spec.checkpoint.interval_steps
    plan = job.replica_plan
    if interval <= 0 or plan is None:
        return 0
    apart = plan.diloco_h if plan.sync_mode is ReplicaSyncMode.DILOCO else 0
    floor = job.step + apart + 2
    step = -(-floor // interval) * interval
    return step if step < job.total_steps else 0


def dropped_plan(plan: ReplicaPlan, count: int, index: int) -> ReplicaPlan:
    """``plan`` without its ``index``-th replica; ``ValueError`` when ``count`` is not its number of replicas
    (a drop meant for another plan, or one already applied) or ``index`` is out of range."""
    replicas = plan.replicas
    if count != len(replicas) or count < 2:
        raise ValueError(f"a drop of replica {index} of {count} does not fit a plan of {len(replicas)} replicas")
    if not 0 <= index < count:
        raise ValueError(f"there is no replica {index} in a plan of {count}")
    return dataclasses.replace(plan, replicas=replicas[:index] + replicas[index + 1 :])


@dataclass(frozen=True)
class ReplicaDropsPorts:
    """What :class:`ReplicaDrops` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    feed: Feed
    request_restart: RequestRestart
    spawn: Spawn
    commanded: Commanded
    peers: PeerService
    """The peer network (the drop told to each device left)."""


class ReplicaDrops:
    """Both sides of a replica drop (see the module docstring)."""

    def __init__(self, ports: ReplicaDropsPorts) -> None:
        self.ports = ports

    def _apply(self, job: Job, plan: ReplicaPlan, count: int, index: int, reason: str) -> tuple[str, ...]:
        """Take the smaller plan; returns the dropped replica's devices."""
        devices = plan.replicas[index].peer_ids
        smaller = dropped_plan(plan, count, index)
        slots = job.slots()
        job.data_shares = job.data_shares or len(plan.replicas)
        job.replica_slots, job.ring_generation = slots[:index] + slots[index + 1 :], job.ring_generation + 1
        if job.plan is not smaller.replicas[0]:
            job.leading.checks.shard_shapes = {}  # another replica writes the shards now: its places' shapes
        job.replica_plan, job.plan = smaller, smaller.replicas[0]
        if job.inputs is not None:
            job.shares = replica_flops_shares(smaller, job.inputs)
        job.replica_drops.append(ReplicaDrop(reason, job.step, tuple(devices), len(smaller.replicas)))
        log.warning(
            "job %s: replica %d of %d dropped (%s); %d replica(s) go on",
            job.job_id,
            index,
            count,
            reason,
            len(smaller.replicas),
        )
        return tuple(devices)

    async def _tell_worker(self, job: Job, count: int, index: int, hold_at: int, retire: bool = False) -> None:
        worker = job.worker
        if worker is None:
            return
        command = (
            {"cmd": "retire"}
            if retire
            else {"cmd": "drop_replica", "replicas": count, "index": index, "hold_at": hold_at}
        )
        try:
            await worker.send(command)
        except WorkerFailed as exc:  # it is gone already: its own failure report follows
            log.warning("job %s: the worker is gone before the drop: %s", job.job_id, exc)

    # -- the leader -----------------------------------------------------------------------------------------

    def drop(self, job: Job, action: actions.DropReplica) -> None:
        """Carry out the core's drop (quick: the messages go in a spawned task)."""
        plan = job.replica_plan
        if plan is None or job.core.stamp != action.stamp:
            return
        try:
            dropped = self._apply(job, plan, action.count, action.index, action.reason)
        except ValueError as exc:  # the core and the job's plan disagree: a bug, but the job can replan
            log.error("job %s: cannot drop a replica: %s", job.job_id, exc)
            self.ports.request_restart(job, f"dropping a replica failed ({exc})")
            return
        job.serving_only = job.serving_only or action.retire
        left = set(job.plan_peers())
        for step in [s for s in job.leading.commits.reports if s > job.committed_step]:  # uncommitted: only the plan's
            job.leading.commits.reports[step] = {
                p: r for p, r in job.leading.commits.reports[step].items() if p in left
            }
        for step in [s for s in job.leading.commits.witnesses if s > job.committed_step]:
            job.leading.commits.witnesses[step] = {
                p: d for p, d in job.leading.commits.witnesses[step].items() if p in left
            }
        me = self.ports.me
        hold_at = hold_step(job) if action.hold else 0
        self.ports.feed(job, events.HoldAt(action.stamp, hold_at))
        message = JobDropReplica(job.job_id, action.count, action.index, hold_at)
        peers = [(p, job.members[p].address) for p in sorted(left) if p != me and p in job.members]
        log.info(
            "job %s: telling %d device(s) to go on without %s",
            job.job_id,
            len(peers),
            ", ".join(p[:12] for p in dropped),
        )

        async def tell() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._tell_worker, job, action.count, action.index, hold_at, action.retire)
                for peer, address in peers:
                    nursery.start_soon(self._send, job, peer, address, message)

        self.ports.spawn(tell)

    async def _send(self, job: Job, peer: str, address: str, message: JobDropReplica) -> None:
        answer = await self.ports.peers.request(
            address, peer, message, timeout=DROP_TIMEOUT_S, job_id=job.job_id, term=job.term, epoch=job.epoch
        )
        if not isinstance(answer, JobAck) or not answer.ok:
            why = answer.reason if isinstance(answer, JobAck) else "no answer"
            log.warning("job %s: %s did not take the replica drop: %s", job.job_id, peer[:12], why[:200])

    # -- a member -------------------------------------------------------------------------------------------

    async def on_drop(self, header: Header, msg: JobDropReplica) -> JobAck:
        job = await self.ports.commanded(header, msg.job_id)
        if isinstance(job, JobAck):
            return job
        plan = job.replica_plan
        if plan is None:
            return JobAck(False, "this device runs no plan of that job")
        me = self.ports.me
        try:
            smaller = dropped_plan(plan, msg.replicas, msg.index)
        except ValueError as exc:
            return JobAck(False, str(exc))
        if me not in smaller.peer_ids:
            return JobAck(False, "this device is in the dropped replica (its worker is stopped instead)")
        if not 0 <= msg.hold_at <= job.total_steps:
            return JobAck(False, f"hold at step {msg.hold_at}: not a step of the job")
        dropped = self._apply(
            job, plan, msg.replicas, msg.index, f"the leader dropped replica {msg.index} of {msg.replicas}"
        )
        self.ports.feed(job, events.ReplicaDropped(dropped))  # (a standby among them is none: the next plan's is)
        await self._tell_worker(job, msg.replicas, msg.index, msg.hold_at)
        return JobAck(True)


__all__ = ["DROP_TIMEOUT_S", "ReplicaDrops", "dropped_plan", "hold_step"]
