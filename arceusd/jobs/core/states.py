"""A job's states and roles, and its stamp: the one place for the (term, epoch) every leader command carries.

:class:`JobState` and :class:`Role` are string enums whose values are what users see in ``arceusd status`` and
the dashboard (unchanged from the free strings they replace, so JSON and comparisons with those strings still
hold). :class:`Stamp` orders leader commands: a new term per repartition or new leader, a new epoch per plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class JobState(enum.StrEnum):
    """Where a job is. The owner/leader: ``waiting`` -> ``planning`` -> ``starting`` -> ``running`` -> ``done``,
    ``recovering`` while it repartitions, ``paused`` when no plan fits the survivors (or the leader is gone);
    ``failed`` and ``cancelled`` end it too. A member mirrors what its leader tells it."""

    WAITING = "waiting"
    PLANNING = "planning"
    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    PAUSED = "paused"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # a member's (or a stranger's) view
    ANNOUNCED = "announced"
    JOINED = "joined"
    LEFT = "left"
    REPLANNING = "replanning"
    STOPPED = "stopped"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL: frozenset[JobState] = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
"""States a job never leaves."""

LEADING_STATES: frozenset[JobState] = frozenset(
    {JobState.RUNNING, JobState.STARTING, JobState.RECOVERING, JobState.PLANNING}
)
"""States in which a leader has (or is making) a plan: a member that joins now waits for the next checkpoint."""


class Role(enum.StrEnum):
    """This device's part in a job: it submitted it (``owner``), joined it (``member``) or only heard of it."""

    OWNER = "owner"
    MEMBER = "member"
    SEEN = "seen"


@dataclass(frozen=True, slots=True, order=True)
class Stamp:
    """``(term, epoch)`` of a leader command: the term counts leaders and repartitions, the epoch plans.
    Ordered by term, then epoch."""

    term: int
    epoch: int

    def __post_init__(self) -> None:
        if self.term < 0 or self.epoch < 0:
            raise ValueError(f"a stamp counts from 0, got term {self.term} epoch {self.epoch}")

    def next_term(self) -> Stamp:
        """The stamp of a repartition (the plan it makes gets :meth:`next_epoch`)."""
        return Stamp(self.term + 1, self.epoch)

    def next_epoch(self) -> Stamp:
        return Stamp(self.term, self.epoch + 1)

    def older_than(self, other: Stamp, *, epochs: bool = True) -> bool:
        """Whether a command stamped ``self`` is stale to one at ``other`` (``epochs=False``: terms only)."""
        if self.term != other.term:
            return self.term < other.term
        return epochs and self.epoch < other.epoch

    def __str__(self) -> str:
        return f"term {self.term} epoch {self.epoch}"


__all__ = ["LEADING_STATES", "TERMINAL", "JobState", "Role", "Stamp"]
