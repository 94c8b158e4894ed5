"""Dropping a data-parallel replica whose device is gone, so that the other replicas train on (issue 22).

The job core decides (``JobCore._lose`` answers :class:`arceusd.jobs.core.actions.DropReplica`: one replica per
checkpoint interval, never the leader's); this module is the leader's I/O (:meth:`ReplicaDrops.drop`): the plan
without that replica (:func:`arceusd.jobs.common.replica_change.dropped_plan`; the first replica left writes the
shards from now on), reports of steps not yet committed from devices no longer in the plan forgotten, the devices
left told (:class:`protocol.job_wire.JobDropReplica`, stamped with the plan's term and epoch) and this device's
worker (its ``drop_replica`` command). The dropped replica's devices are stopped by the core's ``StopWorkers``; they
stay members and get work again at the next checkpoint (a rebalance). A member's side, the command checked before
it is used and the same plan change: :mod:`arceusd.jobs.member.replica_changes`.

Each side records the drop (:class:`arceusd.jobs.record.job.ReplicaDrop`), shown by ``arceusd status JOB``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from arceusd.jobs.common.ports import Feed, RequestRestart, Spawn
from arceusd.jobs.common.replica_change import apply_drop, tell_worker_drop
from arceusd.jobs.core import actions, events
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from partitioner.replicas import ReplicaSyncMode
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


@dataclass(frozen=True)
class ReplicaDropsPorts:
    """What :class:`ReplicaDrops` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    feed: Feed
    request_restart: RequestRestart
    spawn: Spawn
    peers: PeerService
    """The peer network (the drop told to each device left)."""


class ReplicaDrops:
    """The leader's side of a replica drop (see the module docstring)."""

    def __init__(self, ports: ReplicaDropsPorts) -> None:
        self.ports = ports

    def drop(self, job: Job, action: actions.DropReplica) -> None:
        """Carry out the core's drop (quick: the messages go in a spawned task)."""
        plan = job.replica_plan
        if plan is None or job.core.stamp != action.stamp:
            return
        try:
            dropped = apply_drop(job, plan, action.count, action.index, action.reason)
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
                nursery.start_soon(tell_worker_drop, job, action.count, action.index, hold_at, action.retire)
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


__all__ = ["DROP_TIMEOUT_S", "ReplicaDrops", "ReplicaDropsPorts", "hold_step"]
