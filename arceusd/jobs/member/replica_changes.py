"""A member's side of the leader's changes to a job's data-parallel replicas (issue 22; the leader's side:
:mod:`arceusd.jobs.leader.replica_drop` and :mod:`arceusd.jobs.leader.regrow`).

- a drop (:meth:`ReplicaChanges.on_drop`, :class:`protocol.job_wire.JobDropReplica`): the command is checked
  before it is used: from the job's leader in the plan's term and epoch, a replica count equal to its own plan's (a
  repeated or stale drop does not fit), an index in range, not its own replica, a hold step within the job; then
  the smaller plan taken and its worker told (:mod:`arceusd.jobs.common.replica_change`, as the leader does for
  itself), and the core hears ``ReplicaDropped``;
- a rebuild (:meth:`ReplicaChanges.on_grow`, :class:`protocol.job_wire.JobGrowReplica`): from the same leader, the
  rebuilt replica taken only when it fits this device's plan (the next ring generation, a free slot, devices not in
  the plan, an address for each), and its worker told; a release (no rebuild): its worker goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.jobs.common.ports import Commanded, Feed
from arceusd.jobs.common.replica_change import apply_drop, dropped_plan, go_on, grow_here, tell_worker_drop
from arceusd.jobs.core import events
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobDropReplica, JobGrowReplica


@dataclass(frozen=True)
class ReplicaChangesPorts:
    """What :class:`ReplicaChanges` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    feed: Feed
    commanded: Commanded


class ReplicaChanges:
    """A member taking in its leader's replica drops and rebuilds (see the module docstring)."""

    def __init__(self, ports: ReplicaChangesPorts) -> None:
        self.ports = ports

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
        dropped = apply_drop(
            job, plan, msg.replicas, msg.index, f"the leader dropped replica {msg.index} of {msg.replicas}"
        )
        self.ports.feed(job, events.ReplicaDropped(dropped))  # (a standby among them is none: the next plan's is)
        await tell_worker_drop(job, msg.replicas, msg.index, msg.hold_at)
        return JobAck(True)

    async def on_grow(self, header: Header, msg: JobGrowReplica) -> JobAck:
        job = await self.ports.commanded(header, msg.job_id)
        if isinstance(job, JobAck):
            return job
        if msg.release:
            await go_on(job)
            return JobAck(True)
        try:
            await grow_here(job, msg)
        except ValueError as exc:
            return JobAck(False, str(exc))
        return JobAck(True)


__all__ = ["ReplicaChanges", "ReplicaChangesPorts"]
