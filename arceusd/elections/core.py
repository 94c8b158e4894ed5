"""Per-job leader election with terms: a pure state machine (no I/O, no clock, seeded randomness only).

Owns :class:`Election` (one per job this peer is a member of), its config presets, events and actions.

Design (Raft's election, with membership doing failure detection):

* The job's members are fixed for the life of the object; a new plan's members get a new object, which
  keeps the old one's term and leader (:meth:`Election.carry_over`). The membership view (live = alive or
  suspect) is fed in with :class:`ViewChanged`. The *candidate* is the first live member of ``ranking`` when
  one is given (a job ranks its current leader first and its standby, which holds the data and the leader's
  checkpoint shards, second: only they can lead it, and the standby only once the leader is gone from the
  view); without a ranking it is the live member with the lowest peer id (string order). Members outside the
  ranking vote, never lead.
* A side that sees fewer than a majority of the job's members live is PAUSED: it neither campaigns nor leads
  (a leader that loses its majority steps down at once).
* Only the candidate campaigns, and only when it knows no live leader (announces heard within
  ``election_timeout``) and after listening for one ``election_timeout`` since it started. A campaign is a
  pre-vote round (Raft thesis 9.6: nobody changes state, so a rejoining peer cannot inflate terms) and, with a
  majority of pre-votes, a real vote at ``term + 1``. A peer grants a vote only to the candidate of ITS view,
  only if it knows no live leader, and at most once per term. It persists ``(term, voted_for)`` via
  :class:`PersistTerm` BEFORE the reply that follows it in the action list (the driver must honour that
  order).
* The candidate becomes LEADER only with granted votes from a majority of the job's members (itself included).
  Since each peer votes once per term and majorities intersect, there is never more than one leader per
  ``(job, term)``.
* The leader announces its term every ``heartbeat_interval``. :meth:`Election.check_command` judges a
  command's ``(job, term)`` and sender: it rejects other jobs, older terms and a different sender than the
  term's known leader; a newer term is adopted (and persisted). Plan epochs are not the election's: a job's
  ``(term, epoch)`` stamp lives in its core (:class:`arceusd.jobs.core.Stamp`).
  An announce with an older term is answered with a rejecting :class:`SendVoteReply` at our term, which makes
  a stale leader step down.

Error handling: events for another job or from non-members are ignored (the driver should count them).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

PeerId = str


class ElectionError(Exception):
    """The election API was misused (a bug in the caller); the message says how."""


class ElectionState(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"
    PAUSED = "paused"


@dataclass(frozen=True, slots=True)
class ElectionConfig:
    election_timeout: float
    heartbeat_interval: float

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval < self.election_timeout:
            raise ValueError("need 0 < heartbeat_interval < election_timeout (several heartbeats per timeout)")


def election_lan() -> ElectionConfig:
    return ElectionConfig(election_timeout=3.0, heartbeat_interval=1.0)


def election_local() -> ElectionConfig:
    return ElectionConfig(election_timeout=0.3, heartbeat_interval=0.1)


# ------------------------------------------------------------------------------------------------- inputs
@dataclass(frozen=True, slots=True)
class ViewChanged:
    """The membership view: peers currently alive or suspect (ourselves included)."""

    live: frozenset[PeerId]


@dataclass(frozen=True, slots=True)
class ElectionTick:
    pass


@dataclass(frozen=True, slots=True)
class VoteRequested:
    sender: PeerId
    job: str
    term: int
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class VoteReplied:
    sender: PeerId
    job: str
    term: int
    granted: bool
    pre_vote: bool
    leader: PeerId = ""


@dataclass(frozen=True, slots=True)
class LeaderAnnounced:
    sender: PeerId
    job: str
    term: int


ElectionEvent = ViewChanged | ElectionTick | VoteRequested | VoteReplied | LeaderAnnounced


# ------------------------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class PersistTerm:
    """Write ``(term, voted_for)`` durably before carrying out the actions after it."""

    job: str
    term: int
    voted_for: PeerId | None


@dataclass(frozen=True, slots=True)
class SendVoteRequest:
    to: PeerId
    job: str
    term: int
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class SendVoteReply:
    to: PeerId
    job: str
    term: int
    granted: bool
    pre_vote: bool
    leader: PeerId


@dataclass(frozen=True, slots=True)
class SendLeaderAnnounce:
    to: PeerId
    job: str
    term: int


@dataclass(frozen=True, slots=True)
class BecameLeader:
    job: str
    term: int


@dataclass(frozen=True, slots=True)
class StateChanged:
    job: str
    state: ElectionState
    term: int
    leader: PeerId | None


ElectionAction = PersistTerm | SendVoteRequest | SendVoteReply | SendLeaderAnnounce | BecameLeader | StateChanged


@dataclass(frozen=True, slots=True)
class CommandCheck:
    """Verdict of :meth:`Election.check_command`; carry out ``actions`` (PersistTerm) before acting on it."""

    accepted: bool
    reason: str
    actions: tuple[ElectionAction, ...] = ()


class Election:
    """One peer's election state for one job."""

    def __init__(
        self,
        job: str,
        self_id: PeerId,
        members: Iterable[PeerId],
        config: ElectionConfig,
        rng: random.Random,
        now: float,
        term: int = 0,
        voted_for: PeerId | None = None,
        ranking: Iterable[PeerId] | None = None,
    ) -> None:
        self.members = frozenset(members)
        if self_id not in self.members:
            raise ElectionError(f"peer {self_id} is not a member of job {job}; only members run its election")
        self.ranking: tuple[PeerId, ...] | None = tuple(ranking) if ranking is not None else None
        if self.ranking is not None and (not self.ranking or not set(self.ranking) <= self.members):
            raise ElectionError(f"job {job}: the ranking must name at least one member and only members")
        if term < 0:
            raise ElectionError("a persisted term is >= 0")
        self.job = job
        self.self_id = self_id
        self.config = config
        self._rng = rng
        self.term = term
        self.voted_for = voted_for
        self.state = ElectionState.PAUSED
        self.leader: PeerId | None = None
        self._live: frozenset[PeerId] = frozenset({self_id})
        self._quiet_until = now + config.election_timeout
        self._last_leader_contact = -math.inf
        self._pre = False
        self._votes: set[PeerId] = set()
        self._deadline = math.inf
        self._next_heartbeat = math.inf
        self._last_now = now

    def carry_over(self, previous: Election, now: float) -> None:
        """Go on from ``previous`` (this job's election on its old members) in the same term: a new plan changes
        a job's members, not who leads it. A leader that may still lead (a member, and ranked when there is a
        ranking) stays leader and announces to the new members at once; a follower keeps its leader and when it
        last heard from it. Without this every new plan would leave the job leaderless for an election timeout
        and cost a new term. Safe: the term's leader was elected by a majority of the old members, and terms
        still only go up. Call before the first event."""
        leader = previous.leader
        if previous.term != self.term or leader is None or leader not in self.members:
            return
        if self.ranking is not None and leader not in self.ranking:
            return
        if leader == self.self_id and previous.state is ElectionState.LEADER:
            self.state, self.leader = ElectionState.LEADER, leader
            self._next_heartbeat = now  # the next event announces the term to every (new) member
        elif leader != self.self_id and previous.state is ElectionState.FOLLOWER:
            self.state, self.leader = ElectionState.FOLLOWER, leader
            self._last_leader_contact = previous._last_leader_contact
            self._quiet_until = previous._quiet_until

    # ----------------------------------------------------------------------------------------- queries
    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1

    def candidate(self) -> PeerId | None:
        """The best-ranked live member in our view: the first live one of ``ranking``, else the lowest peer id."""
        live = self._live & self.members
        if self.ranking is not None:
            return next((p for p in self.ranking if p in live), None)
        return min(live) if live else None

    def next_deadline(self) -> float:
        deadline = min(self._deadline, self._next_heartbeat)
        if self.state is ElectionState.FOLLOWER:
            # Wake when the listening period ends or the leader's announces go stale (future times only).
            for t in (self._quiet_until, self._last_leader_contact + self.config.election_timeout + 1e-9):
                if t > self._last_now:
                    deadline = min(deadline, t)
        return deadline

    # ----------------------------------------------------------------------------------------- events
    def handle(self, event: ElectionEvent, now: float) -> list[ElectionAction]:
        actions: list[ElectionAction] = []
        self._last_now = max(self._last_now, now)
        self._advance(now, actions)
        if isinstance(event, ViewChanged):
            self._live = event.live | {self.self_id}
        elif isinstance(event, ElectionTick):
            pass
        elif isinstance(event, VoteRequested):
            if event.job == self.job and event.sender in self.members and event.sender != self.self_id:
                self._on_vote_request(event, now, actions)
        elif isinstance(event, VoteReplied):
            if event.job == self.job and event.sender in self.members:
                self._on_vote_reply(event, now, actions)
        elif isinstance(event, LeaderAnnounced):
            if event.job == self.job and event.sender in self.members:
                self._on_announce(event, now, actions)
        else:
            raise TypeError(f"Election.handle got {type(event).__name__}, which is not an election event")
        self._evaluate(now, actions)
        return actions

    def check_command(self, job: str, term: int, sender: PeerId, now: float) -> CommandCheck:
        """Accept a leader command stamped ``(job, term)`` from ``sender``, or say why not."""
        if job != self.job:
            return CommandCheck(False, f"command for job {job!r} reached the election of job {self.job!r}")
        if sender not in self.members:
            return CommandCheck(False, f"{sender} is not a member of job {job!r}")
        if term < self.term:
            return CommandCheck(False, f"stale term {term}: this peer is at term {self.term}")
        actions: list[ElectionAction] = []
        if term > self.term:
            self._adopt_term(term, actions)
        elif self.leader is not None and sender != self.leader:
            return CommandCheck(False, f"{sender} is not the leader of term {term} (that is {self.leader})")
        self._follow(sender, now, actions)
        return CommandCheck(True, "ok", tuple(actions))

    # ----------------------------------------------------------------------------------------- internals
    def _leader_fresh(self, now: float) -> bool:
        if self.leader is None:
            return False
        if self.leader == self.self_id:
            return self.state is ElectionState.LEADER
        return self.leader in self._live and now - self._last_leader_contact <= self.config.election_timeout

    def _advance(self, now: float, actions: list[ElectionAction]) -> None:
        if self.state is ElectionState.CANDIDATE and now >= self._deadline:
            self._deadline = math.inf
            self._set_state(ElectionState.FOLLOWER, actions)  # _evaluate campaigns again if still candidate
        if self.state is ElectionState.LEADER and now >= self._next_heartbeat:
            self._next_heartbeat = now + self.config.heartbeat_interval
            self._announce(actions)

    def _evaluate(self, now: float, actions: list[ElectionAction]) -> None:
        if len(self._live & self.members) < self.majority:
            if self.state is not ElectionState.PAUSED:
                if self.leader == self.self_id:
                    self.leader = None
                self._deadline = self._next_heartbeat = math.inf
                self._set_state(ElectionState.PAUSED, actions)
            return
        if self.state is ElectionState.PAUSED:
            self._set_state(ElectionState.FOLLOWER, actions)
        if self.state is not ElectionState.FOLLOWER or self._leader_fresh(now) or now < self._quiet_until:
            return
        if self.candidate() == self.self_id:
            self._campaign(now, pre=True, actions=actions)

    def _campaign(self, now: float, pre: bool, actions: list[ElectionAction]) -> None:
        self._pre = pre
        self._votes = {self.self_id}
        if not pre:
            self.term += 1
            self.voted_for = self.self_id
            self.leader = None
            actions.append(PersistTerm(self.job, self.term, self.self_id))
        self._deadline = now + self.config.election_timeout * (1.0 + self._rng.random())
        self._set_state(ElectionState.CANDIDATE, actions)
        if self.majority <= 1:
            self._won_round(now, actions)
            return
        asked_term = self.term + 1 if pre else self.term
        for peer in sorted(self.members - {self.self_id}):
            actions.append(SendVoteRequest(peer, self.job, asked_term, pre))

    def _won_round(self, now: float, actions: list[ElectionAction]) -> None:
        if self._pre:
            self._campaign(now, pre=False, actions=actions)
            return
        self._deadline = math.inf
        self.leader = self.self_id
        self._set_state(ElectionState.LEADER, actions)
        actions.append(BecameLeader(self.job, self.term))
        self._next_heartbeat = now + self.config.heartbeat_interval
        self._announce(actions)

    def _announce(self, actions: list[ElectionAction]) -> None:
        for peer in sorted(self.members - {self.self_id}):
            actions.append(SendLeaderAnnounce(peer, self.job, self.term))

    def _would_vote_for(self, sender: PeerId, now: float) -> bool:
        return (
            self.state is not ElectionState.LEADER
            and sender == self.candidate()
            and not (self._leader_fresh(now) and self.leader != sender)
        )

    def _on_vote_request(self, event: VoteRequested, now: float, actions: list[ElectionAction]) -> None:
        willing = self._would_vote_for(event.sender, now)
        if event.pre_vote:
            fresh_term = event.term > self.term or (event.term == self.term and self.voted_for in (None, event.sender))
            granted = willing and fresh_term
            actions.append(SendVoteReply(event.sender, self.job, self.term, granted, True, self.leader or ""))
            return
        if event.term < self.term or (event.term > self.term and not willing and self._leader_fresh(now)):
            actions.append(SendVoteReply(event.sender, self.job, self.term, False, False, self.leader or ""))
            return
        changed = False
        if event.term > self.term:
            self._adopt_term(event.term, actions, persist=False)
            changed = True
        granted = self._would_vote_for(event.sender, now) and self.voted_for in (None, event.sender)
        if granted and self.voted_for is None:
            self.voted_for = event.sender
            changed = True
        if granted:
            self._quiet_until = now + self.config.election_timeout
        if changed:
            actions.append(PersistTerm(self.job, self.term, self.voted_for))
        actions.append(SendVoteReply(event.sender, self.job, self.term, granted, False, self.leader or ""))

    def _on_vote_reply(self, event: VoteReplied, now: float, actions: list[ElectionAction]) -> None:
        if event.term > self.term and not (event.pre_vote and event.granted):
            self._adopt_term(event.term, actions)
            return
        if self.state is not ElectionState.CANDIDATE or event.pre_vote != self._pre or not event.granted:
            return
        if not event.pre_vote and event.term != self.term:
            return
        self._votes.add(event.sender)
        if len(self._votes) >= self.majority:
            self._won_round(now, actions)

    def _on_announce(self, event: LeaderAnnounced, now: float, actions: list[ElectionAction]) -> None:
        if event.sender == self.self_id:
            return
        if event.term < self.term:
            # A stale leader (e.g. back from a partition): tell it our term so it steps down (Raft's reply to
            # an old-term AppendEntries). A rejection reply carries exactly that.
            actions.append(SendVoteReply(event.sender, self.job, self.term, False, False, self.leader or ""))
            return
        if event.term > self.term:
            self._adopt_term(event.term, actions)
        elif self.state is ElectionState.LEADER:
            return  # cannot happen while votes are persisted; ignore rather than follow a second leader
        self._follow(event.sender, now, actions)

    def _follow(self, leader: PeerId, now: float, actions: list[ElectionAction]) -> None:
        self._last_leader_contact = now
        if self.leader == leader and self.state is not ElectionState.CANDIDATE:
            return
        self.leader = leader
        if self.state is ElectionState.CANDIDATE:
            self._deadline = math.inf
            self._set_state(ElectionState.FOLLOWER, actions)
        else:
            actions.append(StateChanged(self.job, self.state, self.term, self.leader))

    def _adopt_term(self, term: int, actions: list[ElectionAction], persist: bool = True) -> None:
        self.term = term
        self.voted_for = None
        self.leader = None
        if persist:
            actions.append(PersistTerm(self.job, term, None))
        if self.state in (ElectionState.CANDIDATE, ElectionState.LEADER):
            self._deadline = self._next_heartbeat = math.inf
            self._set_state(ElectionState.FOLLOWER, actions)

    def _set_state(self, state: ElectionState, actions: list[ElectionAction]) -> None:
        self.state = state
        actions.append(StateChanged(self.job, state, self.term, self.leader))
