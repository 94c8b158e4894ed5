"""The job core: one job's lifecycle as a pure state machine (no I/O, no trio, no clock but the ``now`` it is
given), in the style of :mod:`arceusd.membership.swim` and :mod:`arceusd.elections.core`.

:class:`JobCore` holds what this device knows of one job (state, stamp, leader, committed step) and, while it
leads, the leader's own state (:class:`LeaderState`: members, plan, reports, restarts, commit and ``go``
attempts). :meth:`JobCore.handle` takes an event (:mod:`arceusd.jobs.core.events`) and returns the actions
(:mod:`arceusd.jobs.core.actions`) for the driver to carry out; every transition is decided here. Results of an
older plan (a stamp that is not the current one) are dropped, and a job in a terminal state takes no event.

The decisions at a job's edges come from :mod:`arceusd.jobs.core.lifecycle` (a failed final commit is retried, then
fails the job; a lost ``go`` is resent, then the plan restarts; an ended job leaves its election) and
:mod:`arceusd.jobs.core.leadership` (whom a member obeys; a member that follows someone else makes the owner hand
over). The restart limit is :data:`MAX_RESTARTS_PER_CHECKPOINT`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.core import leadership, lifecycle
from arceusd.jobs.core.states import LEADING_STATES, TERMINAL, JobState, Role, Stamp
from arceusd.jobs.judging.claims import stop_state

MAX_RESTARTS_PER_CHECKPOINT = 4
"""Repartitions that resume from the same checkpoint before the job is declared failed."""

MAX_START_REFUSALS = 2
"""Starts in a row a member may refuse or fail (while the leader's own worker starts) before it is excluded: one
member that keeps refusing must not use up the job's restarts and fail it (issue #19)."""

MAX_BLAMED_FAILURES = 2
"""Plans in a row whose first failure was a member's own worker report (an error or a lost worker), or commits in a
row that its shard serving failed, before that member is excluded (issue #29 item 6: one member answering every
checkpoint with an error, or serving its shard too slowly or too big, failed every job after its restarts)."""

SERVE_BLAME_SPACING_S = 10.0
"""A member's shard serving failures count once in this many seconds: commits waiting in line behind one that
could not copy its shard fail together (the same slow moment of one member), and counting each excluded an honest
member of a busy machine after one incident."""

FIRST_STAMP = Stamp(1, 0)
"""A new job's stamp: term 1, no plan yet."""

REBALANCE_REASON = "rebalancing onto the member(s) that joined"


@dataclass
class LeaderState:
    """What only the job's leader keeps."""

    members: set[str] = field(default_factory=set)
    min_members: int = 1
    announced: set[str] = field(default_factory=set)
    """Peers the owner announced the job to; a member the core drops (dead, unreachable, excluded for its starts
    or failures) leaves it, to be announced to again when it comes back; one that left or was excluded for its
    reports stays (it is not invited back)."""
    plan: tuple[str, ...] = ()  # the current plan's devices (every replica's), in plan order; () when none
    resuming: bool = False
    committing: set[int] = field(default_factory=set)  # checkpoint steps of this plan whose commit was started
    restart_reason: str = ""
    recovering_from: tuple[str, ...] = ()  # the plan a repartition under way began from
    rebalance: bool = False
    restarts_at: dict[int, int] = field(default_factory=dict)  # committed step -> restarts that resumed there
    commit_attempts: dict[int, int] = field(default_factory=dict)  # step -> failed attempts
    go_attempts: int = 0
    gather_until: float = 0.0  # after the owner's restart: plan at this time even if not every member is back
    expected: frozenset[str] = frozenset()
    hand_over_from_start: str = ""  # the leader the plan's members named when they refused its start
    replicas: tuple[tuple[str, ...], ...] = ()  # each data-parallel replica's devices (the plan's, after drops)
    start_refusals: dict[str, int] = field(default_factory=dict)  # peer -> starts it refused or failed in a row
    regrow: bool = False  # a dropped replica waits to be rebuilt on spare members
    regrow_at: int = 0  # ... from this checkpoint step, where the replicas left hold (0: not chosen yet)
    dropped_at: int = -1  # the committed step when a replica was last dropped (one drop per checkpoint)
    named: dict[str, set[str]] = field(default_factory=dict)  # leader -> the job's peers that said they follow it
    failed_first: dict[str, int] = field(default_factory=dict)  # peer -> plans in a row its worker failed first
    failure_seen: Stamp | None = None  # the plan whose first worker failure was counted
    serve_failures: dict[str, int] = field(default_factory=dict)  # peer -> commits in a row its serving failed
    serve_blamed_at: dict[str, float] = field(default_factory=dict)  # peer -> when its serving was last counted
    withheld_seen: dict[str, Stamp] = field(default_factory=dict)  # peer -> the plan whose withheld shard counted


@dataclass
class JobCore:
    """One job as this device knows it. ``me``: this device's peer id. Build a leader with :meth:`owned`."""

    me: str
    owner: str
    total_steps: int
    role: Role = Role.SEEN
    state: JobState = JobState.ANNOUNCED
    stamp: Stamp = FIRST_STAMP
    leader: str = ""
    committed_step: int = 0
    error: str = ""
    leaders: set[str] = field(default_factory=set)
    lead: LeaderState | None = None
    went: int = -1  # the epoch this device's worker was let go in (a repeated go is a no-op: :meth:`let_go`)
    starting: Stamp | None = None  # member: the plan whose start it carries out (a local stop cuts it short)
    held: Stamp | None = None  # member: the plan whose started worker it holds (a local stop lets it go)
    standby: str = ""  # the current plan's standby (the leader chose it; a member was told it in the start)

    def __post_init__(self) -> None:
        self.leader = self.leader or self.owner
        self.leaders.add(self.owner)

    @classmethod
    def owned(
        cls,
        me: str,
        total_steps: int,
        *,
        min_members: int = 1,
        stamp: Stamp = FIRST_STAMP,
        committed_step: int = 0,
        gather_until: float = 0.0,
        expected: frozenset[str] = frozenset(),
    ) -> JobCore:
        """A job this device submitted (or restored after its restart: ``gather_until`` waits for ``expected``)."""
        core = cls(me, me, total_steps, Role.OWNER, JobState.WAITING, stamp, me, committed_step)
        core.lead = LeaderState({me}, min_members, gather_until=gather_until, expected=expected - {me})
        return core

    # ------------------------------------------------------------------------------------------ queries
    @property
    def leads(self) -> bool:
        return self.leader == self.me and self.lead is not None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def plan_devices(self) -> tuple[str, ...]:
        """The current plan's devices (every replica's, in plan order) while this device holds the leader's
        state; () without a plan."""
        return self.lead.plan if self.lead is not None else ()

    @property
    def members(self) -> frozenset[str]:
        """The job's members while this device holds the leader's state (the peers it plans over, itself
        included); empty on a device that never led the job."""
        return frozenset(self.lead.members) if self.lead is not None else frozenset()

    def is_member(self, peer: str) -> bool:
        return self.lead is not None and peer in self.lead.members

    def drop_member(self, peer: str) -> None:
        """``peer`` is no member any more (it left the job, or its reports got it excluded): the next plan goes on
        without it, and it is not invited back. The caller asks for the repartition when it was in the plan. This
        device stays."""
        if self.lead is not None and peer != self.me:
            self.lead.members.discard(peer)
            self.lead.announced.add(peer)

    def to_announce(self, alive: list[str]) -> list[str]:
        """The peers among ``alive`` the owner announces the job to now (not yet told, or dropped since); they
        count as announced from here."""
        if self.lead is None:
            return []
        new = [p for p in alive if p != self.me and p not in self.lead.announced]
        self.lead.announced.update(new)
        return new

    def _forget(self, peer: str) -> None:
        """The core drops ``peer`` from the members (it is announced to again when it comes back)."""
        assert self.lead is not None
        self.lead.members.discard(peer)
        self.lead.announced.discard(peer)

    def let_go(self, epoch: int) -> bool:
        """Whether this device's worker is let go in plan ``epoch`` now: once per epoch (a ``go`` sent again after
        a lost answer, or the leader's own ``go`` repeated, is a no-op)."""
        if self.went == epoch:
            return False
        self.went = epoch
        return True

    def judge(self, sender: str, stamp: Stamp, *, epochs: bool = True) -> leadership.Verdict:
        """A member's verdict on a leader command stamped ``stamp`` (:func:`leadership.judge_command`)."""
        return leadership.judge_command(
            sender, stamp.term, stamp.epoch, self.leader, self.stamp.term, self.stamp.epoch, epochs
        )

    def follow(self, leader: str, stamp: Stamp | None = None) -> None:
        """Follow ``leader`` (the election made it leader, or we joined it); a leader that follows another
        stops leading."""
        self.leader = leader
        self.leaders.add(leader)
        if stamp is not None:
            self.stamp = stamp
        if leader != self.me:
            self.lead = None if self.role != Role.OWNER else self.lead

    # ------------------------------------------------------------------------------------------ events
    def handle(self, event: e.Event, now: float) -> list[a.Action]:
        """Feed one event that happened at ``now``; the actions to carry out, in order. One that stops this
        device's worker also ends a start in progress here and the hold on the started worker: that start's
        answer is then refused (:class:`events.WorkerStarted`), and so is a ``go`` for its plan."""
        out = self._handle(event, now)
        if any(isinstance(x, a.StopWorkers) and x.local for x in out):
            self.starting = self.held = None
        return out

    def _handle(self, event: e.Event, now: float) -> list[a.Action]:
        if self.terminal:
            return [a.Refuse(f"the job is {self.state.value}")] if isinstance(event, e.GoReceived) else []
        if isinstance(event, e.Cancel):
            return self._finish(JobState.CANCELLED, event.reason)
        if isinstance(event, e.Fail):
            return self._finish(JobState.FAILED, event.error)
        if isinstance(event, e.ExportDone):  # a leader's export, or the owner's of the final checkpoint handed it
            return self._finish(JobState.DONE, "")
        if isinstance(event, e.ExportFailed):
            return self._finish(JobState.FAILED, f"exporting the model failed: {event.error}")
        if isinstance(
            event,
            (
                e.GoReceived,
                e.StopReceived,
                e.WorkerStarted,
                e.LeaderGone,
                e.Joined,
                e.LeaveJob,
                e.StartReceived,
                e.ReplicaDropped,
                e.StandbyCommitted,
            ),
        ):
            return self._as_member(event)
        if isinstance(event, (e.TakeoverElected, e.TakeoverReady, e.OtherElected, e.FollowsOther, e.HandOverAnswered)):
            return self._leadership(event)
        if not self.leads:
            return []
        return self._as_leader(event, now)

    # ------------------------------------------------------------------------------------------ member
    def _as_member(self, event: e.Event) -> list[a.Action]:
        if isinstance(event, e.Joined):
            self.role = Role.OWNER if self.role == Role.OWNER else Role.MEMBER
            if self.state in (JobState.ANNOUNCED, JobState.LEFT):
                self.state = JobState.JOINED
            return []
        if isinstance(event, e.LeaveJob):
            self.role, self.state = Role.SEEN, JobState.LEFT
            return [a.StopWorkers(self.stamp, (), JobState.LEFT.value)]
        if isinstance(event, e.StartReceived):  # (the previous plan's worker was dropped before it)
            self.stamp, self.standby = event.stamp, event.standby
            self.starting, self.held = event.stamp, None
            self.went = -1  # a new worker takes its go, even in the epoch an earlier one went in (a rebuilt replica)
            return []
        if isinstance(event, e.ReplicaDropped):
            self.standby = "" if self.standby in event.devices else self.standby
            return []
        if isinstance(event, e.StandbyCommitted):
            self.committed_step = max(self.committed_step, min(event.step, self.total_steps))
            return []
        if isinstance(event, e.WorkerStarted):
            if event.stamp != self.starting:  # stopped, or replaced by a newer start, while its worker started
                why = f": {self.error}" if self.error else ""
                return [
                    a.Refuse(f"the start of plan epoch {event.stamp.epoch} was stopped while its worker started{why}")
                ]
            self.starting, self.held = None, event.stamp
            if event.stamp == self.stamp:
                self.state = JobState.STARTING
            return []
        if isinstance(event, e.GoReceived):
            if event.stamp.epoch != self.stamp.epoch:
                return [a.Refuse(f"go for epoch {event.stamp.epoch}, but this device started epoch {self.stamp.epoch}")]
            if self.held is None or self.held.epoch != event.stamp.epoch:  # never acknowledge a go no worker takes
                return [
                    a.Refuse(f"this device holds no worker for plan epoch {event.stamp.epoch} (its start was stopped)")
                ]
            if not self.let_go(self.stamp.epoch):
                return []  # a go sent again after a lost answer
            self.state = JobState.RUNNING
            return [a.LetWorkerGo(self.stamp)]
        if isinstance(event, e.StopReceived):  # a known state only, never the sender's text (issue #19)
            self.state = JobState(stop_state(event.reason))
            out: list[a.Action] = [a.StopWorkers(self.stamp, (), self.state.value)]
            return out + ([a.UntrackElection()] if self.terminal else [])
        if isinstance(event, e.LeaderGone) and not self.leads:
            self.state = JobState.PAUSED
            self.error = f"the job's leader {self.leader[:12]} is {event.how}"
            return [a.StopWorkers(self.stamp, (), "paused"), a.Pause(self.error)]
        return []

    # ------------------------------------------------------------------------------------------ leadership
    def _leadership(self, event: e.Event) -> list[a.Action]:
        if isinstance(event, e.TakeoverElected):
            if self.leads:
                return []
            if not event.holds_data:
                return []  # only the standby, which holds the data, can lead
            return [a.PrepareTakeover(self.leader)]
        if isinstance(event, e.TakeoverReady):
            if self.leads:
                return []
            old = self.leader
            self.leader = self.me
            self.leaders.add(self.me)
            self.committed_step = event.committed_step
            self.state = JobState.RUNNING
            self.lead = LeaderState(set(event.members) | {self.me}, 1, plan=event.plan)
            self.standby = ""  # (this device was it: the next plan chooses one)
            return self._request_restart(f"the leader {old[:12]} is gone; its standby {self.me[:12]} took over")
        if isinstance(event, e.OtherElected):
            if event.peer == self.me or not self.leads:
                return []
            self.leader = event.peer
            self.leaders.add(event.peer)
            self.state, self.error = JobState.PAUSED, f"{event.peer[:12]} leads the job now"
            self.lead = None if self.role != Role.OWNER else self.lead
            return [a.CancelStart(), a.StopWorkers(self.stamp, (), "paused"), a.Pause(self.error)]
        if isinstance(event, e.FollowsOther):
            if not self.leads or self.role != Role.OWNER or event.leader == self.me:
                return []
            return [a.HandOver(event.leader)] if self._corroborated(event.leader, {event.peer}) else []
        if isinstance(event, e.HandOverAnswered):
            if not self.leads or self.role != Role.OWNER:
                return []
            if not (event.accepted or event.done):
                assert self.lead is not None
                if self.lead.hand_over_from_start != event.leader:
                    return []  # one peer's word (an announce's answer) that another leads: nothing changes
                self.lead.hand_over_from_start = ""
                return self._request_restart(f"members follow {event.leader[:12]}, who did not take us in")
            self.leader = event.leader
            self.leaders.add(event.leader)
            # Terms and epochs count the leader's commands; ours say nothing about the new leader's.
            self.stamp = Stamp(0, 0)
            self.lead = None
            out: list[a.Action] = [a.CancelStart(), a.StopWorkers(self.stamp, (), "joined")]
            if event.done:
                self.state = JobState.DONE
                self.error = (
                    f"the job finished on {event.leader[:12]}, which took over as its leader; the model is there"
                )
                return [*out, a.UntrackElection(), a.Persist()]
            self.state = JobState.JOINED
            self.error = f"{event.leader[:12]} leads the job (its standby took over while this device was away)"
            return [*out, a.Persist()]
        return []

    # ------------------------------------------------------------------------------------------ leader
    def _as_leader(self, event: e.Event, now: float) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if isinstance(event, e.MemberJoined):
            new = event.peer not in lead.members
            lead.members.add(event.peer)
            if new and self.state in LEADING_STATES:
                lead.rebalance = True  # it gets work at the next checkpoint
            return self._maybe_plan(now, event.memory_ok)
        if isinstance(event, e.Tick):
            return self._maybe_plan(now, event.memory_ok)
        if isinstance(event, e.RestartAsked):
            return self._request_restart(event.reason)
        if isinstance(event, (e.MemberDead, e.MemberLeft)):
            how = "left the job" if isinstance(event, e.MemberLeft) else f"is {event.how}"
            lead.announced.discard(event.peer)  # announced to again when it comes back
            in_plan = event.peer in lead.plan
            if (
                isinstance(event, e.MemberLeft)
                or not in_plan
                or self.state
                in (
                    JobState.WAITING,
                    JobState.PAUSED,
                    JobState.RECOVERING,
                )
            ):
                self._forget(event.peer)  # (not in the plan: no spare to rebuild a replica on)
            if self.state == JobState.RECOVERING and event.peer in lead.recovering_from:
                return self._name_the_cause(f"member {event.peer[:12]} {how}")
            if in_plan or self.state == JobState.RECOVERING:
                return self._lose(event.peer, f"member {event.peer[:12]} {how}", gone=True)
            return []
        if isinstance(event, e.MembersReachable):
            if event.stamp != self.stamp or self.state != JobState.RECOVERING:
                return []
            for peer in sorted(lead.members - event.peers - {self.me}):
                self._forget(peer)
            return self._plan()
        if isinstance(event, e.PlanFound):
            return self._plan_found(event)
        if isinstance(event, e.NoPlanFits):
            if self.state != JobState.PLANNING:
                return []
            resuming = lead.resuming
            self.state = JobState.PAUSED if resuming else JobState.WAITING
            self.error = f"no plan fits the {len(lead.members)} member(s): {event.reason}" + (
                "; paused until more capacity joins" if resuming else ""
            )
            lead.min_members = len(lead.members) + 1
            return [a.Pause(self.error), a.Persist()] if resuming else [a.Persist()]
        if isinstance(event, e.StartAnswered):
            return self._start_answered(event)
        if isinstance(event, e.GoAnswered):
            return self._go_answered(event)
        if isinstance(event, e.WorkerFailed):
            if event.stamp != self.stamp:
                return [a.Refuse(self._stale(event.stamp))]
            verb = "was lost" if event.lost else "failed"
            reason = f"worker on {event.peer[:12]} {verb}: {event.message[:300]}"
            blamed = self._blame_failure(event.peer, reason)
            return blamed or self._lose(event.peer, reason)
        if isinstance(event, e.CheckpointComplete):
            return self._checkpoint(event)
        if isinstance(event, e.CommitDone):
            return self._commit_done(event)
        if isinstance(event, e.CommitFailed):
            return self._commit_failed(event, now)
        if isinstance(event, e.ShardWithheld):
            return self._shard_withheld(event, now)
        if isinstance(event, e.HoldAt):
            if event.stamp == self.stamp and lead.regrow:
                lead.regrow, lead.regrow_at = event.step > 0, event.step
            return []
        if isinstance(event, e.Regrown):
            return self._regrown(event)
        return []

    def _stale(self, stamp: Stamp) -> str:
        return f"report from outside the current plan epoch ({stamp.epoch}; now {self.stamp.epoch})"

    def _enough(self, now: float, memory_ok: bool) -> bool:
        lead = self.lead
        assert lead is not None
        if lead.gather_until:  # resuming after our own restart: wait for the old members, not for long
            return lead.expected <= lead.members or now >= lead.gather_until
        return len(lead.members) >= lead.min_members and memory_ok

    def _maybe_plan(self, now: float, memory_ok: bool = True) -> list[a.Action]:
        out: list[a.Action] = [a.Announce()] if self.role == Role.OWNER else []
        if self.state in (JobState.WAITING, JobState.PAUSED) and self._enough(now, memory_ok):
            assert self.lead is not None
            self.lead.gather_until = 0.0
            if self.state == JobState.PAUSED:
                out.append(a.Resume())
            return out + self._plan()
        return out

    def _plan(self) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        lead.resuming = self.state in (JobState.RECOVERING, JobState.PAUSED) or self.committed_step > 0
        self.state = JobState.PLANNING
        return [a.Plan(frozenset(lead.members), lead.resuming)]

    def _plan_found(self, event: e.PlanFound) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if self.state != JobState.PLANNING:
            return []
        if self.me not in event.peers:
            return self._finish(JobState.FAILED, "the plan leaves out the leader, who serves the data")
        self.stamp = self.stamp.next_epoch()
        self.state = JobState.STARTING
        lead.plan, self.standby, lead.replicas = event.peers, event.standby, event.replicas
        lead.committing, lead.go_attempts, lead.restart_reason = set(), 0, ""
        ranking = (self.me, event.standby) if event.standby else (self.me,)
        return [a.TrackElection(event.peers, ranking), a.SendStart(self.stamp, event.peers, lead.resuming)]

    def _start_answered(self, event: e.StartAnswered) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp or self.state != JobState.STARTING:
            return []
        outcome = leadership.start_outcome(self.me, event.refusals)
        failed = {peer for peer, _, _ in event.refusals if peer}
        if isinstance(outcome, leadership.HandOver):
            self.state = JobState.RUNNING  # the restart path if the hand-over does not happen
            naming = {peer for peer, _, follows in event.refusals if follows == outcome.leader}
            if self.role != Role.OWNER or not self._corroborated(outcome.leader, naming):
                return self._blame(failed) + self._request_restart(
                    f"members refused the start, some saying they follow {outcome.leader[:12]}"
                )
            lead.hand_over_from_start = outcome.leader  # the plan cannot start: restart if that leader refuses us
            return [a.HandOver(outcome.leader)]
        if isinstance(outcome, leadership.Restart):
            if self.me in failed and not (lead.resuming or lead.restart_reason):
                return self._finish(JobState.FAILED, outcome.reason)  # this device cannot start its own plan
            self.state = JobState.RUNNING
            return self._blame(failed) + self._request_restart(outcome.reason)
        self._blame(failed)
        lead.go_attempts = 1
        return [a.SendGo(self.stamp, lead.plan)]

    def _blame(self, failed: set[str]) -> list[a.Action]:
        """Count the starts each plan member refused or failed in a row (none when this device's own start failed
        too: the plan may be at fault); one that reached :data:`MAX_START_REFUSALS` leaves the members and is
        excluded, so the next plan goes on without it."""
        lead = self.lead
        assert lead is not None
        if self.me in failed:
            return []
        out: list[a.Action] = []
        for peer in lead.plan:
            if peer == self.me or peer not in failed:
                lead.start_refusals.pop(peer, None)
                continue
            count = lead.start_refusals[peer] = lead.start_refusals.get(peer, 0) + 1
            if count >= MAX_START_REFUSALS:
                self._forget(peer)
                out.append(a.Exclude(peer, f"it refused or failed {count} starts in a row"))
        return out

    def _blame_failure(self, peer: str, reason: str) -> list[a.Action]:
        """Count ``peer``'s worker failure when it is the first of its plan (a failure that follows another is
        usually its neighbour's broken link), not this device's own; one that reached
        :data:`MAX_BLAMED_FAILURES` plans in a row (no commit between) is excluded and the job plans again without
        it. Returns the actions of an exclusion, or none (the failure is handled as before)."""
        lead = self.lead
        assert lead is not None
        if lead.failure_seen == self.stamp:
            return []
        lead.failure_seen = self.stamp
        if peer == self.me or peer not in lead.plan:
            return []
        count = lead.failed_first[peer] = lead.failed_first.get(peer, 0) + 1
        if count < MAX_BLAMED_FAILURES:
            return []
        return self._exclude(peer, f"its worker failed {count} plans in a row first ({reason[:200]})")

    def _exclude(self, peer: str, why: str) -> list[a.Action]:
        """``peer`` leaves the members, is named, and the job plans again without it from the last commit."""
        lead = self.lead
        assert lead is not None
        self._forget(peer)
        lead.failed_first.pop(peer, None)
        lead.serve_failures.pop(peer, None)
        return [a.Exclude(peer, why), *self._request_restart(f"member {peer} excluded: {why}")]

    def _go_answered(self, event: e.GoAnswered) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp or self.state != JobState.STARTING:
            return []
        decided = lifecycle.after_go(event.unacknowledged, lead.go_attempts)
        if isinstance(decided, lifecycle.ResendGo):
            lead.go_attempts += 1
            return [a.SendGo(self.stamp, decided.peers)]
        if isinstance(decided, lifecycle.RestartPlan):
            self.state = JobState.RUNNING
            return self._request_restart(decided.reason)
        self.state, self.error = JobState.RUNNING, ""
        return [a.Persist()]

    def _checkpoint(self, event: e.CheckpointComplete) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp or not lead.plan:
            return [a.Refuse(self._stale(event.stamp))]
        if event.step <= self.committed_step or event.step > self.total_steps:
            return [
                a.Refuse(
                    f"checkpoint {event.step} is not after the committed step {self.committed_step} "
                    f"and within the job's {self.total_steps} steps"
                )
            ]
        if event.step in lead.committing:
            return []  # once per step
        lead.committing.add(event.step)
        return [a.Commit(self.stamp, event.step)]

    def _commit_done(self, event: e.CommitDone) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp:
            return []
        self.committed_step = max(self.committed_step, event.step)
        lead.commit_attempts.pop(event.step, None)
        for peer in lead.plan:  # each served its shard and its worker ran to this checkpoint
            lead.failed_first.pop(peer, None)
            lead.serve_failures.pop(peer, None)
        if event.step >= self.total_steps:
            return [a.Export(event.step)]
        out: list[a.Action] = [a.SyncStandby(event.step)] if self.standby else []
        if lead.regrow and event.step == lead.regrow_at:  # the replicas left hold at this checkpoint
            lead.regrow, lead.regrow_at = False, 0
            return [*out, a.Regrow(self.stamp, event.step)]
        if lead.rebalance:
            out += self._request_restart(REBALANCE_REASON)
        return out

    def _commit_failed(self, event: e.CommitFailed, now: float) -> list[a.Action]:
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp:
            return []
        culprit = event.culprit
        if culprit and culprit != self.me and culprit in lead.plan and self._counts_as_new_blame(culprit, event, now):
            lead.serve_blamed_at[culprit] = now
            count = lead.serve_failures[culprit] = lead.serve_failures.get(culprit, 0) + 1
            if count >= MAX_BLAMED_FAILURES:
                return self._exclude(
                    culprit, f"its shard serving failed {count} commits in a row ({event.error[:200]})"
                )
        attempt = lead.commit_attempts.get(event.step, 0) + 1
        lead.commit_attempts[event.step] = attempt
        if lead.regrow and event.step == lead.regrow_at:  # they hold at this checkpoint: no rebuild, they go on
            lead.regrow, lead.regrow_at = False, 0
            return [a.ReleaseHold(self.stamp), *self._commit_failed_decision(event, attempt)]
        return self._commit_failed_decision(event, attempt)

    def _shard_withheld(self, event: e.ShardWithheld, now: float) -> list[a.Action]:
        """A shard not served at a witness dispute counts like one not served at a commit
        (:data:`MAX_BLAMED_FAILURES` in a row, no commit between, exclude it): a first-replica member that lies
        about its witness and withholds its shard no longer spends the job's restarts. It counts once per plan
        (each such dispute ends its plan) or, within one plan, once per :data:`SERVE_BLAME_SPACING_S`: with the
        spacing alone, disputes 3.5 s apart (a small DiLoCo job's replans) counted one in three, and the member
        was excluded at the job's fourth restart, or the job failed at its fifth first."""
        lead = self.lead
        assert lead is not None
        peer = event.peer
        if event.stamp != self.stamp or peer == self.me or peer not in lead.plan:
            return []
        same_plan = lead.withheld_seen.get(peer) == event.stamp
        if same_plan and now < lead.serve_blamed_at.get(peer, -1e18) + SERVE_BLAME_SPACING_S:
            return []
        lead.withheld_seen[peer] = event.stamp
        lead.serve_blamed_at[peer] = now
        count = lead.serve_failures[peer] = lead.serve_failures.get(peer, 0) + 1
        if count < MAX_BLAMED_FAILURES:
            return []
        return self._exclude(peer, f"its shard serving failed {count} times in a row ({event.error[:200]})")

    def _counts_as_new_blame(self, culprit: str, event: e.CommitFailed, now: float) -> bool:
        """Whether this serving failure of ``culprit`` counts: once per :data:`SERVE_BLAME_SPACING_S` across
        checkpoints (commits waiting in line behind one slow copy fail together), but every retry of the same
        checkpoint (the final one: a retry starts after the last attempt failed, so each is its own failure; with
        the spacing the job failed after its retries before the member was excluded)."""
        lead = self.lead
        assert lead is not None
        retry = lead.commit_attempts.get(event.step, 0) >= 1
        return retry or now >= lead.serve_blamed_at.get(culprit, -1e18) + SERVE_BLAME_SPACING_S

    def _commit_failed_decision(self, event: e.CommitFailed, attempt: int) -> list[a.Action]:
        decided = lifecycle.after_commit_failure(event.step, self.total_steps, attempt, event.error)
        if isinstance(decided, lifecycle.RetryCommit):
            return [a.Commit(self.stamp, event.step, decided.delay_s)]
        if isinstance(decided, lifecycle.FailJob):
            return self._finish(JobState.FAILED, decided.error)
        self.error = decided.error
        return []

    def _regrown(self, event: e.Regrown) -> list[a.Action]:
        """The dropped replica runs again on spare members: back in the plan (and the election)."""
        lead = self.lead
        assert lead is not None
        if event.stamp != self.stamp or not 0 <= event.position <= len(lead.replicas):
            return []
        lead.replicas = (*lead.replicas[: event.position], event.devices, *lead.replicas[event.position :])
        lead.plan = tuple(p for devices in lead.replicas for p in devices)
        return [self._track(), a.Persist()]

    def _corroborated(self, leader: str, naming: set[str]) -> bool:
        """Whether more than half of the job's other devices (the plan's; before the first plan, the members
        it had before its restart or has now) said they follow ``leader``: one member's word (a hostile one's,
        say) does not make the owner hand its job over."""
        lead = self.lead
        assert lead is not None
        voters = (set(lead.plan) or set(lead.expected) or set(lead.members)) - {self.me}
        said = naming & voters
        if said:  # only the job's own devices are counted (and kept): a stranger's names take no room
            lead.named.setdefault(leader, set()).update(said)
        return bool(voters) and len(lead.named.get(leader, ())) * 2 > len(voters)

    def _lose(self, peer: str, reason: str, gone: bool = False) -> list[a.Action]:
        """``peer`` (or its worker) is gone: with data-parallel replicas drop its replica and let the others go
        on (:func:`lifecycle.replica_to_drop`), at most once per checkpoint interval (a second loss before the
        next commit replans from it, as does any loss in a single pipeline or in the leader's own replica)."""
        lead = self.lead
        assert lead is not None
        index = lifecycle.replica_to_drop(lead.replicas, peer, self.me)
        if index is None or self.state != JobState.RUNNING or lead.dropped_at == self.committed_step:
            return self._request_restart(reason)
        dropped, count = lead.replicas[index], len(lead.replicas)
        retire = self.me in dropped  # our own replica: our worker serves the data to the others from now on
        if gone:  # dead or left: not a spare for the rebuild
            self._forget(peer)
        lead.replicas = lead.replicas[:index] + lead.replicas[index + 1 :]
        lead.plan = tuple(p for devices in lead.replicas for p in devices)
        lead.dropped_at = self.committed_step
        # idle members (the dropped replica's others, say) rebuild it at the next commit, while the others hold
        lead.regrow = bool(lead.members - set(lead.plan) - {peer, self.me})
        if self.standby in dropped:
            self.standby = ""
        return [
            a.DropReplica(self.stamp, index, count, peer, reason, hold=lead.regrow, retire=retire),
            a.StopWorkers(
                self.stamp, tuple(p for p in dropped if p != self.me), JobState.REPLANNING.value, local=False
            ),
            self._track(),
            a.Persist(),
        ]

    def _track(self) -> a.TrackElection:
        """The job's election over the plan's devices and this leader (whose worker may only serve the data)."""
        lead = self.lead
        assert lead is not None
        ranking = (self.me, self.standby) if self.standby else (self.me,)
        return a.TrackElection(lead.plan if self.me in lead.plan else (*lead.plan, self.me), ranking)

    def _request_restart(self, reason: str) -> list[a.Action]:
        """Repartition: stop the plan's workers and plan again over the members that still answer, from the
        newest committed checkpoint; a job that keeps failing at the same checkpoint fails."""
        lead = self.lead
        if lead is None or self.terminal or self.state in (JobState.WAITING, JobState.PAUSED):
            return []
        if self.state == JobState.RECOVERING:
            return []  # already repartitioning (the first reason wins): the members that answer are planned over
        lead.restart_reason = reason
        tries = lead.restarts_at.get(self.committed_step, 0) + 1
        lead.restarts_at[self.committed_step] = tries
        if tries > MAX_RESTARTS_PER_CHECKPOINT:
            return [
                a.CancelStart(),
                *self._finish(
                    JobState.FAILED,
                    f"{reason} (gave up after {tries - 1} "
                    f"repartitions that made no progress past step {self.committed_step})",
                ),
            ]
        old = lead.plan
        lead.recovering_from = old
        lead.regrow, lead.regrow_at = False, 0
        self.state, self.error = JobState.RECOVERING, reason
        self.stamp = self.stamp.next_term()
        lead.plan, lead.committing, lead.rebalance = (), set(), False
        others = tuple(p for p in old if p != self.me and p in lead.members)
        return [
            a.CancelStart(),
            a.StartRecovery(reason, self.stamp.epoch + 1),
            a.StopWorkers(self.stamp, others, JobState.REPLANNING.value),
            a.CheckReachable(self.stamp, others),
        ]

    def _name_the_cause(self, death: str) -> list[a.Action]:
        """A member of the plan the repartition began from was declared dead: that is why (a neighbour's broken
        link to it usually comes first, and named the neighbour's worker, never the dead device: issue 31)."""
        lead = self.lead
        assert lead is not None
        if lead.restart_reason.startswith(death):
            return []
        reason = f"{death} (first seen as: {lead.restart_reason})" if lead.restart_reason else death
        lead.restart_reason, self.error = reason, reason
        return [a.RecoveryCause(reason)]

    def _finish(self, state: JobState, error: str) -> list[a.Action]:
        """End the job: tell its members (the plan's, the owner, and the spares, which would otherwise still say
        they are one) when we lead, then leave the election."""
        peers: tuple[str, ...] = ()
        if self.lead is not None and self.leads:
            peers = tuple(sorted(p for p in self.lead.members if p != self.me))
        self.state, self.error = state, error
        out: list[a.Action] = [a.StopWorkers(self.stamp, peers, state.value), a.Finish(state, error)]
        if lifecycle.ends_election(state):
            out.append(a.UntrackElection())
        return [*out, a.Persist()]


__all__ = [
    "MAX_BLAMED_FAILURES",
    "MAX_RESTARTS_PER_CHECKPOINT",
    "MAX_START_REFUSALS",
    "REBALANCE_REASON",
    "SERVE_BLAME_SPACING_S",
    "JobCore",
    "LeaderState",
]
