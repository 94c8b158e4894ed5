"""The leader's decisions at the edges of a job's life (pure: no I/O, no clock, no trio).

Owns what the leader does when a checkpoint commit fails (:func:`after_commit_failure`), when members do not
acknowledge ``go`` (:func:`after_go`), which replica a lost device takes down with it (:func:`replica_to_drop`),
and which job states end its election (:func:`ends_election`).
The job core (:class:`arceusd.jobs.core.JobCore`) asks them and returns the decision as actions.

Why these exist: a failed commit of the *final* checkpoint used to set only ``job.error``, and the job stayed
``running`` forever (no later checkpoint comes to supersede it); replies to ``go`` were dropped, so a member
whose ``go`` was lost kept an idle worker while its neighbours waited on it; and a finished job's election was
never untracked, so its leader heartbeated until the daemon restarted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from arceusd.jobs.core.states import TERMINAL

FINAL_COMMIT_ATTEMPTS = 3
"""How many times the leader tries to commit the final checkpoint before the job fails."""

COMMIT_RETRY_S = (1.0, 3.0)
"""Pause before the second and third attempt (a member busy or briefly unreachable gets time to answer)."""

GO_ATTEMPTS = 2
"""How many times ``go`` is sent to a member that did not acknowledge it before the plan is restarted."""


@dataclass(frozen=True, slots=True)
class RetryCommit:
    """Try the commit again after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class FailJob:
    """End the job as failed with ``error`` (one line: what went wrong and what to do)."""

    error: str


@dataclass(frozen=True, slots=True)
class KeepRunning:
    """An intermediate checkpoint failed: record ``error``; the next checkpoint supersedes this one."""

    error: str


CommitDecision = RetryCommit | FailJob | KeepRunning


def after_commit_failure(step: int, total_steps: int, attempt: int, error: str) -> CommitDecision:
    """What to do after attempt number ``attempt`` (1-based) to commit checkpoint ``step`` failed with ``error``.

    Intermediate checkpoints are not retried (training goes on and the next one is committed instead). The
    final one has nothing after it: it is retried :data:`FINAL_COMMIT_ATTEMPTS` times, then the job fails
    saying so (never ``running`` forever)."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if step < total_steps:
        return KeepRunning(error)
    if attempt < FINAL_COMMIT_ATTEMPTS:
        return RetryCommit(COMMIT_RETRY_S[min(attempt, len(COMMIT_RETRY_S)) - 1])
    return FailJob(
        f"the final checkpoint (step {step}) could not be committed after {attempt} attempts: {error}; "
        "the members' shards of earlier checkpoints are kept, submit the job again to retrain"
    )


@dataclass(frozen=True, slots=True)
class GoAcknowledged:
    """Every member acknowledged ``go``: the plan runs."""


@dataclass(frozen=True, slots=True)
class ResendGo:
    """Send ``go`` again to ``peers`` (their answer was lost, or never came)."""

    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RestartPlan:
    """Members still did not acknowledge ``go``: repartition (their workers would wait forever)."""

    reason: str


GoDecision = GoAcknowledged | ResendGo | RestartPlan


def after_go(unacknowledged: Mapping[str, str], attempt: int) -> GoDecision:
    """What to do after round ``attempt`` (1-based) of ``go`` left ``unacknowledged`` (peer -> why: a refusal's
    reason, or that no answer came). A member takes ``go`` once per epoch, so sending it again is safe."""
    if not unacknowledged:
        return GoAcknowledged()
    if attempt < GO_ATTEMPTS:
        return ResendGo(tuple(sorted(unacknowledged)))
    why = "; ".join(f"{peer[:12]}: {reason}" for peer, reason in sorted(unacknowledged.items()))
    return RestartPlan(f"go not acknowledged after {attempt} attempts ({why})")


def ends_election(state: str) -> bool:
    """Whether a job in ``state`` is over, so this device stops taking part in its leader election."""
    return state in TERMINAL


def replica_to_drop(replicas: tuple[tuple[str, ...], ...], lost: str, leader: str) -> int | None:
    """The data-parallel replica to drop because ``lost`` (a device, or its worker) is gone, so that the other
    replicas train on (the leader's own replica too: its worker retires and serves the others' data); None when
    the whole job must replan instead: one pipeline, a device in no replica or in several, or the leader's own
    worker (it serves the data)."""
    if len(replicas) < 2 or lost == leader:
        return None
    holding = [i for i, devices in enumerate(replicas) if lost in devices]
    return holding[0] if len(holding) == 1 else None


__all__ = [
    "COMMIT_RETRY_S",
    "FINAL_COMMIT_ATTEMPTS",
    "GO_ATTEMPTS",
    "CommitDecision",
    "FailJob",
    "GoAcknowledged",
    "GoDecision",
    "KeepRunning",
    "ResendGo",
    "RestartPlan",
    "RetryCommit",
    "after_commit_failure",
    "after_go",
    "ends_election",
    "replica_to_drop",
]
