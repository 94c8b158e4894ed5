"""Per-job leader election over the peer service: the driver of the pure core in :mod:`arceusd.elections.core`.

Owns :class:`JobElections` (one :class:`~arceusd.elections.core.Election` per tracked job), the durable term file
(``node.paths.terms``), the mapping between core actions/events and the wire messages of
:mod:`protocol.election_wire`, one trio task that drives every election's timers, and the ``elections`` status
section and control methods. Every decision is the core's; this module only moves bytes, time and files.

Mapping:

* ``SendVoteRequest`` -> :class:`ElectionVoteRequest` over :meth:`PeerService.request`; the answer
  (:class:`ElectionVoteReply`) is fed back as ``VoteReplied``.
* ``SendLeaderAnnounce`` -> :class:`LeaderAnnounce`; a stale leader gets a rejecting ``ElectionVoteReply`` as
  the answer, fed back as ``VoteReplied`` (that is how it learns the newer term and steps down).
* Inbound requests are fed to the core; the ``SendVoteReply`` it returns for that sender becomes the call's
  answer. A ``SendVoteReply`` with no waiting call (none expected) travels as a one-way message.
* ``PersistTerm`` is written (temp file, fsync, rename, fsync dir) *synchronously, before* any later action of
  the same list is carried out - in particular before the vote reply leaves. The write blocks the event loop
  for one small fsync, which only happens when a term or vote changes; doing it inline keeps the order
  trivially right.
* Membership changes (``peers.listeners``) become ``ViewChanged(live)`` with live = alive or suspect.

Messages to peers the membership view does not hold as live are not sent (the core copes with silence).

Error handling: inbound messages for unknown jobs, from non-members, or whose body names another job than
their envelope are dropped and counted (``elections.dropped`` in status). A corrupt term file is an error at
start (the daemon must not forget terms it promised), with the path in the message. Bad ``track`` arguments
raise :class:`ValueError` saying which.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from arceusd.base.control import RequestError
from arceusd.elections.core import (
    BecameLeader,
    Election,
    ElectionAction,
    ElectionConfig,
    ElectionError,
    ElectionEvent,
    ElectionState,
    ElectionTick,
    LeaderAnnounced,
    PersistTerm,
    SendLeaderAnnounce,
    SendVoteReply,
    SendVoteRequest,
    StateChanged,
    ViewChanged,
    VoteReplied,
    VoteRequested,
    election_lan,
    election_local,
)
from arceusd.membership.events import MemberChanged, MemberState
from protocol.election_wire import ElectionVoteReply, ElectionVoteRequest, LeaderAnnounce
from protocol.envelope import Header

log = logging.getLogger(__name__)

LeaderChangeCallback = Callable[[str, "tuple[str, int] | None"], None]
_HEX_ID = re.compile(r"^[0-9a-f]{32}$")
_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)


# ------------------------------------------------------------------------------------------------ term file
def load_terms(path: Path) -> dict[str, tuple[int, str | None]]:
    """job -> (highest term, vote in that term) from ``path``; empty when the file does not exist."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"the term file {path} is unreadable ({exc}); it holds promises made to peers, so fix or "
            "restore it rather than deleting it (deleting it may let this peer vote twice in one term)"
        ) from exc
    jobs = raw.get("jobs") if isinstance(raw, dict) else None
    if not isinstance(jobs, dict):
        raise RuntimeError(f"the term file {path} has no 'jobs' table; restore it from a backup")
    out: dict[str, tuple[int, str | None]] = {}
    for job, entry in jobs.items():
        term = entry.get("term") if isinstance(entry, dict) else None
        vote = entry.get("voted_for") if isinstance(entry, dict) else None
        if not isinstance(term, int) or term < 0 or not (vote is None or isinstance(vote, str)):
            raise RuntimeError(f"the term file {path} has a bad entry for job {job!r}: {entry!r}")
        out[str(job)] = (term, vote)
    return out


def write_terms(path: Path, terms: dict[str, tuple[int, str | None]]) -> None:
    """Atomically replace ``path`` with ``terms`` (temp file, fsync, rename, fsync of the directory)."""
    body = {"version": 1, "jobs": {job: {"term": t, "voted_for": v} for job, (t, v) in sorted(terms.items())}}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(body, indent=1).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------------------------ driver
class JobElections:
    """Every tracked job's election on this peer.

    ``peers`` is a :class:`arceusd.network.peers.PeerService` (or anything with its ``register``/``request``/
    ``membership``/``listeners``/``identity``). :meth:`run` must be running for messages to flow.
    """

    def __init__(self, peers: Any, terms_path: Path, config: ElectionConfig, rng: random.Random | None = None) -> None:
        self.peers = peers
        self.self_id: str = peers.identity.peer_id
        self.config = config
        self.terms_path = terms_path
        self.dropped: Counter[str] = Counter()
        self._rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self._persisted = load_terms(terms_path)
        self._elections: dict[str, Election] = {}
        self._leaders: dict[str, tuple[str, int] | None] = {}
        self._callbacks: list[LeaderChangeCallback] = []
        self._live: frozenset[str] = frozenset({self.self_id})
        self._nursery: trio.Nursery | None = None
        self._wakeup = trio.Event()
        peers.register(ElectionVoteRequest, self._on_vote_request)
        peers.register(ElectionVoteReply, self._on_vote_reply)
        peers.register(LeaderAnnounce, self._on_announce)
        peers.listeners.append(self._on_member_changed)

    # ------------------------------------------------------------------------------------------ public API
    def track(self, job_id: str, members: list[str], ranking: list[str] | None = None) -> None:
        """Start electing a leader for ``job_id`` among ``members`` (peer ids, this peer included); only the
        members in ``ranking`` may lead, the first live one of them first (see :class:`Election`).

        Tracking a job again with the same members and ranking is a no-op; with others it goes on in the same
        term with the same leader when that leader may still lead (:meth:`Election.carry_over`; membership of a
        job changes through a new plan, which re-tracks it), else elects afresh from the persisted term.
        """
        if not _HEX_ID.match(job_id):
            raise ValueError(f"job id must be 32 lowercase hex characters, got {job_id!r}")
        bad = [m for m in members if not isinstance(m, str) or not _HEX_ID.match(m)]
        if bad:
            raise ValueError(f"member ids must be 32 lowercase hex characters; bad: {bad!r}")
        if self.self_id not in members:
            raise ValueError(
                f"this peer ({self.self_id}) is not among the members of job {job_id}; "
                "only members run a job's election"
            )
        current = self._elections.get(job_id)
        wanted = tuple(ranking) if ranking is not None else None
        if current is not None and current.members == frozenset(members) and current.ranking == wanted:
            return
        if current is not None:
            self._remember(current)
        term, vote = self._persisted.get(job_id, (0, None))
        election = Election(
            job_id, self.self_id, members, self.config, self._rng, self._now(), term, vote, ranking=wanted
        )
        if current is not None:
            election.carry_over(current, self._now())
        self._elections[job_id] = election
        self._leaders.setdefault(job_id, None)
        log.info("tracking the election of job %s with %d members (term %d)", job_id[:12], len(members), term)
        self._feed(job_id, ViewChanged(self._live))

    def untrack(self, job_id: str) -> None:
        """Stop electing for ``job_id`` (its persisted term is kept: terms never go back)."""
        election = self._elections.pop(job_id, None)
        if election is not None:
            self._remember(election)
            if self._leaders.pop(job_id, None) is not None:
                self._notify(job_id, None)

    def jobs(self) -> list[str]:
        return sorted(self._elections)

    def leader(self, job_id: str) -> tuple[str, int] | None:
        """``(leader peer id, term)`` once a majority acknowledged that term's leader, else None."""
        e = self._elections.get(job_id)
        if e is None:
            return None
        if e.state is ElectionState.LEADER:
            return (self.self_id, e.term)
        if e.state is ElectionState.FOLLOWER and e.leader is not None and e.leader in self._live:
            return (e.leader, e.term)
        return None

    def state(self, job_id: str) -> str:
        """'leader', 'follower', 'candidate' or 'paused' ('untracked' for a job we do not track)."""
        e = self._elections.get(job_id)
        return "untracked" if e is None else e.state.value

    def term(self, job_id: str) -> int:
        e = self._elections.get(job_id)
        if e is not None:
            return e.term
        return self._persisted.get(job_id, (0, None))[0]

    def check_command(self, job_id: str, term: int, sender: str) -> bool:
        """Whether a leader command stamped ``(job_id, term)`` from ``sender`` may be acted on (a job's plan
        epochs are its core's: :class:`arceusd.jobs.core.Stamp`)."""
        return self.check_command_reason(job_id, term, sender)[0]

    def check_command_reason(self, job_id: str, term: int, sender: str) -> tuple[bool, str]:
        """:meth:`check_command` with the reason (for logs and the control API)."""
        e = self._elections.get(job_id)
        if e is None:
            return False, f"this peer does not track job {job_id!r}"
        verdict = e.check_command(job_id, term, sender, self._now())
        self._carry_out(job_id, list(verdict.actions))
        return verdict.accepted, verdict.reason

    def on_leader_change(self, callback: LeaderChangeCallback) -> None:
        """Call ``callback(job_id, (leader, term) | None)`` whenever :meth:`leader` changes for a job."""
        self._callbacks.append(callback)

    def summary(self) -> dict[str, Any]:
        """job -> {leader, term, state, members, candidate}: the ``elections`` status section."""
        out: dict[str, Any] = {}
        for job, e in sorted(self._elections.items()):
            leader = self.leader(job)
            out[job] = {
                "leader": leader[0] if leader else None,
                "term": e.term,
                "state": e.state.value,
                "members": sorted(e.members),
                "candidate": e.candidate(),
            }
        return out

    # ------------------------------------------------------------------------------------------ running
    @staticmethod
    def _now() -> float:
        return trio.current_time()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive every election's timers until cancelled; owns the nursery the outbound messages run in."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    deadline = min((e.next_deadline() for e in self._elections.values()), default=math.inf)
                    # The core only returns future deadlines; the floor guards against a spin otherwise.
                    with trio.move_on_at(max(deadline, self._now() + 0.001)):
                        await self._wakeup.wait()
                    now = self._now()
                    for job, e in list(self._elections.items()):
                        if e.next_deadline() <= now:
                            self._feed(job, ElectionTick())
                    self._wakeup = trio.Event()  # after our own feeds, which set it (see PeerService.run)
            finally:
                self._nursery = None

    # ------------------------------------------------------------------------------------------ core glue
    def _feed(self, job_id: str, event: ElectionEvent, answer_to: str | None = None) -> SendVoteReply | None:
        e = self._elections.get(job_id)
        if e is None:
            return None
        return self._carry_out(job_id, e.handle(event, self._now()), answer_to)

    def _carry_out(
        self, job_id: str, actions: list[ElectionAction], answer_to: str | None = None
    ) -> SendVoteReply | None:
        """Carry out ``actions`` in order; return the vote reply to ``answer_to`` (the call's answer)."""
        answer: SendVoteReply | None = None
        for action in actions:
            if isinstance(action, PersistTerm):
                self._persist()
            elif isinstance(action, SendVoteReply) and action.to == answer_to and answer is None:
                answer = action
            elif isinstance(action, SendVoteRequest | SendLeaderAnnounce | SendVoteReply):
                self._send(action)
            elif isinstance(action, BecameLeader):
                log.info("leader of job %s in term %d", action.job[:12], action.term)
            elif isinstance(action, StateChanged):
                log.debug(
                    "job %s: %s at term %d (leader %s)", action.job[:12], action.state.value, action.term, action.leader
                )
        leader = self.leader(job_id)
        if leader != self._leaders.get(job_id):
            self._leaders[job_id] = leader
            self._notify(job_id, leader)
        self._wakeup.set()
        return answer

    def _notify(self, job_id: str, leader: tuple[str, int] | None) -> None:
        shown = f"{leader[0][:12]} (term {leader[1]})" if leader else "none"
        log.info("job %s leader is now %s", job_id[:12], shown)
        for callback in self._callbacks:
            try:
                callback(job_id, leader)
            except Exception:
                log.exception("a leader-change callback failed for job %s", job_id)

    def _remember(self, e: Election) -> None:
        self._persisted[e.job] = (e.term, e.voted_for)

    def _persist(self) -> None:
        for e in self._elections.values():
            self._remember(e)
        write_terms(self.terms_path, self._persisted)

    # ------------------------------------------------------------------------------------------ outbound
    def _address(self, peer: str) -> str | None:
        member = self.peers.membership.members.get(peer)
        if member is None or member.state not in _LIVE:
            return None
        address: str = member.address
        return address

    def _send(self, action: SendVoteRequest | SendLeaderAnnounce | SendVoteReply) -> None:
        address = self._address(action.to)
        if address is None or self._nursery is None:
            self.dropped["send_to_not_live"] += 1
            return
        self._nursery.start_soon(self._deliver, address, action)

    async def _deliver(self, address: str, action: SendVoteRequest | SendLeaderAnnounce | SendVoteReply) -> None:
        msg: object
        if isinstance(action, SendVoteRequest):
            msg = ElectionVoteRequest(action.job, action.term, action.pre_vote)
        elif isinstance(action, SendLeaderAnnounce):
            msg = LeaderAnnounce(action.job, action.term)
        else:
            msg = ElectionVoteReply(action.job, action.term, action.granted, action.pre_vote, action.leader)
        answer = await self.peers.request(
            address, action.to, msg, timeout=self.config.election_timeout, job_id=action.job, term=action.term
        )
        if isinstance(answer, ElectionVoteReply) and answer.job == action.job:
            self._feed(
                action.job,
                VoteReplied(action.to, answer.job, answer.term, answer.granted, answer.pre_vote, answer.leader),
            )

    # ------------------------------------------------------------------------------------------ inbound
    def _accepts(self, header: Header, job: str) -> bool:
        if header.job_id != job:
            self.dropped["job_mismatch"] += 1
            return False
        if job not in self._elections:
            self.dropped["unknown_job"] += 1
            return False
        if header.sender not in self._elections[job].members:
            self.dropped["not_a_member"] += 1
            return False
        return True

    @staticmethod
    def _reply(action: SendVoteReply | None) -> ElectionVoteReply | None:
        if action is None:
            return None
        return ElectionVoteReply(action.job, action.term, action.granted, action.pre_vote, action.leader)

    async def _on_vote_request(self, header: Header, msg: ElectionVoteRequest) -> ElectionVoteReply | None:
        if not self._accepts(header, msg.job):
            return None
        event = VoteRequested(header.sender, msg.job, msg.term, msg.pre_vote)
        return self._reply(self._feed(msg.job, event, answer_to=header.sender))

    async def _on_vote_reply(self, header: Header, msg: ElectionVoteReply) -> None:
        if self._accepts(header, msg.job):
            event = VoteReplied(header.sender, msg.job, msg.term, msg.granted, msg.pre_vote, msg.leader)
            self._feed(msg.job, event)

    async def _on_announce(self, header: Header, msg: LeaderAnnounce) -> ElectionVoteReply | None:
        if not self._accepts(header, msg.job):
            return None
        event = LeaderAnnounced(header.sender, msg.job, msg.term)
        return self._reply(self._feed(msg.job, event, answer_to=header.sender))

    def _on_member_changed(self, _change: MemberChanged) -> None:
        live = frozenset(self.peers.membership.live_peers()) | {self.self_id}
        if live == self._live:
            return
        self._live = live
        for job in list(self._elections):
            self._feed(job, ViewChanged(live))


# ------------------------------------------------------------------------------------------------ install
def election_config(preset: str) -> ElectionConfig:
    return election_local() if preset == "local" else election_lan()


def install_elections(node: Any, peers: Any) -> JobElections:
    """Attach per-job elections to ``node`` (``node.elections``), its status section and control methods.

    The caller runs ``await nursery.start(elections.run)`` in the network service's nursery, so a failure in
    the timer task surfaces there instead of crashing the daemon from a system task.
    """
    elections = JobElections(peers, node.paths.terms, election_config(node.config.preset))
    node.elections = elections
    node.sections["elections"] = lambda: {"jobs": elections.summary(), "dropped": dict(elections.dropped)}

    async def elections_method(_params: dict[str, Any]) -> dict[str, Any]:
        return elections.summary()

    async def track_job(params: dict[str, Any]) -> dict[str, Any]:
        job, members = params.get("job_id"), params.get("members")
        if not isinstance(job, str) or not isinstance(members, list):
            raise RequestError("track_job needs {'job_id': str, 'members': [peer_id, ...]}")
        try:
            elections.track(job, members)
        except (ValueError, ElectionError) as exc:
            raise RequestError(str(exc)) from exc
        summary: dict[str, Any] = elections.summary()[job]
        return summary

    async def untrack_job(params: dict[str, Any]) -> dict[str, Any]:
        job = params.get("job_id")
        if not isinstance(job, str):
            raise RequestError("untrack_job needs {'job_id': str}")
        elections.untrack(job)
        return {"untracked": job}

    async def check_command(params: dict[str, Any]) -> dict[str, Any]:
        job, term, sender = (params.get(k) for k in ("job_id", "term", "sender"))
        if not (isinstance(job, str) and isinstance(sender, str) and isinstance(term, int)):
            raise RequestError("check_command needs {'job_id': str, 'term': int, 'sender': peer_id}")
        accepted, reason = elections.check_command_reason(job, term, sender)
        return {"accepted": accepted, "reason": reason}

    node.methods.update(
        {
            "elections": elections_method,
            "track_job": track_job,
            "untrack_job": untrack_job,
            "check_command": check_command,
        }
    )
    return elections
