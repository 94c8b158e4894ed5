"""The job core: a job's lifecycle as a pure state machine, fed events and a clock, returning actions.

- :mod:`arceusd.jobs.core.states`: :class:`JobState`, :class:`Role` and :class:`Stamp` (the one place for the
  ``(term, epoch)`` every leader command carries);
- :mod:`arceusd.jobs.core.events`: what happens (members join, die or leave; starts and ``go`` answered;
  reports; commits done or failed; ticks; cancel; takeover; the owner's return);
- :mod:`arceusd.jobs.core.actions`: what the driver does about it (send start, send go, commit, export, stop
  workers, pause, resume, announce, untrack the election, finish);
- :mod:`arceusd.jobs.core.machine`: :class:`JobCore`, which decides every transition.

No I/O, no trio, no clock but the ``now`` it is given: a job's whole life runs in a unit test in milliseconds
(``tests/unit/test_job_core.py``). Not yet driven by the daemon: :class:`arceusd.jobs.manager.JobManager` still
makes these decisions itself (through :mod:`arceusd.jobs.lifecycle`, which shares the core's states); moving it
onto this core is what is left of issue #18.
"""

from arceusd.jobs.core.machine import MAX_RESTARTS_PER_CHECKPOINT, JobCore, LeaderState
from arceusd.jobs.core.states import LEADING_STATES, TERMINAL, JobState, Role, Stamp, job_state

__all__ = [
    "LEADING_STATES", "MAX_RESTARTS_PER_CHECKPOINT", "TERMINAL", "JobCore", "JobState", "LeaderState", "Role",
    "Stamp", "job_state",
]  # fmt: skip
