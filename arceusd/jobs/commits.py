"""Committing a job's checkpoints on its leader, and repairing a committed step whose local copy is damaged.

Once every device of the plan reported a checkpoint step (:mod:`arceusd.jobs.local_worker`), the leader commits
it (:meth:`Commits.commit_checkpoint`), one step at a time in step order: it copies every shard here (bounded by
the size checked in the report), checks their contents (:mod:`arceusd.jobs.shard_checks`), signs the manifest,
issues the market's receipts (:func:`arceusd.market.hooks.on_commit`), sends the standby its copy and, at the last
step, hands the owner the final checkpoint and exports the model. A commit that a repartition made moot is
dropped; a failed final commit is retried, then fails the job (:func:`arceusd.jobs.lifecycle.after_commit_failure`).
Before a plan resumes from the newest commit, :meth:`Commits.repair_checkpoint` fetches from the members any
shard whose local copy is missing or corrupt.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import trio

from arceusd.jobs import lifecycle, shard_checks
from arceusd.jobs.job import TERMINAL, Job
from arceusd.jobs.manager_base import JobContext, Lifecycle
from arceusd.jobs.standby_sync import StandbySyncing
from arceusd.market.hooks import on_commit

log = logging.getLogger(__name__)


class Commits:
    """The leader's checkpoint commits (see the module docstring)."""

    def __init__(self, ctx: JobContext, life: Lifecycle, standbys: StandbySyncing) -> None:
        self.ctx = ctx
        self.life = life
        self.standbys = standbys

    async def commit_checkpoint(self, job: Job, step: int, term: int, epoch: int) -> None:
        """Commit ``step`` (:meth:`_commit_once`); a failure of the final checkpoint is retried, then fails the
        job (:func:`arceusd.jobs.lifecycle.after_commit_failure`); an earlier one is superseded by the next."""
        async with job.commit_lock:  # one at a time, in step order (trio's lock is fair): receipts chain
            await self._commit_in_turn(job, step, term, epoch)

    async def _commit_in_turn(self, job: Job, step: int, term: int, epoch: int) -> None:
        attempt = 0
        while True:
            if self._commit_moot(job, epoch):
                return  # repartitioned meanwhile, or the job ended while this one waited (e.g. its budget is spent)
            error = await self._commit_once(job, step, term, epoch)
            if error is None or self._commit_moot(job, epoch):
                return
            attempt += 1
            decision = lifecycle.after_commit_failure(step, job.total_steps, attempt, error)
            log.warning("job %s: checkpoint %d not committed (attempt %d): %s", job.job_id, step, attempt, error)
            if isinstance(decision, lifecycle.RetryCommit):
                await trio.sleep(decision.delay_s)
            elif isinstance(decision, lifecycle.FailJob):
                await self.life.finish(job, "failed", decision.error)
                return
            else:
                job.error = decision.error
                return

    def _commit_moot(self, job: Job, epoch: int) -> bool:
        """Whether a commit of plan ``epoch`` no longer counts: a repartition was asked for (a member failed, was
        excluded or left: the new plan resumes from the last commit before it) or ran, or the job ended."""
        return (job.epoch != epoch or job.plan is None or bool(job.restart_reason) or job.state in TERMINAL
                or not self.ctx.leads(job))  # fmt: skip

    async def _commit_once(self, job: Job, step: int, term: int, epoch: int) -> str | None:
        """Copy every shard of ``step`` to the owner, check it, sign the manifest; export at the last step.
        Returns why it failed, or None (committed, or moot: repartitioned meanwhile)."""
        from arceusd.checkpoint import Manifest, ShardRecord, atomic_write, file_matches, step_dir

        root = job.directory / "checkpoints"
        records, for_standby = [], []
        for peer, shard in sorted(job.reports.get(step, {}).items()):
            record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))
            if peer != job.standby:
                for_standby.append(record.name)
            path = step_dir(root, step) / record.name
            if peer != self.ctx.node.identity.peer_id and not await trio.to_thread.run_sync(file_matches, path, record):
                data = await self.ctx.transfers.fetch_shard(job, peer, step, record)
                if data is None:
                    return f"could not copy shard {record.name} of step {step} from {peer[:12]}"
                await trio.to_thread.run_sync(atomic_write, path, data)
            records.append(record)
        if self._commit_moot(job, epoch):
            return None  # the new plan resumes from an earlier step
        if job.plan is None or len(records) != sum(len(st.shares) for st in job.plan.stages):
            return f"checkpoint {step} has {len(records)} shard(s), not one per place in the plan"  # never committed
        try:
            refused = await shard_checks.check_contents(job, step_dir(root, step), step, self.ctx.node.identity.peer_id)
        except (OSError, RuntimeError) as exc:  # this device's trouble (FileworkError too): nobody is excluded
            return f"checkpoint {step} not checked: {exc}"
        if refused is not None and not self._commit_moot(job, epoch):  # a non-finite or misshapen shard
            self.life.request_restart(job, refused)
        if refused is not None or self._commit_moot(job, epoch):
            return None  # never committed
        manifest = Manifest(job.job_id, term, epoch, step, tuple(records), {"cursor": job.cursors.get(step)})
        try:
            await trio.to_thread.run_sync(self._commit_manifest, root, manifest, job.spec.checkpoint.keep)
        except Exception as exc:  # CheckpointError: a shard that does not match its report
            return f"checkpoint {step} not committed: {exc}"
        stop = on_commit(self.ctx.node, job, step, term, epoch)  # receipts; a reason when the budget is spent (market)
        job.committed_step = max(job.committed_step, step)
        job.record_checkpoint(step)
        for done in [s for s in {*job.reports, *job.witnesses, *job.complete} if s <= step]:
            job.reports.pop(done, None)
            job.cursors.pop(done, None)
            job.witnesses.pop(done, None)
            job.complete.pop(done, None)
        log.info("job %s: checkpoint %d committed", job.job_id, step)
        if job.standby and step < job.total_steps:
            self.ctx.spawn(self.standbys.sync_standby, job, step, tuple(for_standby))
        if step >= job.total_steps:
            await self.standbys.sync_owner(job, step, [r.name for r in records])
            await self.life.export(job, step, [step_dir(root, step) / r.name for r in records])
        elif stop is not None:
            await self.life.finish(job, "failed", stop)
        elif job.rebalance and job.epoch == epoch:
            self.life.request_restart(job, "rebalancing onto the member(s) that joined")
        return None

    def _commit_manifest(self, root: Path, manifest: Any, keep: int) -> None:
        """Check the shards against ``manifest`` and sign it (a thread: file reads and hashing)."""
        from arceusd.checkpoint import commit_manifest

        commit_manifest(root, manifest, self.ctx.node.identity, keep)

    async def repair_checkpoint(self, job: Job) -> list[Path]:
        """Copy from members every shard of the newest committed step whose local copy is missing or corrupt;
        return the replica roots to read them from (empty when the local copies are intact)."""
        from arceusd.checkpoint import atomic_write, matches, step_dir
        from arceusd.jobs.recovery import corrupt_shards

        root = job.directory / "checkpoints"
        step, bad = await trio.to_thread.run_sync(corrupt_shards, root, sorted(job.leaders))
        if not bad:
            return []
        replicas = job.directory / "replicas"
        for record in bad:
            log.warning("job %s: shard %s of step %d is missing or corrupt here; fetching a replica",
                        job.job_id, record.name, step)  # fmt: skip
            for peer in sorted(job.members):
                if peer == self.ctx.node.identity.peer_id:
                    continue
                data = await self.ctx.transfers.fetch_shard(job, peer, step, record)
                if data is not None and matches(data, record):
                    await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / record.name, data)
                    break
            else:
                log.warning("job %s: no member has an intact copy of %s", job.job_id, record.name)
        manifest = step_dir(root, step) / "manifest.json"
        await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / "manifest.json", manifest.read_bytes())
        return [replicas]


__all__ = ["Commits"]
