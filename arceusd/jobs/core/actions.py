"""What the job core asks its driver to do: move bytes, start timers, touch files, talk to the election.

Returned in order by :meth:`arceusd.jobs.core.machine.JobCore.handle`; the driver carries each out and feeds
back what came of it as an event (:mod:`arceusd.jobs.core.events`). Every command to other daemons carries the
stamp the core chose.
"""

from __future__ import annotations

from dataclasses import dataclass

from arceusd.jobs.core.states import JobState, Stamp


@dataclass(frozen=True, slots=True)
class Announce:
    """Owner: announce the job to live peers that have not heard of it (new ones, or ones back from the dead)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Leader: plan over ``members`` (measure links, run the partitioner) and answer :class:`PlanFound` or
    :class:`NoPlanFits`; ``resuming``: from the newest committed checkpoint."""

    members: frozenset[str]
    resuming: bool


@dataclass(frozen=True, slots=True)
class TrackElection:
    """Elect the job's leader among ``members``, ranking ``ranking`` (leader, then standby) first."""

    members: tuple[str, ...]
    ranking: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UntrackElection:
    """The job is over here: leave its election (after the members were told, so none elects a standby)."""


@dataclass(frozen=True, slots=True)
class SendStart:
    """Leader: start plan ``stamp`` on ``peers`` (re-slicing the checkpoint first when ``resuming``); answer
    :class:`StartAnswered`."""

    stamp: Stamp
    peers: tuple[str, ...]
    resuming: bool


@dataclass(frozen=True, slots=True)
class CancelStart:
    """Leader: cut a start in progress short (a member of it is gone; it would wait for it)."""


@dataclass(frozen=True, slots=True)
class SendGo:
    """Leader: send ``go`` for plan ``stamp`` to ``peers`` in this order; answer :class:`GoAnswered`."""

    stamp: Stamp
    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckReachable:
    """Leader, repartitioning: handshake the old plan's ``peers``; answer :class:`MembersReachable`."""

    stamp: Stamp
    peers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """Leader: copy every shard of ``step`` here (fetching each one that is not), check it and sign
    the manifest, after ``delay_s``; answer :class:`CommitDone` or :class:`CommitFailed`."""

    stamp: Stamp
    step: int
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SyncStandby:
    """Leader: hand the standby checkpoint ``step`` (and the data, once)."""

    step: int


@dataclass(frozen=True, slots=True)
class Export:
    """Assemble the model from checkpoint ``step`` (after handing it to the owner when the leader is not the
    owner); answer :class:`ExportDone` or :class:`ExportFailed`."""

    step: int


@dataclass(frozen=True, slots=True)
class StopWorkers:
    """Tell ``peers`` the plan stopped (``reason``: ``replanning`` or the state the job ended in), stamped
    ``stamp``; ``local``: stop this device's worker too."""

    stamp: Stamp
    peers: tuple[str, ...]
    reason: str
    local: bool = True


@dataclass(frozen=True, slots=True)
class Pause:
    """The job waits (``reason``); it resumes by itself when capacity returns or its leader does."""

    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    """A paused job plans again (capacity returned)."""


@dataclass(frozen=True, slots=True)
class StartRecovery:
    """Leader: a repartition begins (``reason``), into plan epoch ``epoch`` (for the recovery record)."""

    reason: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RecoveryCause:
    """Leader: the repartition under way has a truer reason than the one it began with (a member of the old
    plan was declared dead after a neighbour's broken link started the recovery): the record says so."""

    reason: str


@dataclass(frozen=True, slots=True)
class LetWorkerGo:
    """Member: let this device's worker of plan ``stamp`` start training (once per plan)."""

    stamp: Stamp


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the message that caused this with a refusal saying ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class PrepareTakeover:
    """Standby elected: gather the survivors' offers and find the newest intact checkpoint; answer
    :class:`TakeoverReady`."""

    old_leader: str


@dataclass(frozen=True, slots=True)
class HandOver:
    """Owner: ask ``leader`` to take this device in as a member; answer :class:`HandOverAnswered`."""

    leader: str


@dataclass(frozen=True, slots=True)
class Persist:
    """Owner: save the job's durable record (enough to resume it after a restart)."""


@dataclass(frozen=True, slots=True)
class DropReplica:
    """Leader: replica ``index`` of the ``count`` in plan ``stamp`` lost ``peer`` (``reason``); drop it (the plan
    keeps the others), tell the devices left to train on over a smaller ring, and note it in ``status``."""

    stamp: Stamp
    index: int
    count: int
    peer: str
    reason: str
    hold: bool = False
    """Spare members could rebuild it: the replicas left hold after a checkpoint the driver picks and feeds back
    (:class:`arceusd.jobs.core.events.HoldAt`); its commit starts the rebuild (:class:`Regrow`)."""
    retire: bool = False
    """It is the leader's own replica: this device's worker stops training and serves the others' data."""


@dataclass(frozen=True, slots=True)
class Regrow:
    """Leader: rebuild the dropped replica on spare members from committed checkpoint ``step``, while the replicas
    left hold there; answer :class:`arceusd.jobs.core.events.Regrown` or ``RegrowFailed``."""

    stamp: Stamp
    step: int


@dataclass(frozen=True, slots=True)
class ReleaseHold:
    """Leader: no rebuild comes; the replicas left that hold after a checkpoint go on."""

    stamp: Stamp


@dataclass(frozen=True, slots=True)
class Exclude:
    """Leader: ``peer`` is out of the job (``reason``): named under ``excluded`` in ``status``, not let back in."""

    peer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The job ended in ``state`` (done, failed, cancelled) with ``error`` ('' when done)."""

    state: JobState
    error: str


Action = (
    Announce
    | Plan
    | TrackElection
    | UntrackElection
    | SendStart
    | CancelStart
    | SendGo
    | CheckReachable
    | Commit
    | SyncStandby
    | Export
    | StopWorkers
    | Pause
    | Resume
    | StartRecovery
    | LetWorkerGo
    | Refuse
    | PrepareTakeover
    | HandOver
    | Persist
    | Finish
    | DropReplica
    | Exclude
    | Regrow
    | ReleaseHold
    | RecoveryCause
)

__all__ = [
    "Action",
    "Announce",
    "CancelStart",
    "CheckReachable",
    "Commit",
    "DropReplica",
    "Exclude",
    "Export",
    "Finish",
    "HandOver",
    "LetWorkerGo",
    "Pause",
    "Persist",
    "Plan",
    "PrepareTakeover",
    "RecoveryCause",
    "Refuse",
    "Regrow",
    "ReleaseHold",
    "Resume",
    "SendGo",
    "SendStart",
    "StartRecovery",
    "StopWorkers",
    "SyncStandby",
    "TrackElection",
    "UntrackElection",
]
