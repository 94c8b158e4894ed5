"""Planning a job and starting it: the leader's side of a plan epoch, the I/O of three of the job core's actions.

:meth:`Starting.plan` (the core's ``Plan``) plans over the job's members
(:func:`arceusd.jobs.plans.planning.make_job_plan`, with each member's offer discounted where it ran slower than it
claimed, and the links the leader measured over the transport, :meth:`Starting._measure_links`, cached for
:data:`LINK_TTL_S`) and tells the core ``PlanFound`` or ``NoPlanFits``. :meth:`Starting.start` (``SendStart``) slices
the resume checkpoint for the new plan in a child process (:func:`arceusd.jobs.procs.filework.prepare_resume`) and sends
every member its start (each verifies the plan itself and starts its worker): ``StartAnswered``.
:meth:`Starting.go_round` (``SendGo``) sends ``go`` in plan order: ``GoAnswered``. What follows each (send ``go`` again,
restart, hand the job over to the leader the members follow) is the core's decision (:mod:`arceusd.jobs.core.machine`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from arceusd.device.link_probe import measure_link
from arceusd.jobs.common.ports import Feed, Spawn
from arceusd.jobs.core import JobState, actions, events
from arceusd.jobs.judging import claims
from arceusd.jobs.leader import probation, shard_checks
from arceusd.jobs.leader.standby_sync import choose_standby
from arceusd.jobs.plans.planning import (
    PlanError,
    encode_job_start,
    estimated_links,
    make_job_plan,
    replica_flops_shares,
)
from arceusd.jobs.procs import filework
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from arceusd.worker.protocol import ResumeConfig
from partitioner import Link
from protocol.job_wire import JobAck, JobGo, JobStart, JobStartReply, LinkEcho, PeerAddress

log = logging.getLogger(__name__)

SPARE_TELL_TIMEOUT_S = 30.0
"""How long the leader waits for a spare's answer to the plan it is told (it changes nothing)."""
LINK_TTL_S = 600.0
"""How long a measured link (round trip, bandwidth, per-message cost) is used for plans before it is measured
again."""


@dataclass(frozen=True)
class StartingPorts:
    """What :class:`Starting` uses, built by the composition root (issue 32: a port, not the manager). This
    device's own worker is reached through two callables, so the leader's side imports nothing of
    :mod:`arceusd.jobs.member`."""

    me: str
    """This device's peer id."""
    feed: Feed
    spawn: Spawn
    peers: PeerService
    """The peer network (starts, ``go``, link echoes; the round trips it measured; who is a member)."""
    start_own_worker: Callable[[Job, ResumeConfig | None, Path | None], Awaitable[JobStartReply]]
    """Start this device's worker for its place in the plan (``LocalWorker.start_worker``)."""
    go_own_worker: Callable[[Job, JobGo], Awaitable[None]]
    """Let this device's worker go (``LocalWorker.go``)."""
    repair_checkpoint: Callable[[Job], Awaitable[list[Path]]]
    """The newest committed step's damaged shards copied from members (``Commits.repair_checkpoint``)."""


class Starting:
    """The leader's planning and starting of a plan epoch (see the module docstring)."""

    def __init__(self, ports: StartingPorts) -> None:
        self.ports = ports
        self._links: dict[str, tuple[float, Link]] = {}  # peer -> (when measured, partitioner Link)

    async def plan(self, job: Job) -> None:
        """The core's ``Plan``: plan over ``job.members`` and tell the core what came of it."""
        stamp = job.core.stamp
        me = self.ports.me
        rtt = {(me, p): (i.rtt_ms or 1.0) / 1000 for p, i in self.ports.peers.info.items()}
        # a member measured far slower than it offered is planned at its measured speed (issue #19)
        discounts = job.leading.speed.discounts
        every = [claims.discounted(job.members[p], discounts.get(p, 1.0)) for p in sorted(job.members)]
        # a member two neighbours' words cannot judge is planned alone beside the leader for a while (probation)
        offers = probation.probation_offers(every, me, job.leading.probation.member)
        measured = await self._measure_links(job)
        job.leading.loop.links = {
            p: {
                "rtt_ms": round(m.rtt_s * 1e3, 3),
                "bandwidth_mb_s": round(m.bandwidth_bytes_per_s / 1e6, 2),
                "message_ms": round(m.message_s * 1e3, 4),
            }
            for p, m in measured.items()
        }
        links = estimated_links(me, measured, sorted(job.members))
        try:
            try:
                inputs, replica_plan = await trio.to_thread.run_sync(make_job_plan, job.spec, offers, rtt, links, me)
            except PlanError as exc:
                if not job.leading.probation.member:
                    raise
                log.warning(
                    "job %s: no plan fits %s alone beside the leader (%s); planning with every member",
                    job.job_id,
                    job.leading.probation.member[:12],
                    exc,
                )
                job.leading.probation.member = ""
                offers = every
                inputs, replica_plan = await trio.to_thread.run_sync(make_job_plan, job.spec, offers, rtt, links, me)
        except PlanError as exc:
            if job.core.stamp == stamp:
                log.warning("job %s: no plan fits the %d member(s): %s", job.job_id, len(offers), exc)
                self.ports.feed(job, events.NoPlanFits(str(exc)))
            return
        if job.core.stamp != stamp or job.state != JobState.PLANNING:
            return  # repartitioned or ended while planning: the core plans again when it is time
        job.inputs, job.replica_plan = inputs, replica_plan
        job.plan = replica_plan.replicas[0]  # the first replica's devices write the checkpoint shards
        job.replica_slots, job.data_shares, job.ring_generation, job.serving_only = (), 0, 0, False
        job.shares = replica_flops_shares(replica_plan, inputs)
        standby = choose_standby(job, me)
        _mark(job, "planned")
        self.ports.feed(
            job, events.PlanFound(job.planned_peers(), standby, tuple(r.peer_ids for r in replica_plan.replicas))
        )
        if job.core.stamp != stamp:  # the core took the plan (a new epoch)
            job.leading.speed.link_waits.clear()  # who waits on whom depends on the plan: judged afresh (claims)
            job.leading.speed.seen.clear()
            self.ports.spawn(shard_checks.prefetch_shapes, job)  # ready by the plan's first checkpoint

    async def start(self, job: Job, action: actions.SendStart) -> None:
        """The core's ``SendStart``: slice the resume checkpoint for the new plan (a child process), send every
        member its start (each verifies the plan itself and starts its worker), and tell the core who refused."""
        me = self.ports.me
        if job.inputs is None or job.replica_plan is None or job.core.stamp != action.stamp:
            return  # the plan it starts is gone (a repartition began): the core plans again
        inputs_data, plan_data = encode_job_start(job.spec, job.inputs, job.replica_plan)
        resume = None
        if action.resuming:
            replicas = await self.ports.repair_checkpoint(job)
            _mark(job, "checked")
            resume = await filework.prepare_resume(
                job.directory, job.spec_bytes, plan_data, job.epoch, sorted(job.leaders), replicas
            )
        if job.core.stamp != action.stamp:
            return
        _mark(job, "sliced")
        start_step = resume.step if resume is not None else 0
        job.leading.loop.resume_files = {p: f.name for p, f in resume.files.items()} if resume is not None else {}
        job.step = start_step
        job.cut_history(start_step)
        if job.leading.loop.recoveries and job.leading.loop.recoveries[-1].epoch == job.epoch:
            job.leading.loop.recoveries[-1].resumed_step = start_step
        start = JobStart(
            job.job_id,
            job.term,
            job.epoch,
            job.spec_bytes,
            plan_data,
            inputs_data,
            start_step,
            resume.to_wire() if resume is not None else b"",
            job.standby,
            members=tuple(sorted(job.members)),
        )
        job.leading.loop.go_addresses = addresses = {}
        failures: list[tuple[str, str, str]] = []
        reach = {p: o.address for p, o in job.members.items()}  # as planned: a member may leave meanwhile
        planned = set(job.plan_peers())  # (job.spares() waits for the election to name this leader: not yet, here)
        self.ports.spawn(self.tell_spares, job, start, {p: a for p, a in reach.items() if p not in planned and p != me})

        async def start_one(peer: str) -> None:
            if peer == me:
                local = None
                if resume is not None:
                    local = ResumeConfig(start_step, str(resume.directory / resume.files[me].name), resume.cursor)
                reply = await self.ports.start_own_worker(job, local, None)
            elif peer not in reach:
                reply = JobStartReply(job.job_id, False, "no longer a member")
            else:
                got = await self.ports.peers.request(
                    reach[peer], peer, start, timeout=240.0, job_id=job.job_id, term=job.term, epoch=job.epoch
                )
                reply = got if isinstance(got, JobStartReply) else JobStartReply(job.job_id, False, "no answer")
            if reply.accepted:
                addresses[peer] = reply.worker_address
            else:
                failures.append((peer, reply.reason, reply.follows))

        with trio.CancelScope() as scope:
            job.leading.loop.start_scope = scope
            async with trio.open_nursery() as nursery:
                for peer in job.plan_peers():
                    nursery.start_soon(start_one, peer)
        job.leading.loop.start_scope = None
        _mark(job, "started")
        if scope.cancelled_caught:
            failures.append(("", "a member of the new plan failed while it started", ""))
        self.ports.feed(job, events.StartAnswered(action.stamp, tuple(failures)))

    async def tell_spares(self, job: Job, start: JobStart, spares: dict[str, str]) -> None:
        """Send the plan's start to the members it leaves out, beside the plan's own starts (nothing waits on
        them): each verifies the plan, finds no place in it and says it is a spare (``status JOB`` on its own
        daemon). Their answers (a refusal: no place) change nothing."""

        async def tell(peer: str, address: str) -> None:
            await self.ports.peers.request(
                address, peer, start, timeout=SPARE_TELL_TIMEOUT_S, job_id=job.job_id, term=job.term, epoch=job.epoch
            )

        async with trio.open_nursery() as nursery:
            for peer, address in sorted(spares.items()):
                nursery.start_soon(tell, peer, address)

    async def go_round(self, job: Job, action: actions.SendGo) -> None:
        """The core's ``SendGo``: send ``go`` to the peers it names, in plan order, and tell the core which
        ones did not acknowledge it (it sends again, then restarts the plan: :func:`lifecycle.after_go`)."""
        go = JobGo(
            job.job_id,
            action.stamp.term,
            action.stamp.epoch,
            tuple(PeerAddress(p, a) for p, a in sorted(job.leading.loop.go_addresses.items())),
        )
        reach = {p: o.address for p, o in job.members.items()}
        unacknowledged = await self.send_go(job, go, list(action.peers), reach)
        _mark(job, "went")
        if unacknowledged and job.core.stamp == action.stamp:
            log.warning("job %s: go not acknowledged by %s", job.job_id, ", ".join(p[:12] for p in unacknowledged))
        self.ports.feed(job, events.GoAnswered(action.stamp, unacknowledged))
        if job.state == JobState.RUNNING and job.core.stamp == action.stamp and not unacknowledged:
            log.info(
                "job %s running on %d devices (term %d, epoch %d, from step %d)",
                job.job_id,
                len(job.leading.loop.go_addresses),
                job.term,
                job.epoch,
                job.step,
            )

    async def send_go(self, job: Job, go: JobGo, peers: list[str], reach: dict[str, str]) -> dict[str, str]:
        """Send ``go`` to ``peers`` in plan order (as before); the ones that did not acknowledge it, with why."""
        me = self.ports.me
        unacknowledged: dict[str, str] = {}

        async def one(peer: str) -> None:
            if peer == me:
                await self.ports.go_own_worker(job, go)
                return
            reply = await self.ports.peers.request(
                reach[peer], peer, go, timeout=30.0, job_id=job.job_id, term=job.term, epoch=job.epoch
            )
            if not isinstance(reply, JobAck):
                unacknowledged[peer] = "no answer"
            elif not reply.ok:
                unacknowledged[peer] = reply.reason or "refused"

        for peer in peers:
            if peer != me and peer not in reach:
                unacknowledged[peer] = "no longer a member"
                continue
            await one(peer)
        return unacknowledged

    async def _measure_links(self, job: Job) -> dict[str, Link]:
        """Leader: the link to each member, measured over the transport
        (``arceusd.device.link_probe.measure_link``: round trip, bandwidth, per-message cost) one member at a time,
        reused for :data:`LINK_TTL_S`. A member that does not echo in time keeps the defaults (round trip from
        membership, nominal bandwidth). The member's echo: :mod:`arceusd.jobs.member.link_echo`."""
        me, now = self.ports.me, time.monotonic()
        out: dict[str, Link] = {}
        for peer in sorted(job.members):
            if peer == me:
                continue
            cached = self._links.get(peer)
            if cached is not None and now - cached[0] < LINK_TTL_S:
                out[peer] = cached[1]
                continue
            address = job.members[peer].address

            async def echo(data: bytes, peer: str = peer, address: str = address) -> bytes:
                reply = await self.ports.peers.request(address, peer, LinkEcho(data), timeout=10.0)
                if not isinstance(reply, LinkEcho):
                    raise ValueError(f"{peer[:12]} did not echo")
                return reply.payload

            try:
                with trio.fail_after(20):
                    m = await measure_link(echo)
            except (ValueError, trio.TooSlowError) as exc:
                log.warning("job %s: could not measure the link to %s: %s", job.job_id, peer[:12], exc)
                continue
            link = Link(round(m.rtt_s, 6), float(f"{m.bandwidth_bytes_per_s:.4g}"), round(m.message_s, 7))
            self._links[peer] = (now, link)
            out[peer] = link
        return out


def _mark(job: Job, phase: str) -> None:
    """The end of a start phase, in the running recovery's record (bench/recovery.py prints where time went)."""
    recoveries = job.leading.loop.recoveries
    if recoveries and recoveries[-1].first_step_after_s is None:
        recoveries[-1].mark(phase)


__all__ = ["LINK_TTL_S", "Starting"]
