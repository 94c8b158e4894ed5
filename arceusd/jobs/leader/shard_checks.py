"""What the leader takes from a member's checkpoint report, and what it does with a member whose report or shard
fails (issue #19 items 1, 3 and 4).

A member reports a shard as ``(name, sha256, size)``, the :class:`protocol.job_wire.ReportShard` of its
:class:`protocol.job_wire.JobReport` (types and lengths checked by the codec). None of it becomes a path or a
download bound as sent:

- the file name is derived here from the plan: the reporter's stage and rank (:func:`expected_shard_name`, the
  same :func:`arceusd.files.checkpoint.shard_file_name` its worker writes under); a report naming another file (a path,
  another stage's shard) is refused;
- the size must be at most what the plan implies for that share (:func:`shard_size_bound`: its stage's blocks'
  parameter and optimizer bytes from the planner's inputs, computed on this device, with a margin for the file's
  header), so a claim of 16 GiB is refused before any byte is downloaded; the download is then bounded by that
  checked size (:meth:`arceusd.jobs.common.transfers.Transfers.fetch_shard`);
- the digest is a sha256 in hex, the step one of the job's.

A refused report is dropped and counted under its :class:`ReportProblem` (``refused_reports`` in ``arceusd status
JOB``); its sender is excluded from the job (:func:`exclude`: named under ``excluded``, out of the members, not let
back in), and the leader repartitions from the last good checkpoint. The same happens to a member whose committed
shard holds non-finite values or tensors of the wrong shape (:func:`arceusd.jobs.judging.shard_scan.scan_shard`), or
values further from the last committed checkpoint's than the optimizer can move them in the steps between
(:mod:`arceusd.jobs.judging.plausibility`, issue #29 item 8: finite poison such as 1e30 everywhere).
"""

from __future__ import annotations

import enum
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from arceusd.files.checkpoint import shard_file_name, step_dir
from arceusd.jobs.core import JobState
from arceusd.jobs.judging.plausibility import implausible, merge
from arceusd.jobs.judging.shard_scan import ShardScanError, scan_all, scan_shard
from arceusd.jobs.plans.planning import encode_start
from arceusd.jobs.procs import filework
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.leader_record import ShardEntry
from protocol.job_wire import JobReport

if TYPE_CHECKING:
    from partitioner import Plan, PlanInputs

SIZE_MARGIN = 2
"""A shard holds its share's parameters and optimizer state (what the planner's inputs count), plus a little."""
HEADER_ALLOWANCE = 1 << 20
"""Bytes allowed beyond that for the safetensors header, metadata and small scalar state."""
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_EXCLUDED_REASON = 300


class ReportProblem(enum.Enum):
    """Why a member's checkpoint report (or the shard it names) was refused: the counter key in ``status``."""

    MALFORMED = "malformed"
    NOT_IN_PLAN = "not_in_plan"
    STEP = "step"
    NAME = "shard_name"
    SIZE = "shard_size"
    DIGEST = "shard_digest"
    CONTENT = "shard_content"
    WITNESS = "replica_witness"


class ReportRefused(Exception):
    """A report or shard the leader does not take; ``problem`` is the counter key, the message says why."""

    def __init__(self, problem: ReportProblem, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem


def plan_position(plan: Plan, peer: str) -> tuple[int, int] | None:
    """``(stage, rank)`` of ``peer`` in ``plan`` (the order the workers use), or None when it holds no share."""
    for s, stage in enumerate(plan.stages):
        for r, share in enumerate(stage.shares):
            if share.peer_id == peer:
                return s, r
    return None


def expected_shard_name(plan: Plan, peer: str) -> str | None:
    """The file name ``peer``'s worker writes its shard under in ``plan``."""
    position = plan_position(plan, peer)
    return None if position is None else shard_file_name(*position)


def shard_size_bound(plan: Plan, inputs: PlanInputs | None, peer: str) -> int | None:
    """The most bytes ``peer``'s shard may have under ``plan``: its stage's blocks' parameter and optimizer bytes
    (the planner's inputs, computed here from the spec) times :data:`SIZE_MARGIN`, plus :data:`HEADER_ALLOWANCE`.
    A tensor-parallel share holds part of that; a whole stage is the bound for each."""
    position = plan_position(plan, peer)
    if position is None or inputs is None:
        return None
    stage = plan.stages[position[0]]
    state = sum(b.param_bytes + b.optimizer_bytes for b in inputs.blocks[stage.start : stage.end])
    return int(state) * SIZE_MARGIN + HEADER_ALLOWANCE


def check_checkpoint_report(job: Job, peer: str, report: JobReport) -> tuple[int, ShardEntry]:
    """The step and the shard record (name derived from the plan, size and digest checked) of ``peer``'s
    checkpoint report (its typed fields, as the codec bounded them); :class:`ReportRefused` names what is wrong."""
    if job.plan is None:
        raise ReportRefused(ReportProblem.NOT_IN_PLAN, "no plan is running")
    name = expected_shard_name(job.plan, peer)
    bound = shard_size_bound(job.plan, job.inputs, peer)
    if name is None or bound is None:
        raise ReportRefused(ReportProblem.NOT_IN_PLAN, f"{peer[:12]} holds no share of the current plan")
    step = report.step
    if step is None or not 0 < step <= job.total_steps:
        raise ReportRefused(
            ReportProblem.STEP, f"checkpoint step {str(step)[:40]!r} is not one of the job's steps 1..{job.total_steps}"
        )
    shard = report.shard
    if shard is None:
        raise ReportRefused(ReportProblem.MALFORMED, "a checkpoint report without its shard record")
    if shard.name != name:
        raise ReportRefused(
            ReportProblem.NAME, f"shard named {shard.name[:80]!r}; its place in the plan writes {name!r}"
        )
    if not 0 < shard.size <= bound:
        raise ReportRefused(
            ReportProblem.SIZE,
            f"shard size {str(shard.size)[:40]} is outside 1..{bound} bytes, what its share of the plan holds",
        )
    if _SHA256.fullmatch(shard.sha256) is None:
        raise ReportRefused(ReportProblem.DIGEST, "the shard's sha256 is not 64 lowercase hex characters")
    return step, ShardEntry(name=name, sha256=shard.sha256, size=shard.size)


def exclude(job: Job, peer: str, refused: ReportRefused) -> str:
    """Count ``refused``, name ``peer`` as excluded from ``job`` and take it out of the members (it is not let
    back in: :func:`is_excluded`); returns the reason to repartition with."""
    problem = refused.problem.value
    job.leading.checks.refused_reports[problem] = job.leading.checks.refused_reports.get(problem, 0) + 1
    why = f"member {peer} excluded: {refused}"[:MAX_EXCLUDED_REASON]
    job.leading.checks.excluded.setdefault(peer, why)
    job.drop_member(peer)  # never invited back
    return why


def is_excluded(job: Job, peer: str) -> bool:
    return peer in job.leading.checks.excluded


async def plan_shapes(job: Job) -> dict[str, dict[str, tuple[int, ...]]]:
    """The parameter shapes each place in the job's current plan implies (peer -> name -> shape), computed once
    per plan epoch in a child process (:func:`arceusd.jobs.procs.filework.plan_shapes`) and kept on the job.
    :class:`RuntimeError` when no plan runs or the child failed."""
    async with job.shapes_lock:  # one child per plan, whoever asks first (the prefetch or the first commit)
        epoch, plan, inputs = job.epoch, job.plan, job.inputs
        if plan is None or inputs is None:
            raise RuntimeError("no plan is running to check the shards against")
        shapes = job.leading.checks.shard_shapes.get(epoch)
        if shapes is None:
            _, plan_data = encode_start(inputs, plan)
            shapes, initial = await filework.plan_shapes(job.spec_bytes, plan_data)
            job.leading.checks.initial_magnitudes = initial  # the job's initial values: the same for every plan
            if job.epoch == epoch and job.plan is plan:  # (a replica dropped or rebuilt meanwhile: not its shapes)
                job.leading.checks.shard_shapes = {epoch: shapes}  # only the current plan's
        return shapes


PREFETCH_AFTER_S = 30.0
"""The longest the shapes wait for the plan to run before they are computed anyway."""


async def prefetch_shapes(job: Job) -> None:
    """Compute the plan's shapes once its workers run, so the first commit of a plan does not wait for a child
    process (a first checkpoint used to lag the workers by 7 s on two busy cores). Not while they start: building
    the reference model beside a recovery's re-slicing took a stock Llama's re-slice from 0.5 to 4 s."""
    epoch = job.epoch
    with trio.move_on_after(PREFETCH_AFTER_S):
        while job.epoch == epoch and job.state in (JobState.PLANNING, JobState.STARTING, JobState.RECOVERING):
            await trio.sleep(0.1)
    if job.epoch != epoch:
        return  # another plan: its own prefetch computes its shapes
    try:
        await plan_shapes(job)
    except (RuntimeError, OSError) as exc:  # the first commit tries again and says so
        logging.getLogger(__name__).warning("job %s: the plan's shard shapes: %s", job.job_id, exc)


async def check_contents(job: Job, folder: Path, step: int, me: str) -> str | None:
    """Check every shard of ``step`` (copied into ``folder``) for finite values and the shapes of its writer's
    place in the plan (:func:`arceusd.jobs.judging.shard_scan.scan_shard`, in a thread; the shapes are computed once per
    plan epoch in a child process, :func:`arceusd.jobs.procs.filework.plan_shapes`), and for values training could
    have reached from the last commit (:func:`reference_magnitudes`,
    :func:`arceusd.jobs.judging.plausibility.implausible`); exclude each member whose shard fails. Returns the reason to
    repartition from the last good checkpoint, or None when all pass.

    Error handling: :class:`OSError` when a copied shard cannot be read here and
    :class:`arceusd.jobs.procs.filework.FileworkError` when the shapes could not be computed (a :class:`RuntimeError`,
    as is no running plan): this device's trouble,
    not the member's, so nobody is excluded and the commit fails (the next checkpoint supersedes it)."""
    if job.plan is None:
        raise RuntimeError("no plan is running to check the shards against")
    shapes = await plan_shapes(job)
    start, reference = await reference_magnitudes(job, folder.parent)
    reasons, found = [], {}
    for peer, shard in sorted(job.leading.commits.reports.get(step, {}).items()):
        expected = shapes.get(peer)
        try:
            if expected is None:
                raise ShardScanError("holds no place in the plan")
            magnitudes = await trio.to_thread.run_sync(scan_shard, folder / str(shard["name"]), expected)
            why = None if reference is None else implausible(job.spec.training, start, step, reference, magnitudes)
            if why is None:
                found[peer] = magnitudes
                continue
        except ShardScanError as exc:
            why = str(exc)
        refused = ReportRefused(ReportProblem.CONTENT, f"checkpoint {step}: {why}")
        if peer == me:  # this device's own worker: no one to exclude; the restarts are bounded
            counts, key = job.leading.checks.refused_reports, ReportProblem.CONTENT.value
            counts[key] = counts.get(key, 0) + 1
            reasons.append(f"this device's own shard failed its check: {refused}")
        else:
            reasons.append(exclude(job, peer, refused))
    if not reasons:  # the reference of the next check once this step is committed
        job.leading.checks.magnitudes = {s: m for s, m in job.leading.checks.magnitudes.items() if s == start}
        job.leading.checks.magnitudes[step] = merge(found)
    return "; ".join(reasons)[: MAX_EXCLUDED_REASON * 2] if reasons else None


async def reference_magnitudes(job: Job, root: Path) -> tuple[int, dict[str, float] | None]:
    """The step a new checkpoint is checked against (the newest committed one) and each parameter's largest
    value there: kept from its own check, read again from its shards under ``root`` (a leader that took over, an
    owner that restarted), or the job's initial values before the first commit (from the plan's shapes child).
    None when none can be had (its shards unreadable here): the values are then not judged."""
    start = job.committed_step
    if start == 0:
        return 0, job.leading.checks.initial_magnitudes or None
    kept = job.leading.checks.magnitudes.get(start)
    if kept is not None:
        return start, kept
    try:
        found = await trio.to_thread.run_sync(scan_all, step_dir(root, start))
    except (OSError, ShardScanError) as exc:
        logging.getLogger(__name__).warning(
            "job %s: checkpoint %d's values cannot be read to judge the next: %s", job.job_id, start, exc
        )
        return start, None
    job.leading.checks.magnitudes[start] = merge(found)
    return start, job.leading.checks.magnitudes[start]


__all__ = [
    "HEADER_ALLOWANCE",
    "SIZE_MARGIN",
    "ReportProblem",
    "ReportRefused",
    "check_checkpoint_report",
    "check_contents",
    "exclude",
    "expected_shard_name",
    "is_excluded",
    "plan_position",
    "plan_shapes",
    "prefetch_shapes",
    "reference_magnitudes",
    "shard_size_bound",
]
