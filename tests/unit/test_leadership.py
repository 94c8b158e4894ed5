"""Who may command a job (arceusd.jobs.core.leadership), and the interleaving that failed a job in CI: membership
declared the live owner dead under load, its standby won a newer term with the third member and re-tracked the
job without the owner; the owner, which never saw itself die, kept commanding. The members must refuse it naming
the leader they follow, and the owner must then hand over instead of repartitioning until the job fails.

The elections are the real pure cores (arceusd.elections.core) wired by a small in-memory router with a fake clock;
a message to a peer whose election does not count the sender as a member is dropped, as the driver does."""

from __future__ import annotations

import random

from arceusd.elections.core import (
    Election,
    ElectionAction,
    ElectionEvent,
    ElectionState,
    ElectionTick,
    LeaderAnnounced,
    SendLeaderAnnounce,
    SendVoteReply,
    SendVoteRequest,
    ViewChanged,
    VoteReplied,
    VoteRequested,
    election_local,
)
from arceusd.jobs.core.leadership import (
    Accept,
    AskElection,
    Go,
    HandOver,
    Refuse,
    Restart,
    followed_leader,
    judge_command,
    refusal,
    start_outcome,
)

CFG = election_local()
OWNER, STANDBY, OTHER = "a" * 32, "b" * 32, "c" * 32
JOB = "f" * 32


class Cluster:
    """Elections of several peers; actions become events at their recipients (bounded rounds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.peers: dict[str, Election] = {}

    def track(self, me: str, members: tuple[str, ...], ranking: tuple[str, ...], live: frozenset[str]) -> None:
        old = self.peers.get(me)
        term, vote = (old.term, old.voted_for) if old is not None else (0, None)
        e = Election(JOB, me, members, CFG, random.Random(7), self.now, term, vote, ranking=ranking)
        self.peers[me] = e
        self.feed(me, ViewChanged(live))

    def feed(self, me: str, event: ElectionEvent) -> None:
        queue: list[tuple[str, ElectionAction]] = [(me, a) for a in self.peers[me].handle(event, self.now)]
        for _ in range(10_000):
            if not queue:
                return
            sender, action = queue.pop(0)
            if not isinstance(action, SendVoteRequest | SendVoteReply | SendLeaderAnnounce):
                continue
            to = self.peers.get(action.to)
            if to is None or sender not in to.members:
                continue  # the driver drops messages from non-members
            if isinstance(action, SendVoteRequest):
                ev: ElectionEvent = VoteRequested(sender, JOB, action.term, action.pre_vote)
            elif isinstance(action, SendVoteReply):
                ev = VoteReplied(sender, JOB, action.term, action.granted, action.pre_vote, action.leader)
            else:
                ev = LeaderAnnounced(sender, JOB, action.term)
            queue += [(action.to, a) for a in to.handle(ev, self.now)]
        raise AssertionError("the message exchange did not settle")

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now = round(self.now + CFG.heartbeat_interval / 4, 6)
            for peer in sorted(self.peers):
                self.feed(peer, ElectionTick())

    def leader(self, me: str) -> str | None:
        e = self.peers[me]
        if e.state is ElectionState.LEADER:
            return me
        return e.leader if e.state is ElectionState.FOLLOWER else None


def test_owner_declared_dead_while_alive_is_told_who_leads_and_hands_over() -> None:
    everyone = (OWNER, STANDBY, OTHER)
    c = Cluster()
    for peer in everyone:
        c.track(peer, everyone, (OWNER, STANDBY), frozenset(everyone))
    c.run(2.0)
    assert all(c.leader(p) == OWNER for p in everyone), "the owner leads first"
    owner_term = c.peers[OWNER].term
    # The owner stalls; both members' membership declares it dead. The standby wins a newer term.
    for peer in (STANDBY, OTHER):
        c.feed(peer, ViewChanged(frozenset({STANDBY, OTHER})))
    c.run(2.0)
    assert c.leader(STANDBY) == STANDBY and c.leader(OTHER) == STANDBY
    assert c.peers[STANDBY].term > owner_term
    # It takes over: replans over the survivors and re-tracks the job's election without the owner.
    for peer in (STANDBY, OTHER):
        c.track(peer, (STANDBY, OTHER), (STANDBY, OTHER), frozenset(everyone))
    c.run(2.0)
    # The owner is back (it refuted its death). Its election cannot reach the new members' elections, so it
    # never learns who leads and never leads again; the members follow the standby.
    assert c.leader(OWNER) != STANDBY and c.leader(OWNER) != OWNER
    assert c.leader(OTHER) == STANDBY and c.peers[OTHER].term > owner_term

    # The owner's manager still believes it leads and commands a new plan at a newer job term.
    member_term, member_epoch = 5, 4  # what the members took from the standby's start
    owner_command = (OWNER, 6, 1)  # its own repartitions raised its term past theirs
    replies = []
    for peer in (STANDBY, OTHER):
        verdict = judge_command(*owner_command, leader=STANDBY, our_term=member_term, our_epoch=member_epoch)
        assert isinstance(verdict, AskElection)
        assert c.leader(peer) != OWNER, "the election did not make the owner leader: the command is refused"
        refused = refusal(STANDBY, member_term)
        replies.append((peer, refused.reason, refused.follows))
    # Before the fix the refusal said only "only the job's leader may command it": the owner repartitioned
    # again and again (Restart) and the job failed after four tries. Now it learns whom to join.
    assert start_outcome(OWNER, replies) == HandOver(STANDBY)
    # An older-term command from the owner is refused outright, naming the leader too.
    stale = judge_command(OWNER, 3, 9, leader=STANDBY, our_term=member_term, our_epoch=member_epoch)
    assert isinstance(stale, Refuse) and followed_leader(stale.follows) == STANDBY


def test_commands_from_the_leader_are_judged_by_term_then_epoch() -> None:
    assert judge_command(OWNER, 3, 2, OWNER, 3, 2) == Accept()
    assert judge_command(OWNER, 4, 0, OWNER, 3, 2) == Accept()
    assert isinstance(judge_command(OWNER, 3, 1, OWNER, 3, 2), Refuse)
    assert judge_command(OWNER, 3, 1, OWNER, 3, 2, epochs=False) == Accept()
    old = judge_command(OWNER, 2, 9, OWNER, 3, 2, epochs=False)
    assert isinstance(old, Refuse) and "stale" in old.reason and followed_leader(old.follows) is None


def test_another_peer_needs_a_newer_term_and_the_election_else_the_refusal_names_our_leader() -> None:
    assert judge_command(STANDBY, 4, 1, OWNER, 3, 2) == AskElection()
    for term in (2, 3):
        verdict = judge_command(STANDBY, term, 9, OWNER, 3, 2)
        assert isinstance(verdict, Refuse) and followed_leader(verdict.follows) == OWNER


def test_followed_leader_takes_a_peer_id_only() -> None:
    assert followed_leader(refusal(STANDBY, 7).follows) == STANDBY
    assert followed_leader(OTHER) == OTHER  # a member's answer to its owner's announce
    assert followed_leader("") is None and followed_leader("nobody") is None
    assert followed_leader(OTHER.upper()) is None and followed_leader(OTHER + "0") is None  # not a peer id


def test_start_outcome() -> None:
    assert start_outcome(OWNER, []) == Go()
    failed = start_outcome(OWNER, [(OTHER, "start refused: bad plan", "")])
    assert isinstance(failed, Restart) and "bad plan" in failed.reason
    mixed = [(OTHER, "no answer", ""), (STANDBY, "follows another", OTHER)]
    assert start_outcome(OWNER, mixed) == HandOver(OTHER), "a named leader wins over other failures"
    assert isinstance(start_outcome(OWNER, [(OTHER, "x", OWNER)]), Restart), "naming us is no hand-over"
    text_only = start_outcome(OWNER, [(OTHER, f"handed over to {STANDBY}", "")])
    assert isinstance(text_only, Restart), "a reason's text names nobody: only the typed field does"
