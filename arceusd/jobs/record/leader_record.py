"""What a job's leader keeps beside its core (``job.leading``), split by concern into small typed records, each
written by one part of the leader's side:

- :class:`LeaderLoop` (``job.leading.loop``): the leader's loop and the plan it starts: the core's queued long
  actions, the start under way, the started workers' addresses, the resume files, the measured links, and the
  recoveries (:mod:`arceusd.jobs.service.driver`, :mod:`arceusd.jobs.leader.starting`,
  :mod:`arceusd.jobs.leader.regrow`).
- :class:`CommitBook` (``job.leading.commits``): the members' checkpoint reports and witnesses gathered towards
  each commit, and the commits (the leader's judging of reports in :mod:`arceusd.jobs.leader.report_intake`;
  :mod:`arceusd.jobs.leader.commits`).
- :class:`ReportChecks` (``job.leading.checks``): what the leader refused, whom it excluded, and the shard shapes
  and magnitudes it checks reports against (:mod:`arceusd.jobs.leader.shard_checks`).
- :class:`SpeedBook` (``job.leading.speed``): the members' measured speed against their claims, and the speed
  challenges (:mod:`arceusd.jobs.judging.claims` through the report judging; :mod:`arceusd.jobs.leader.speed_checks`).
- :class:`ProbationBook` (``job.leading.probation``): members that contradict each other and the one planned alone
  beside the leader (:mod:`arceusd.jobs.leader.probation`).

Membership, the plan's devices and standby, and whom the owner announced the job to are the core's
(:class:`arceusd.jobs.core.machine.LeaderState`). All of it is empty on a device that never led the job.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TypedDict

import trio

from arceusd.jobs.core import actions
from arceusd.jobs.judging import challenges, claims
from protocol.job_wire import JobReport

MAX_CHECKPOINTS = 1000
"""Committed checkpoints a leader's job record keeps (step, wall clock): the newest ones, for the timeline."""


class RecoverySummary(TypedDict):
    """One recovery as ``arceusd status JOB --json`` shows it (``recoveries``)."""

    reason: str
    epoch: int
    lost_step: int
    resumed_step: int
    recomputed_steps: int
    first_step_after_s: float | None
    began_at: float
    phases: dict[str, float]
    first_step_at: float | None


@dataclass
class Recovery:
    """One repartition: why, from which checkpoint step, and how long until training ran again."""

    reason: str
    epoch: int
    lost_step: int
    resumed_step: int = -1
    began: float = field(default_factory=time.monotonic)
    began_at: float = field(default_factory=time.time)  # wall clock, for tools comparing with their own events
    first_step_after_s: float | None = None
    # Where the time went: seconds from ``began`` to the end of each phase ("planned": members reached and
    # the plan made; "sliced": the resume checkpoint re-sliced for it; "started": every worker listening;
    # "went": every device told to go). Kept for the last attempt of the incident.
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        """Record that ``phase`` ended now."""
        self.phases[phase] = round(time.monotonic() - self.began, 3)

    def summary(self) -> RecoverySummary:
        return {
            "reason": self.reason,
            "epoch": self.epoch,
            "lost_step": self.lost_step,
            "resumed_step": self.resumed_step,
            "recomputed_steps": max(0, self.lost_step - self.resumed_step),
            "first_step_after_s": self.first_step_after_s,
            "began_at": self.began_at,
            "phases": dict(self.phases),
            "first_step_at": None if self.first_step_after_s is None else self.began_at + self.first_step_after_s,
        }


class ShardEntry(TypedDict):
    """A member's checkpoint shard as its checked report described it (:mod:`arceusd.jobs.leader.shard_checks`)."""

    name: str
    sha256: str
    size: int


class Cursor(TypedDict):
    """Where the data sampler stood at a checkpoint (the first shard writer's report)."""

    epoch: int
    step: int


@dataclass
class LeaderLoop:
    """The leader's loop and the plan it starts (:mod:`arceusd.jobs.service.driver`,
    :mod:`arceusd.jobs.leader.starting`)."""

    queue: deque[actions.Action] = field(default_factory=deque)  # the core's long actions, run by the leader loop
    start_scope: trio.CancelScope | None = None  # while the leader starts a plan's workers
    go_addresses: dict[str, str] = field(default_factory=dict)  # the started workers' addresses (this epoch)
    resume_files: dict[str, str] = field(default_factory=dict)  # peer -> its resume file name (this epoch)
    links: dict[str, dict[str, float]] = field(default_factory=dict)  # its measured link to each member
    recoveries: list[Recovery] = field(default_factory=list)


@dataclass
class CommitBook:
    """The reports gathered towards each commit, and the commits (the leader's judging of reports in
    :mod:`arceusd.jobs.leader.report_intake`, :mod:`arceusd.jobs.leader.commits`)."""

    reports: dict[int, dict[str, ShardEntry]] = field(default_factory=dict)  # step -> peer -> shard
    cursors: dict[int, Cursor] = field(default_factory=dict)  # step -> the sampler's cursor
    witnesses: dict[int, dict[str, str]] = field(default_factory=dict)  # step -> peer -> digest (replicas)
    latest: dict[str, JobReport] = field(default_factory=dict)  # peer -> its latest checkpoint or witness report
    # as it came, once checked: what status shows of it (arceusd.jobs.record.report_fields)
    outer_witnesses: dict[int, dict[str, str]] = field(default_factory=dict)
    """DiLoCo witness disputes: step -> first-replica device -> the witness its shard holds (jobs.witness_shards;
    a step present but empty: being read)."""
    complete: dict[int, frozenset[str]] = field(default_factory=dict)
    """Checkpoint steps every device reported (shards and witnesses), with the other replicas' devices that hold
    what the first replica holds (empty for one pipeline): the step's commit was started."""
    committed_shards: dict[int, dict[str, str]] = field(default_factory=dict)  # step -> peer -> shard name
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # committed (step, unix time)
    standby_held: tuple[str, int] | None = None
    """The standby and the newest committed step it said it holds (``StandbyHeld``, after its copies were
    checked): what the leader knows of its standby's readiness (issue 31: it showed "syncing" for good)."""

    def record_checkpoint(self, step: int, at: float | None = None) -> None:
        """Checkpoint ``step`` was committed: keep it (and when) for the timeline, the newest
        :data:`MAX_CHECKPOINTS` of them; a step not above the last one kept is not recorded twice."""
        if self.checkpoints and step <= self.checkpoints[-1][0]:
            return
        self.checkpoints.append((step, time.time() if at is None else at))
        if len(self.checkpoints) > MAX_CHECKPOINTS:
            del self.checkpoints[: len(self.checkpoints) - MAX_CHECKPOINTS]


@dataclass
class ReportChecks:
    """What the leader refused and whom it excluded, and what it checks shard reports against
    (:mod:`arceusd.jobs.leader.shard_checks`)."""

    stale_reports: int = 0  # reports refused for an old plan epoch (e.g. from a peer that was declared dead)
    refused_reports: dict[str, int] = field(default_factory=dict)  # jobs.shard_checks.ReportProblem -> count
    excluded: dict[str, str] = field(default_factory=dict)  # peer -> why the leader excluded it
    shard_shapes: dict[int, dict[str, dict[str, tuple[int, ...]]]] = field(default_factory=dict)  # epoch -> plan's
    initial_magnitudes: dict[str, float] = field(default_factory=dict)  # param -> largest initial |value|
    magnitudes: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> param -> largest |value| seen


@dataclass
class SpeedBook:
    """The members' measured speed against their claims (:mod:`arceusd.jobs.judging.claims`, through the report
    judging) and their speed challenges (:mod:`arceusd.jobs.leader.speed_checks`)."""

    measured: dict[str, tuple[float, float]] = field(default_factory=dict)  # peer -> (step s, predicted s)
    waits: dict[str, float] = field(default_factory=dict)  # peer -> median link-wait seconds per step (its report)
    link_waits: dict[str, claims.LinkWaits] = field(default_factory=dict)  # peer -> its waits
    seen: dict[str, float] = field(default_factory=dict)  # peer -> its step seconds as its neighbours saw them
    discounts: dict[str, float] = field(default_factory=dict)  # peer -> its offered speed is divided by
    slow_reports: dict[str, int] = field(default_factory=dict)  # peer -> reports in a row that it overclaimed
    timed: dict[str, challenges.Timed] = field(default_factory=dict)  # peer -> its speed challenge (speed_checks)
    challenged: set[str] = field(default_factory=set)  # peers whose speed challenge was asked (once per job)
    challenging: bool = False  # a round of speed challenges is running


@dataclass
class ProbationBook:
    """Members that contradict each other, and the one planned alone beside the leader
    (:mod:`arceusd.jobs.leader.probation`)."""

    disputes: dict[tuple[str, ...], int] = field(default_factory=dict)  # members -> reports in a row
    member: str = ""  # the member planned alone with the leader now
    reports: int = 0  # checkpoints of its probation plan judged so far
    probed: set[str] = field(default_factory=set)  # members that were on probation (once per job)
    cleared: set[str] = field(default_factory=set)  # ...and kept to their offers there


@dataclass
class LeaderRecord:
    """What a job's leader keeps beside its core (``job.leading``), one record per concern (see the module
    docstring). Empty on a device that never led the job."""

    loop: LeaderLoop = field(default_factory=LeaderLoop)
    commits: CommitBook = field(default_factory=CommitBook)
    checks: ReportChecks = field(default_factory=ReportChecks)
    speed: SpeedBook = field(default_factory=SpeedBook)
    probation: ProbationBook = field(default_factory=ProbationBook)


__all__ = [
    "MAX_CHECKPOINTS",
    "CommitBook",
    "Cursor",
    "LeaderLoop",
    "LeaderRecord",
    "ProbationBook",
    "Recovery",
    "RecoverySummary",
    "ReportChecks",
    "ShardEntry",
    "SpeedBook",
]
