"""What happens to a job, as the job core (:class:`arceusd.jobs.core.machine.JobCore`) is told it.

The driver (:class:`arceusd.jobs.service.manager.JobManager`) turns messages, membership changes, worker events, timers
and the results of the actions it carried out into these; each is a frozen value, so a test writes a job's life
as a list of them. Peers are peer ids (hex strings); stamps are the ``(term, epoch)`` of the plan an event is
about: the core drops results of an older plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from arceusd.jobs.core.states import Stamp


# ------------------------------------------------------------------------------------------------ membership
@dataclass(frozen=True, slots=True)
class MemberJoined:
    """Leader: ``peer`` asked to join and its offer is usable (``memory_ok``: as :class:`Tick`'s, with it)."""

    peer: str
    memory_ok: bool = True


@dataclass(frozen=True, slots=True)
class MemberDead:
    """Membership declared ``peer`` dead, or saw it leave the network (``how``: ``dead`` or ``left``)."""

    peer: str
    how: str = "dead"


@dataclass(frozen=True, slots=True)
class MemberLeft:
    """Leader: ``peer`` left this job (``arceusd leave``), telling us so."""

    peer: str


@dataclass(frozen=True, slots=True)
class MembersReachable:
    """Leader, while it repartitions: the old plan's members whose daemon answered (and members that joined
    since and are live); everyone else is dropped from the job until it comes back."""

    stamp: Stamp
    peers: frozenset[str]


# ------------------------------------------------------------------------------------------------ planning
@dataclass(frozen=True, slots=True)
class PlanFound:
    """Leader: the partitioner placed the model on ``peers`` (every replica's devices, in plan order);
    ``standby`` stands by to lead ('' for none); ``replicas``: each data-parallel replica's devices (empty or one
    for a single pipeline)."""

    peers: tuple[str, ...]
    standby: str = ""
    replicas: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class NoPlanFits:
    """Leader: no plan fits the members' offers (``reason`` says why)."""

    reason: str


@dataclass(frozen=True, slots=True)
class StartAnswered:
    """Leader: every member of plan ``stamp`` answered its start (or the start was cut short); ``refusals``
    are ``(peer, why, follows)`` of the ones that refused or failed (peer '' for the start being cut short;
    ``follows``: the leader a member named because it follows it, or '')."""

    stamp: Stamp
    refusals: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GoAnswered:
    """Leader: a round of ``go`` for plan ``stamp`` ended; ``unacknowledged`` maps peer -> why (refused, or no
    answer)."""

    stamp: Stamp
    unacknowledged: Mapping[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ reports
@dataclass(frozen=True, slots=True)
class CheckpointComplete:
    """Leader: every device of plan ``stamp`` reported checkpoint ``step`` (its shard, or with replicas its
    witness), the reports passed their checks and the replicas agree (:mod:`arceusd.jobs.leader.witnesses`)."""

    stamp: Stamp
    step: int


@dataclass(frozen=True, slots=True)
class RestartAsked:
    """Leader: repartition from the last commit for ``reason`` (a report refused, a member excluded or
    discounted, replicas that disagree, a member that left, capacity that joined)."""

    reason: str


@dataclass(frozen=True, slots=True)
class HoldAt:
    """Leader: the replicas left after a drop hold after checkpoint ``step`` of plan ``stamp`` (0: they do not)."""

    stamp: Stamp
    step: int


@dataclass(frozen=True, slots=True)
class Regrown:
    """Leader: the dropped replica was rebuilt on ``devices``, the ``position``-th replica of plan ``stamp`` now."""

    stamp: Stamp
    position: int
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RegrowFailed:
    """Leader: rebuilding the dropped replica failed (``reason``); the replicas left go on without it."""

    stamp: Stamp
    reason: str


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """Leader: ``peer``'s worker of plan ``stamp`` failed (``lost``: exited without saying why)."""

    stamp: Stamp
    peer: str
    message: str
    lost: bool = False


@dataclass(frozen=True, slots=True)
class CommitDone:
    """Leader: checkpoint ``step`` of plan ``stamp`` is committed under a signed manifest."""

    stamp: Stamp
    step: int


@dataclass(frozen=True, slots=True)
class ShardWithheld:
    """Leader: at a witness dispute of plan ``stamp`` (DiLoCo, a place it does not hold), the first replica's
    device ``peer`` did not serve the checkpoint shard it reported (``error``): counted as a failure of its shard
    serving, as a commit's is (``CommitFailed.culprit``)."""

    stamp: Stamp
    peer: str
    error: str


@dataclass(frozen=True, slots=True)
class CommitFailed:
    """Leader: committing checkpoint ``step`` of plan ``stamp`` failed with ``error``; ``culprit``: the member whose
    part failed it (its shard not served within its bound and time), or ``""`` when none can be named."""

    stamp: Stamp
    step: int
    error: str
    culprit: str = ""


@dataclass(frozen=True, slots=True)
class ExportDone:
    """The model is saved at ``path``."""

    path: str


@dataclass(frozen=True, slots=True)
class ExportFailed:
    error: str


# ------------------------------------------------------------------------------------------------ commands
@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the gather deadline after the owner's restart is judged on the ``now`` given with it).
    ``memory_ok``: the members' memory covers what the job's spec needs (``needs.memory_total_mib``, the
    market's; measured by the driver)."""

    memory_ok: bool = True


@dataclass(frozen=True, slots=True)
class Cancel:
    """The owner (or the leader) cancels the job."""

    reason: str = "cancelled by the owner"


@dataclass(frozen=True, slots=True)
class Fail:
    """The job cannot go on (its budget is spent, the leader's loop broke): it fails with ``error``."""

    error: str


@dataclass(frozen=True, slots=True)
class Joined:
    """Member: the job's leader took this device in."""


@dataclass(frozen=True, slots=True)
class LeaveJob:
    """Member: this device's user left the job (``arceusd leave``)."""


@dataclass(frozen=True, slots=True)
class StartReceived:
    """Member: the leader's start of plan ``stamp`` passed every check; this device takes its place (``standby``:
    the plan's standby the start names)."""

    stamp: Stamp
    standby: str = ""


@dataclass(frozen=True, slots=True)
class StandbyCommitted:
    """Standby (or the owner handed the final checkpoint): this device holds committed checkpoint ``step``."""

    step: int


@dataclass(frozen=True, slots=True)
class ReplicaDropped:
    """Member: the leader dropped the replica of ``devices`` and this device took the smaller plan."""

    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorkerStarted:
    """Member: this device's worker for plan ``stamp`` started (it waits for ``go``). Refused when a stop came
    since the plan's :class:`StartReceived` (the leader gone, a stop, leaving): that worker is stopped, the start
    refused."""

    stamp: Stamp


@dataclass(frozen=True, slots=True)
class GoReceived:
    """Member: the leader's ``go`` for plan ``stamp``; refused unless this device holds that plan's started
    worker."""

    stamp: Stamp


@dataclass(frozen=True, slots=True)
class StopReceived:
    """Member: the leader stopped the plan (``reason``: ``replanning``, or the state the job ended in)."""

    reason: str


@dataclass(frozen=True, slots=True)
class LeaderGone:
    """Member: membership declared the leader dead or gone (``how``)."""

    how: str = "dead"


# ------------------------------------------------------------------------------------------------ leadership
@dataclass(frozen=True, slots=True)
class TakeoverElected:
    """The job's election made this device leader at ``term`` (``holds_data``: it has a checked copy of the
    data, i.e. it is the plan's standby)."""

    term: int
    holds_data: bool


@dataclass(frozen=True, slots=True)
class TakeoverReady:
    """The standby gathered what it leads with: the surviving ``members``, its newest intact checkpoint and
    the old ``plan``'s devices (told to stop before the new plan)."""

    members: frozenset[str]
    committed_step: int
    plan: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OtherElected:
    """The job's election made ``peer`` leader at ``term``: a leader steps down."""

    peer: str
    term: int


@dataclass(frozen=True, slots=True)
class FollowsOther:
    """Owner: ``peer`` answered that it follows ``leader`` (the owner was replaced while away or stalled)."""

    leader: str
    peer: str


@dataclass(frozen=True, slots=True)
class HandOverAnswered:
    """Owner: ``leader`` answered our join (``accepted``), or said the job is done (``done``)."""

    leader: str
    accepted: bool
    done: bool = False


Event = (
    MemberJoined
    | MemberDead
    | MemberLeft
    | MembersReachable
    | PlanFound
    | NoPlanFits
    | StartAnswered
    | GoAnswered
    | CheckpointComplete
    | RestartAsked
    | WorkerFailed
    | CommitDone
    | CommitFailed
    | ShardWithheld
    | ExportDone
    | ExportFailed
    | Tick
    | Cancel
    | Fail
    | Joined
    | LeaveJob
    | StartReceived
    | ReplicaDropped
    | StandbyCommitted
    | WorkerStarted
    | GoReceived
    | StopReceived
    | LeaderGone
    | TakeoverElected
    | TakeoverReady
    | OtherElected
    | FollowsOther
    | HandOverAnswered
    | HoldAt
    | Regrown
    | RegrowFailed
)

__all__ = [
    "Cancel",
    "CheckpointComplete",
    "CommitDone",
    "CommitFailed",
    "Event",
    "ExportDone",
    "ExportFailed",
    "Fail",
    "FollowsOther",
    "GoAnswered",
    "GoReceived",
    "HandOverAnswered",
    "HoldAt",
    "Joined",
    "LeaderGone",
    "LeaveJob",
    "MemberDead",
    "MemberJoined",
    "MemberLeft",
    "MembersReachable",
    "NoPlanFits",
    "OtherElected",
    "PlanFound",
    "RegrowFailed",
    "Regrown",
    "ReplicaDropped",
    "RestartAsked",
    "ShardWithheld",
    "StandbyCommitted",
    "StartAnswered",
    "StartReceived",
    "StopReceived",
    "TakeoverElected",
    "TakeoverReady",
    "Tick",
    "WorkerFailed",
    "WorkerStarted",
]
