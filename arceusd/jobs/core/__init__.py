"""The job core: a job's lifecycle as a pure state machine, fed events and a clock, returning actions, and the
pure decisions it takes them from.

- :mod:`arceusd.jobs.core.states`: :class:`JobState`, :class:`Role` and :class:`Stamp` (the one place for the
  ``(term, epoch)`` every leader command carries);
- :mod:`arceusd.jobs.core.events`: what happens (members join, die or leave; starts and ``go`` answered;
  reports; commits done or failed; ticks; cancel; takeover; the owner's return);
- :mod:`arceusd.jobs.core.actions`: what the driver does about it (send start, send go, commit, export, stop
  workers, pause, resume, announce, untrack the election, finish);
- :mod:`arceusd.jobs.core.machine`: :class:`JobCore`, which decides every transition;
- :mod:`arceusd.jobs.core.lifecycle`: the leader's decisions at a job's edges (a failed commit, an unacknowledged
  ``go``, the replica a lost device takes down, an ended election);
- :mod:`arceusd.jobs.core.leadership`: who may command a job (a member's verdict on a leader's command).

No I/O, no trio, no clock but the ``now`` it is given: a job's whole life runs in a unit test in milliseconds
(``tests/unit/test_job_core.py``). Imports only :mod:`arceusd.jobs.spec` and :mod:`arceusd.jobs.judging` of
``arceusd.jobs``. The daemon drives it: each :class:`arceusd.jobs.record.job.Job` holds its core (the one place for
its role, state, stamp, leader and committed step), and :class:`arceusd.jobs.service.driver.Driver` feeds it what
the daemon sees and carries out the actions it returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from arceusd.jobs.core.states import LEADING_STATES, TERMINAL, JobState, Role, Stamp

if TYPE_CHECKING:
    from arceusd.jobs.core.machine import MAX_RESTARTS_PER_CHECKPOINT, JobCore, LeaderState

_FROM_MACHINE = frozenset({"MAX_RESTARTS_PER_CHECKPOINT", "JobCore", "LeaderState"})


def __getattr__(name: str) -> Any:
    """The machine's names, imported on first use: a view of a job's state (the CLI's ``status``) reads
    :mod:`arceusd.jobs.core.states` without paying for the machine and the wire it imports (0.2 s of a command's
    start on a 2-core machine)."""
    if name in _FROM_MACHINE:
        from arceusd.jobs.core import machine

        return getattr(machine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "LEADING_STATES",
    "MAX_RESTARTS_PER_CHECKPOINT",
    "TERMINAL",
    "JobCore",
    "JobState",
    "LeaderState",
    "Role",
    "Stamp",
]
