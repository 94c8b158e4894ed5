"""Committing a job's checkpoints on its leader, and repairing a committed step whose local copy is damaged.

Once every device of the plan reported a checkpoint step (:mod:`arceusd.jobs.leader.report_intake`), the job core asks
for its commit (``Commit``) and the leader carries it out (:meth:`Commits.commit`), one step at a time in step
order: it copies every shard here (bounded by the size checked in the report), checks their contents
(:mod:`arceusd.jobs.leader.shard_checks`), signs the manifest and issues the market's receipts
(:func:`arceusd.market.hooks.on_commit`), then tells the core, which decides what follows (the standby's copy, the
export at the last step, a retry of a failed final commit: :func:`arceusd.jobs.core.lifecycle.after_commit_failure`).
A shard its member does not serve within its report's size and :func:`fetch_deadline` fails the commit with
that member named (``CommitFailed.culprit``): the core excludes a member that does so twice in a row.
A commit that a repartition made moot is dropped.
Before a plan resumes from the newest commit, :meth:`Commits.repair_checkpoint` fetches from the members any
shard whose local copy is missing or corrupt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from arceusd.base.atomic_files import atomic_write
from arceusd.base.identity import Identity
from arceusd.files.checkpoint import (
    Manifest,
    ShardRecord,
    commit_manifest,
    file_matches,
    matches,
    step_dir,
)
from arceusd.jobs.common.ports import Feed, FetchShard, Leads, RequestRestart
from arceusd.jobs.core import Stamp, actions, events
from arceusd.jobs.leader import shard_checks
from arceusd.jobs.plans.recovery import corrupt_shards
from arceusd.jobs.record.job import Job

log = logging.getLogger(__name__)


FETCH_BASE_S = 60.0
FETCH_MIN_BYTES_PER_S = 1 << 20
"""A member serves its shard to the leader within :data:`FETCH_BASE_S` plus its size at this rate, else the commit
fails and the member is blamed for it (:data:`arceusd.jobs.core.machine.MAX_BLAMED_FAILURES` in a row exclude
it: issue #29 item 6)."""


def fetch_deadline(size: int) -> float:
    """Seconds a member has to serve a shard of ``size`` bytes to the leader."""
    return FETCH_BASE_S + size / FETCH_MIN_BYTES_PER_S


@dataclass(frozen=True)
class CommitsPorts:
    """What :class:`Commits` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    identity: Identity
    """This device's key (the manifest is signed with it)."""
    feed: Feed
    request_restart: RequestRestart
    leads: Leads
    fetch_shard: FetchShard
    """A member's shard of a step, copied from it (:mod:`arceusd.jobs.common.transfers`)."""
    on_commit: Callable[[Job, int, int, int], str | None]
    """The market's receipts for a committed step: ``(job, step, term, epoch)``; a reason to fail the job
    (``arceusd.market.hooks.on_commit``)."""


class Commits:
    """The leader's checkpoint commits (see the module docstring)."""

    def __init__(self, ports: CommitsPorts) -> None:
        self.ports = ports

    async def commit(self, job: Job, action: actions.Commit) -> None:
        """The core's ``Commit``: after ``action.delay_s`` (a retry), commit the step (:meth:`_commit_once`) and
        tell the core ``CommitDone`` or ``CommitFailed`` (it retries a final checkpoint, then fails the job:
        :func:`arceusd.jobs.core.lifecycle.after_commit_failure`; an earlier one is superseded by the next)."""
        async with job.commit_lock:  # one at a time, in step order (trio's lock is fair): receipts chain
            if action.delay_s:
                await trio.sleep(action.delay_s)
            if self._commit_moot(job, action.stamp):
                return  # repartitioned meanwhile, or the job ended while this one waited (e.g. its budget is spent)
            error, stop, culprit = await self._commit_once(job, action.step, action.stamp)
            if self._commit_moot(job, action.stamp):
                return
            if error is not None:
                log.warning("job %s: checkpoint %d not committed: %s", job.job_id, action.step, error)
                self.ports.feed(job, events.CommitFailed(action.stamp, action.step, error, culprit))
                return
            self.ports.feed(job, events.CommitDone(action.stamp, action.step))
            if stop is not None and action.step < job.total_steps:
                self.ports.feed(job, events.Fail(stop))  # the job's budget is spent (market)

    def _commit_moot(self, job: Job, stamp: Stamp) -> bool:
        """Whether a commit of plan ``stamp`` no longer counts: a repartition began (a member failed, was
        excluded or left: the new plan resumes from the last commit before it), or the job ended."""
        return job.core.stamp != stamp or job.plan is None or job.core.terminal or not self.ports.leads(job)

    async def _commit_once(self, job: Job, step: int, stamp: Stamp) -> tuple[str | None, str | None, str]:
        """Copy every shard of ``step`` to the leader, check it, sign the manifest, issue the receipts. Returns
        why it failed (or None: committed, or moot), why the job must stop (its budget is spent) or None, and the
        member whose shard could not be copied (or ``""``)."""
        root = job.paths.checkpoints
        records, names = [], {}
        for peer, shard in sorted(job.leading.commits.reports.get(step, {}).items()):
            record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))
            names[peer] = record.name
            path = step_dir(root, step) / record.name
            if peer != self.ports.me and not await trio.to_thread.run_sync(file_matches, path, record):
                with trio.move_on_after(fetch_deadline(record.size)):
                    data = await self.ports.fetch_shard(job, peer, step, record)
                if data is None:  # refused (more than its report said), not served, or too slowly: its doing
                    return (
                        (
                            f"could not copy shard {record.name} of step {step} from {peer[:12]} within "
                            f"{fetch_deadline(record.size):.0f} s and its {record.size} bytes"
                        ),
                        None,
                        peer,
                    )
                await trio.to_thread.run_sync(atomic_write, path, data)
            records.append(record)
        if self._commit_moot(job, stamp):
            return None, None, ""  # the new plan resumes from an earlier step
        if job.plan is None or len(records) != sum(len(st.shares) for st in job.plan.stages):
            return f"checkpoint {step} has {len(records)} shard(s), not one per place in the plan", None, ""
        try:
            refused = await shard_checks.check_contents(job, step_dir(root, step), step, self.ports.me)
        except (OSError, RuntimeError) as exc:  # this device's trouble (FileworkError too): nobody is excluded
            return f"checkpoint {step} not checked: {exc}", None, ""
        if refused is not None and not self._commit_moot(job, stamp):  # a non-finite or misshapen shard
            self.ports.request_restart(job, refused)
        if refused is not None or self._commit_moot(job, stamp):
            return None, None, ""  # never committed
        cursor = {"cursor": job.leading.commits.cursors.get(step)}
        manifest = Manifest(job.job_id, stamp.term, stamp.epoch, step, tuple(records), cursor)
        try:
            await trio.to_thread.run_sync(self._commit_manifest, root, manifest, job.spec.checkpoint.keep)
        except Exception as exc:  # CheckpointError: a shard that does not match its report
            return f"checkpoint {step} not committed: {exc}", None, ""
        stop = self.ports.on_commit(job, step, stamp.term, stamp.epoch)  # receipts; the reason a budget is spent
        job.leading.commits.record_checkpoint(step)
        job.leading.commits.committed_shards = {step: names}  # what the standby copies and the export reads
        for done in [
            s
            for s in {*job.leading.commits.reports, *job.leading.commits.witnesses, *job.leading.commits.complete}
            if s <= step
        ]:
            job.leading.commits.reports.pop(done, None)
            job.leading.commits.cursors.pop(done, None)
            job.leading.commits.witnesses.pop(done, None)
            job.leading.commits.outer_witnesses.pop(done, None)
            job.leading.commits.complete.pop(done, None)
        log.info("job %s: checkpoint %d committed", job.job_id, step)
        return None, stop, ""

    def _commit_manifest(self, root: Path, manifest: Manifest, keep: int) -> None:
        """Check the shards against ``manifest`` and sign it (a thread: file reads and hashing)."""
        commit_manifest(root, manifest, self.ports.identity, keep)

    async def repair_checkpoint(self, job: Job) -> list[Path]:
        """Copy from members every shard of the newest committed step whose local copy is missing or corrupt;
        return the replica roots to read them from (empty when the local copies are intact)."""
        root = job.paths.checkpoints
        step, bad = await trio.to_thread.run_sync(corrupt_shards, root, sorted(job.leaders))
        if not bad:
            return []
        replicas = job.paths.replicas
        for record in bad:
            log.warning(
                "job %s: shard %s of step %d is missing or corrupt here; fetching a replica",
                job.job_id,
                record.name,
                step,
            )
            for peer in sorted(job.members):
                if peer == self.ports.me:
                    continue
                data = await self.ports.fetch_shard(job, peer, step, record)
                if data is not None and matches(data, record):
                    await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / record.name, data)
                    break
            else:
                log.warning("job %s: no member has an intact copy of %s", job.job_id, record.name)
        manifest = step_dir(root, step) / "manifest.json"
        await trio.to_thread.run_sync(atomic_write, step_dir(replicas, step) / "manifest.json", manifest.read_bytes())
        return [replicas]


__all__ = ["FETCH_BASE_S", "FETCH_MIN_BYTES_PER_S", "Commits", "fetch_deadline"]
