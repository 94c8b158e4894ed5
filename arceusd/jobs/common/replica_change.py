"""A change of a job's data-parallel replicas applied on this device: its record of the plan and its worker told
(issue 22). Both sides apply the same change: the leader for itself (:mod:`arceusd.jobs.leader.replica_drop`,
:mod:`arceusd.jobs.leader.regrow`), every other device of the plan on the leader's command
(:mod:`arceusd.jobs.member.replica_changes`).

- a drop: :func:`dropped_plan` (the plan without a replica; a drop that does not fit it is refused),
  :func:`apply_drop` (the smaller plan taken, the drop recorded: :class:`arceusd.jobs.record.job.ReplicaDrop`),
  :func:`tell_worker_drop` (the worker's ``drop_replica``, or ``retire``);
- a rebuild: :func:`grown_plan` (a replica of the first's cuts on new devices, in a free slot), :func:`grow_here`
  (the grown plan taken, the worker's ``grow_replica``), :func:`go_on` (no rebuild: the worker's ``go_on``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from arceusd.jobs.plans.planning import replica_flops_shares
from arceusd.jobs.procs.supervisor import WorkerFailed
from arceusd.jobs.record.job import Job, ReplicaDrop
from partitioner.replicas import ReplicaPlan, with_devices
from protocol.job_wire import JobGrowReplica

log = logging.getLogger(__name__)


def dropped_plan(plan: ReplicaPlan, count: int, index: int) -> ReplicaPlan:
    """``plan`` without its ``index``-th replica; ``ValueError`` when ``count`` is not its number of replicas
    (a drop meant for another plan, or one already applied) or ``index`` is out of range."""
    replicas = plan.replicas
    if count != len(replicas) or count < 2:
        raise ValueError(f"a drop of replica {index} of {count} does not fit a plan of {len(replicas)} replicas")
    if not 0 <= index < count:
        raise ValueError(f"there is no replica {index} in a plan of {count}")
    return dataclasses.replace(plan, replicas=replicas[:index] + replicas[index + 1 :])


def apply_drop(job: Job, plan: ReplicaPlan, count: int, index: int, reason: str) -> tuple[str, ...]:
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


async def tell_worker_drop(job: Job, count: int, index: int, hold_at: int, retire: bool = False) -> None:
    """This device's worker told of the drop (``retire``: it only serves the data from now on)."""
    worker = job.worker
    if worker is None:
        return
    command = (
        {"cmd": "retire"} if retire else {"cmd": "drop_replica", "replicas": count, "index": index, "hold_at": hold_at}
    )
    try:
        await worker.send(command)
    except WorkerFailed as exc:  # it is gone already: its own failure report follows
        log.warning("job %s: the worker is gone before the drop: %s", job.job_id, exc)


def grown_plan(
    plan: ReplicaPlan, slots: tuple[int, ...], slot: int, devices: tuple[str, ...]
) -> tuple[ReplicaPlan, int]:
    """``plan`` (its replicas in ``slots``) with a replica of the first's cuts on ``devices`` in ``slot``; the grown
    plan and the new replica's position. ``ValueError`` when it does not fit."""
    if slot in slots or len(slots) != len(plan.replicas):
        raise ValueError(f"slot {slot} is taken (slots {list(slots)})")
    if set(devices) & set(plan.peer_ids):
        raise ValueError("a device of the rebuilt replica is in the plan already")
    new = with_devices(plan.replicas[0], devices)
    position = sorted((*slots, slot)).index(slot)
    return dataclasses.replace(plan, replicas=(*plan.replicas[:position], new, *plan.replicas[position:])), position


async def grow_here(job: Job, msg: JobGrowReplica) -> None:
    """Take the rebuilt replica into this device's plan and tell its worker; ``ValueError`` (nothing changed)
    when it does not fit that plan."""
    plan = job.replica_plan
    if plan is None:
        raise ValueError("this device runs no plan of that job")
    shares = job.data_shares or len(plan.replicas)
    if msg.generation != job.ring_generation + 1 or not 0 <= msg.slot < shares:
        raise ValueError(
            f"a rebuild in ring generation {msg.generation}, slot {msg.slot}, does not follow this "
            f"device's generation {job.ring_generation} of {shares} slots"
        )
    addresses = {a.peer_id: a.address for a in msg.addresses}
    if set(addresses) != set(msg.devices):
        raise ValueError("the rebuilt replica's addresses do not match its devices")
    grown, position = grown_plan(plan, job.slots(), msg.slot, msg.devices)
    new = grown.replicas[position]
    if job.plan is not grown.replicas[0]:
        job.leading.checks.shard_shapes = {}  # another replica writes the shards now: its places' shapes
    job.replica_plan, job.plan = grown, grown.replicas[0]
    if job.inputs is not None:  # the ledger credits the rebuilt replica's devices from now on
        job.shares = replica_flops_shares(grown, job.inputs)
    job.replica_slots = tuple(sorted((*job.slots(), msg.slot)))
    job.data_shares, job.ring_generation = shares, msg.generation
    job.rebuilt_replicas.append((msg.step, tuple(msg.devices)))
    worker = job.worker
    if worker is None:
        return
    try:
        await worker.send(
            {
                "cmd": "grow_replica",
                "step": msg.step,
                "slot": msg.slot,
                "generation": msg.generation,
                "stages": [[sh.peer_id for sh in st.shares] for st in new.stages],
                "addresses": addresses,
            }
        )
    except WorkerFailed as exc:
        log.warning("job %s: the worker is gone before the rebuild: %s", job.job_id, exc)


async def go_on(job: Job) -> None:
    """No rebuild: this device's worker stops holding and goes on."""
    if job.worker is not None:
        with contextlib.suppress(WorkerFailed):  # gone: its own failure report follows
            await job.worker.send({"cmd": "go_on"})


__all__ = ["apply_drop", "dropped_plan", "go_on", "grow_here", "grown_plan", "tell_worker_drop"]
