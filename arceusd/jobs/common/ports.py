"""The callables the job I/O layer's parts are handed (issue 32: ports, not back-pointers).

Each part of ``leader/``, ``member/`` and ``service/`` declares, next to itself, a frozen dataclass of exactly
what it uses (``CommitPorts`` beside :class:`arceusd.jobs.leader.commits.Commits`, and so on); the composition root
(:class:`arceusd.jobs.service.manager.JobManager`) builds each one from its own methods and the shared state. This
module names the shapes those ports share, so that a part's port reads as a list of verbs: feed the core, ask for a
restart, spawn a task, check a leader's command. It imports nothing of ``leader``, ``member`` or ``service``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NotRequired, Protocol, TypedDict

from arceusd.jobs.common.transfers import Described
from arceusd.jobs.core import actions, events, leadership
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.record.job import Job
from protocol.envelope import Header
from protocol.job_wire import JobAck, JobReport


class JoinResult(TypedDict):
    """What asking to join a job came to (the control method ``join``; ``retry``: the leader asks to try again
    later, absent where this device owns the job)."""

    job_id: str
    accepted: bool
    reason: str
    retry: NotRequired[bool]


Feed = Callable[[Job, events.Event], list[actions.Action]]
"""Hand the job's core an event and carry out what it answers; the actions, for the caller's answers
(:meth:`arceusd.jobs.service.driver.Driver.feed`)."""

RequestRestart = Callable[[Job, str], None]
"""Ask the core to repartition the job, with the reason (the first reason wins until the new plan runs)."""

Leads = Callable[[Job], bool]
"""Whether this device leads the job."""

OwnOffer = Callable[[], Awaitable[Offer]]
"""This device's offer (measured once, in a child process)."""

Commanded = Callable[[Header, str], Awaitable[Job | JobAck]]
"""The job a leader's command names, or the answer refusing it
(:meth:`arceusd.jobs.common.manager_base.JobContext.commanded`)."""

TakeReport = Callable[[Job, str, JobReport], Awaitable[None]]
"""The leader's side of one report from a device of the plan
(:meth:`arceusd.jobs.leader.report_intake.ReportIntake.take`): what the member's side calls for this device's own
worker when it leads."""

FetchShard = Callable[[Job, str, int, Described], Awaitable[bytes | None]]
"""A member's checkpoint shard of a step, fetched from it (:meth:`arceusd.jobs.common.transfers.Transfers.fetch_shard`;
None when it did not serve it)."""


class Spawn(Protocol):
    """Run ``fn(*args)`` in the job service's nursery; a failure is logged, never allowed to take the daemon down
    (:meth:`arceusd.jobs.common.manager_base.JobContext.spawn`)."""

    def __call__(self, fn: Callable[..., Awaitable[object]], /, *args: object) -> None: ...


class CheckLeader(Protocol):
    """Why a leader's command for the job must be refused, None when it is acceptable
    (:meth:`arceusd.jobs.common.manager_base.JobContext.check_leader`)."""

    async def __call__(self, header: Header, job: Job, epochs: bool = True) -> leadership.Refuse | None: ...


__all__ = [
    "CheckLeader",
    "Commanded",
    "Feed",
    "FetchShard",
    "JoinResult",
    "Leads",
    "OwnOffer",
    "RequestRestart",
    "Spawn",
    "TakeReport",
]
