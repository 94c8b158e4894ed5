"""Planning a job and starting it: the leader's side of a plan epoch.

:meth:`Starting.plan_and_start` plans over the job's members (:func:`arceusd.jobs.planning.make_job_plan`, with
each member's offer discounted where it ran slower than it claimed, and the links the leader measured over the
transport, :meth:`Starting._measure_links`, cached for :data:`LINK_TTL_S`), slices the resume checkpoint for the
new plan in a child process (:func:`arceusd.jobs.filework.prepare_resume`), sends every member its start (each
verifies the plan itself and starts its worker), then ``go`` in plan order: a ``go`` that is not acknowledged is
sent again, then the plan restarts (:func:`arceusd.jobs.lifecycle.after_go`). A member that says it follows
another leader makes this device hand the job over (:func:`arceusd.jobs.leadership.start_outcome`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from arceusd.jobs import claims, filework, leadership, lifecycle, shard_checks
from arceusd.jobs.commits import Commits
from arceusd.jobs.job import TERMINAL, Job
from arceusd.jobs.local_worker import LocalWorker
from arceusd.jobs.manager_base import JobContext, Lifecycle
from arceusd.jobs.standby_sync import choose_standby
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobGo, JobStart, JobStartReply, LinkEcho, PeerAddress

log = logging.getLogger(__name__)

LINK_TTL_S = 600.0
"""How long a measured link (round trip, bandwidth, per-message cost) is used for plans before it is measured
again."""


class Starting:
    """The leader's planning and starting of a plan epoch (see the module docstring)."""

    def __init__(self, ctx: JobContext, life: Lifecycle, local: LocalWorker, commits: Commits) -> None:
        self.ctx = ctx
        self.life = life
        self.local = local
        self.commits = commits
        self._links: dict[str, tuple[float, Any]] = {}  # peer -> (when measured, partitioner Link)

    async def plan_and_start(self, job: Job) -> None:
        """Plan over ``job.members``, slice the resume checkpoint, start every worker, then send ``go``."""
        from arceusd.jobs.planning import (
            PlanError,
            encode_job_start,
            estimated_links,
            make_job_plan,
            replica_flops_shares,
        )
        resuming = job.state == "recovering" or job.committed_step > 0
        job.state = "planning"
        me = self.ctx.node.identity.peer_id
        rtt = {(me, p): (i.rtt_ms or 1.0) / 1000 for p, i in self.ctx.peers.info.items()}
        # a member measured far slower than it offered is planned at its measured speed (issue #19)
        offers = [claims.discounted(job.members[p], job.discounts.get(p, 1.0)) for p in sorted(job.members)]
        measured = await self._measure_links(job)
        job.links = {p: {"rtt_ms": round(m.rtt_s * 1e3, 3), "bandwidth_mb_s": round(m.bandwidth_bytes_per_s / 1e6, 2),
                         "message_ms": round(m.message_s * 1e3, 4)} for p, m in measured.items()}  # fmt: skip
        links = estimated_links(me, measured, sorted(job.members))
        try:
            job.inputs, job.replica_plan = await trio.to_thread.run_sync(make_job_plan, job.spec, offers, rtt, links,
                                                                         me)  # fmt: skip
        except PlanError as exc:
            job.state = "paused" if resuming else "waiting"
            job.error = f"no plan fits the {len(offers)} member(s): {exc}" + (
                "; paused until more capacity joins" if resuming else "")  # fmt: skip
            job.min_members = len(job.members) + 1
            log.warning("job %s: %s", job.job_id, job.error)
            return
        job.plan = job.replica_plan.replicas[0]  # the first replica's devices write the checkpoint shards
        if me not in job.plan_peers():
            await self.life.finish(job, "failed", "the plan leaves out the owner, who serves the data")
            return
        job.shares = replica_flops_shares(job.replica_plan, job.inputs)
        job.epoch += 1
        job.link_waits.clear()  # who waits on whom depends on the plan: judged afresh (claims.seen_by_neighbours)
        job.seen.clear()
        self.ctx.spawn(shard_checks.prefetch_shapes, job)  # ready by the plan's first checkpoint
        job.state = "starting"
        job.standby = choose_standby(job, me)
        self.ctx.track(job, list(job.plan_peers()), [me, job.standby])
        inputs_data, plan_data = encode_job_start(job.spec, job.inputs, job.replica_plan)
        resume = None
        if resuming:
            replicas = await self.commits.repair_checkpoint(job)
            resume = await filework.prepare_resume(job.directory, job.spec_bytes, plan_data, job.epoch,
                                                   sorted(job.leaders), replicas)  # fmt: skip
        start_step = resume.step if resume is not None else 0
        job.resume_files = {p: f.name for p, f in resume.files.items()} if resume is not None else {}
        job.step = start_step
        job.history = [h for h in job.history if h[0] <= start_step]
        if job.recoveries and job.recoveries[-1].epoch == job.epoch:
            job.recoveries[-1].resumed_step = start_step
        start = JobStart(job.job_id, job.term, job.epoch, job.spec_bytes, plan_data, inputs_data, start_step,
                         resume.to_wire() if resume is not None else b"", job.standby)  # fmt: skip
        addresses: dict[str, str] = {}
        failures: list[tuple[str, str]] = []
        reach = {o.peer_id: o.address for o in offers}  # as planned: a member may leave meanwhile

        async def start_one(peer: str) -> None:
            if peer == me:
                local = None
                if resume is not None:
                    from arceusd.worker.protocol import ResumeConfig

                    local = ResumeConfig(start_step, str(resume.directory / resume.files[me].name), resume.cursor)
                reply = await self.local.start_worker(job, local)
            else:
                got = await self.ctx.peers.request(reach[peer], peer, start, timeout=240.0,
                                               job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
                reply = got if isinstance(got, JobStartReply) else JobStartReply(job.job_id, False, "no answer")
            if reply.accepted:
                addresses[peer] = reply.worker_address
            else:
                failures.append((peer, reply.reason))

        epoch = job.epoch
        with trio.CancelScope() as scope:
            job.start_scope = scope
            async with trio.open_nursery() as nursery:
                for peer in job.plan_peers():
                    nursery.start_soon(start_one, peer)
        job.start_scope = None
        if job.epoch != epoch or job.state in TERMINAL or not self.ctx.leads(job):
            return  # replanned, ended, or handed over (to the leader our members follow) meanwhile
        if scope.cancelled_caught:
            failures.append(("", "a member of the new plan failed while it started"))
        outcome = leadership.start_outcome(me, failures)
        if isinstance(outcome, leadership.HandOver):
            # Membership declared us dead meanwhile and the standby took over: its members refuse us and say
            # so. Commanding again cannot succeed (we would only fail the job); join the new leader instead.
            log.warning("job %s: the members follow %s now; handing over", job.job_id, outcome.leader[:12])
            job.state = "running"  # the restart path if the hand-over does not happen
            await self.life.hand_over(job, outcome.leader)
            if self.ctx.leads(job):
                self.life.request_restart(job, f"members follow {outcome.leader[:12]}, who did not take us in")
            return
        if isinstance(outcome, leadership.Restart):
            reason = outcome.reason
            if resuming or job.restart_reason:
                job.state = "running"  # let the leader loop take the restart path
                self.life.request_restart(job, reason)
            else:
                await self.life.finish(job, "failed", reason)
            return
        go = JobGo(job.job_id, job.term, job.epoch, tuple(PeerAddress(p, a) for p, a in sorted(addresses.items())))
        pending, attempt = list(job.plan_peers()), 0
        while True:
            attempt += 1
            unacknowledged = await self.send_go(job, go, pending, reach)
            if job.epoch != epoch or job.state in TERMINAL or not self.ctx.leads(job):
                return
            decided = lifecycle.after_go(unacknowledged, attempt)
            if isinstance(decided, lifecycle.ResendGo):
                log.warning("job %s: go not acknowledged by %s; sending it again", job.job_id,
                            ", ".join(p[:12] for p in decided.peers))  # fmt: skip
                pending = list(decided.peers)
                continue
            if isinstance(decided, lifecycle.RestartPlan):
                job.state = "running"  # the leader loop's restart path
                self.life.request_restart(job, decided.reason)
                return
            break
        if job.state == "starting":
            job.state = "running"
        job.error = ""
        log.info("job %s running on %d devices (term %d, epoch %d, from step %d)", job.job_id, len(addresses),
                 job.term, job.epoch, start_step)  # fmt: skip

    async def send_go(self, job: Job, go: JobGo, peers: list[str], reach: dict[str, str]) -> dict[str, str]:
        """Send ``go`` to ``peers`` in plan order (as before); the ones that did not acknowledge it, with why."""
        me = self.ctx.node.identity.peer_id
        unacknowledged: dict[str, str] = {}

        async def one(peer: str) -> None:
            if peer == me:
                await self.local.go(job, go)
                return
            reply = await self.ctx.peers.request(reach[peer], peer, go, timeout=30.0,
                                             job_id=job.job_id, term=job.term, epoch=job.epoch)  # fmt: skip
            if not isinstance(reply, JobAck):
                unacknowledged[peer] = "no answer"
            elif not reply.ok:
                unacknowledged[peer] = reply.reason or "refused"

        for peer in peers:
            await one(peer)
        return unacknowledged

    async def _measure_links(self, job: Job) -> dict[str, Any]:
        """Leader: the link to each member, measured over the transport (``arceusd.profile.measure_link``: round
        trip, bandwidth, per-message cost) one member at a time, reused for :data:`LINK_TTL_S`. A member that
        does not echo in time keeps the defaults (round trip from membership, nominal bandwidth)."""
        from arceusd.profile import measure_link
        from partitioner import Link

        me, now, out = self.ctx.node.identity.peer_id, time.monotonic(), {}
        for peer in sorted(job.members):
            if peer == me:
                continue
            cached = self._links.get(peer)
            if cached is not None and now - cached[0] < LINK_TTL_S:
                out[peer] = cached[1]
                continue
            address = job.members[peer].address

            async def echo(data: bytes, peer: str = peer, address: str = address) -> bytes:
                reply = await self.ctx.peers.request(address, peer, LinkEcho(data), timeout=10.0)
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

    async def on_link_echo(self, header: Header, msg: LinkEcho) -> LinkEcho | JobAck:
        if header.sender not in self.ctx.peers.membership.members:
            return JobAck(False, "echoes are for peers in the membership view")
        return LinkEcho(msg.payload)


__all__ = ["LINK_TTL_S", "Starting"]
