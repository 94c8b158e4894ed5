"""The leader's intake of its members' reports (and of its own worker's, taken in place): the leader's side of
the :class:`protocol.job_wire.JobReport` values :mod:`arceusd.jobs.member.local_worker` sends.

A departure or a worker's failure is handed to the core (a replica dropped or a repartition); a checkpoint's shard
and a witness are checked (:mod:`arceusd.jobs.leader.shard_checks`, :mod:`arceusd.jobs.leader.witnesses`) and kept
in the leader's record, with the speeds the report claims (:mod:`arceusd.jobs.judging.claims`); once every device
of the plan reported a step, the replicas are compared, the claims judged (:mod:`arceusd.jobs.leader.probation`,
the speed challenges) and the step committed through the core. A report that fails its checks excludes its
sender. Where this sits in a job's life: docs/ARCHITECTURE.md, "A job's life".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from arceusd.jobs.common.ports import Feed, FetchShard, Leads, RequestRestart, Spawn
from arceusd.jobs.core import Stamp, events
from arceusd.jobs.judging import claims
from arceusd.jobs.leader import probation, shard_checks, witness_shards, witnesses
from arceusd.jobs.record.job import Job
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobReport, ReportKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportIntakePorts:
    """What :class:`ReportIntake` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: Mapping[str, Job]
    """The jobs this daemon holds, by id."""
    feed: Feed
    request_restart: RequestRestart
    leads: Leads
    spawn: Spawn
    fetch_shard: FetchShard
    """A member's shard, read at a DiLoCo witness dispute (:mod:`arceusd.jobs.leader.witness_shards`)."""
    judge_speeds: Callable[[Job], list[str]]
    """The leader's timed challenges judged (``SpeedChecks.judge``): the restart reasons they give."""


class ReportIntake:
    """The leader taking members' reports: ``on_report`` (the wire handler) and ``take`` (a report let in; this
    device's own reports come to it through :class:`arceusd.jobs.member.local_worker.LocalWorkerPorts.take`)."""

    def __init__(self, ports: ReportIntakePorts) -> None:
        self.ports = ports

    async def on_report(self, header: Header, msg: JobReport) -> JobAck:
        job = self.ports.jobs.get(msg.job_id)
        if job is None or not self.ports.leads(job):
            return JobAck(False, "not the leader of that job")
        if msg.kind is ReportKind.LEAVE and header.sender in job.members:
            job.drop_member(header.sender)  # (not invited straight back)
            log.info("job %s: %s left", job.job_id, header.sender[:12])
            if header.sender in job.plan_peers():
                self.ports.request_restart(job, f"member {header.sender[:12]} left the job")
            return JobAck(True)
        if header.sender not in job.plan_peers() or msg.epoch != job.epoch:
            job.leading.checks.stale_reports += 1
            return JobAck(False, f"report from outside the current plan epoch ({msg.epoch}; now {job.epoch})")
        await self.take(job, header.sender, msg)
        return JobAck(True)

    async def take(self, job: Job, peer: str, report: JobReport) -> None:
        """The leader's side of ``peer``'s report (its typed fields as the codec bounded them, or this device's
        own): a failure asks for a repartition; a checkpoint's shard and a witness are checked, kept, and the step
        committed once every device reported; a report that fails its checks excludes its sender."""
        kind = report.kind
        if kind in (ReportKind.ERROR, ReportKind.LOST):
            # A worker's failure is usually a neighbour's: a killed process breaks its links. The core drops
            # that worker's replica (the others go on) or repartitions; a job that fails again and again at the
            # same checkpoint gives up.
            self.ports.feed(
                job, events.WorkerFailed(job.core.stamp, peer, report.message[:300], lost=kind is ReportKind.LOST)
            )
        elif kind is ReportKind.CHECKPOINT:
            try:  # the name from the plan, the size within its bound (issue #19)
                step, shard = shard_checks.check_checkpoint_report(job, peer, report)
            except shard_checks.ReportRefused as refused:
                self.ports.request_restart(job, shard_checks.exclude(job, peer, refused))
                return
            job.leading.commits.reports.setdefault(step, {})[peer] = shard
            job.leading.commits.latest[peer] = report  # as it came: status shows its figures (record/report_fields)
            if job.serving_only and step > job.step:  # a retired leader learns the progress from its members
                job.credit(step - job.step)
                job.step = step
            claims.record_wait_time(job.leading.speed.waits, peer, report)
            claims.record_link_waits(job.leading.speed.link_waits, peer, report)
            claims.record_step_time(job.leading.speed.measured, peer, report)
            if report.cursor is not None:
                job.leading.commits.cursors[step] = {"epoch": report.cursor.epoch, "step": report.cursor.step}
            self._when_complete(job, step)
        elif kind is ReportKind.WITNESS:
            try:
                step, digest = witnesses.check_witness(job, peer, report)
            except shard_checks.ReportRefused as refused:
                self.ports.request_restart(job, shard_checks.exclude(job, peer, refused))
                return
            job.leading.commits.witnesses.setdefault(step, {})[peer] = digest
            job.leading.commits.latest[peer] = report
            # every replica's device says how fast it ran (the first replica's say it in their checkpoint too)
            claims.record_wait_time(job.leading.speed.waits, peer, report)
            claims.record_link_waits(job.leading.speed.link_waits, peer, report)
            claims.record_step_time(job.leading.speed.measured, peer, report)
            self._when_complete(job, step)

    def _when_complete(self, job: Job, step: int) -> None:
        """Once every device of the plan reported ``step`` (the first replica's shards; with replicas, every
        device's witness): compare the replicas, judge the claims, and commit (once per step)."""
        if job.plan is None or step in job.leading.commits.complete:
            return
        if len(job.leading.commits.reports.get(step, {})) < sum(len(s.shares) for s in job.plan.stages):
            return
        alike: frozenset[str] = frozenset()
        if witnesses.replicated(job):
            digests = job.leading.commits.witnesses.get(step, {})
            if len(digests) < len(job.plan_peers()):
                return
            me = self.ports.me
            outer = job.leading.commits.outer_witnesses.get(step)
            verdict = witnesses.judge(job, step, digests, me, witnesses.shard_digests(job, step), outer)
            if verdict.unsettled and outer is None:  # DiLoCo: the first replica's shards settle it, once read
                job.leading.commits.outer_witnesses[step] = {}
                self.ports.spawn(self._read_outer, job, step, verdict.unsettled, job.core.stamp)
                return
            if verdict.reason:
                job.leading.commits.complete[step] = frozenset()
                for peer in verdict.odd:
                    if peer == me:
                        continue  # the leader does not exclude itself: the replan is the remedy
                    refused = shard_checks.ReportRefused(shard_checks.ReportProblem.WITNESS, verdict.reason)
                    shard_checks.exclude(job, peer, refused)
                if not verdict.odd:
                    problem = shard_checks.ReportProblem.WITNESS.value
                    job.leading.checks.refused_reports[problem] = job.leading.checks.refused_reports.get(problem, 0) + 1
                self.ports.request_restart(job, verdict.reason)
                return
            alike = verdict.alike
        job.leading.commits.complete[step] = alike
        reason = self._judge_claims(job)
        if reason:  # planned again from the last commit: this checkpoint was paced by the overclaim
            self.ports.request_restart(job, reason)
            return
        self.ports.feed(job, events.CheckpointComplete(job.core.stamp, step))  # the core commits it, once

    async def _read_outer(self, job: Job, step: int, peers: tuple[str, ...], stamp: Stamp) -> None:
        """Read the witness each of ``peers`` (first-replica devices at places in dispute) holds in its shard of
        ``step`` (:mod:`arceusd.jobs.leader.witness_shards`), then judge the step again (unless the plan changed)."""
        got = await witness_shards.outer_witnesses(self.ports.fetch_shard, job, step, peers)
        if job.core.stamp != stamp or step in job.leading.commits.complete or not self.ports.leads(job):
            return
        for peer, why in got.withheld.items():  # its serving blamed, as at a commit
            self.ports.feed(job, events.ShardWithheld(stamp, peer, why))
        if job.core.stamp != stamp:
            return  # excluded: the job plans again without it
        job.leading.commits.outer_witnesses[step] = got.witnesses
        self._when_complete(job, step)

    def _judge_claims(self, job: Job) -> str:
        """Once every device of the plan reported a checkpoint: judge each member's offered speed against its
        step times, as it reported them and as its neighbours saw them (issue #19). A member that overclaimed in
        :data:`claims.SUSTAINED_REPORTS` checkpoints in a row has its speed discounted (once per member); the
        restart reason, or ``""``."""
        me = self.ports.me
        compute = {peer: got for peer, (got, _) in job.leading.speed.measured.items()}
        job.leading.speed.seen = claims.seen_in_every_replica(job, compute, me)
        judged = claims.judged_times(job.leading.speed.measured, job.leading.speed.seen)
        reasons = self.ports.judge_speeds(job)  # its own clock first
        step_s = claims.own_step_total(job)
        found = [
            pair
            for the_plan in claims.pipelines(job)
            for pair in probation.disputes(the_plan, job.leading.speed.link_waits, me, step_s)
        ]
        contradicted = probation.suspects(found)  # their neighbours' views say nothing: probation settles it
        for peer in sorted(judged):
            if peer in contradicted:
                job.leading.speed.slow_reports[peer] = 0
                continue
            factor = claims.overclaim(judged, peer) if peer not in job.leading.speed.discounts else None
            job.leading.speed.slow_reports[peer] = (
                0 if factor is None else job.leading.speed.slow_reports.get(peer, 0) + 1
            )
            if factor is not None and job.leading.speed.slow_reports[peer] >= claims.SUSTAINED_REPORTS:
                job.leading.speed.discounts[peer] = factor  # planned again at the speed it showed
                log.warning(
                    "job %s: %s ran %.1fx slower than its offer; planning again at its measured speed",
                    job.job_id,
                    peer[:12],
                    factor,
                )
                reasons.append(
                    f"member {peer[:12]} ran {factor:.1f}x slower than its offer (measured against the "
                    "other members); planning again at its measured speed"
                )
        if job.plan is not None:
            settled = probation.judge(
                job.leading.probation, job.leading.speed.discounts, claims.pipelines(job), [] if reasons else found, me
            )
            if settled and not reasons:
                log.warning("job %s: %s", job.job_id, settled)
                reasons.append(settled)
        return "; ".join(reasons)


__all__ = ["ReportIntake", "ReportIntakePorts"]
