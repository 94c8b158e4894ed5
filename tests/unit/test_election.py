"""Election core: votes once per term, persists before replying, rejects older terms/epochs, pauses without a
majority, pre-votes change nothing. Driven directly with a fake clock."""

from __future__ import annotations

import random

import pytest

from arceusd.elections.core import (
    BecameLeader,
    Election,
    ElectionError,
    ElectionState,
    ElectionTick,
    LeaderAnnounced,
    PersistTerm,
    SendLeaderAnnounce,
    SendVoteReply,
    SendVoteRequest,
    ViewChanged,
    VoteReplied,
    VoteRequested,
    election_local,
)

MEMBERS = ("a", "b", "c", "d", "e")
CFG = election_local()


def make(me: str, term: int = 0, voted: str | None = None) -> Election:
    e = Election("job", me, MEMBERS, CFG, random.Random(1), now=0.0, term=term, voted_for=voted)
    e.handle(ViewChanged(frozenset(MEMBERS)), 0.0)
    return e


def state_of(e: Election) -> ElectionState:
    """``e.state`` read afresh: mypy keeps an attribute's narrowing across ``e.handle()``, which changes it."""
    return e.state


def test_not_a_member_is_refused() -> None:
    with pytest.raises(ElectionError, match="not a member"):
        Election("job", "z", MEMBERS, CFG, random.Random(0), now=0.0)


def test_candidate_is_lowest_live_id_and_waits_one_timeout_before_campaigning() -> None:
    e = make("a")
    assert e.candidate() == "a" and e.state is ElectionState.FOLLOWER
    out = e.handle(ElectionTick(), CFG.election_timeout)
    reqs = [x for x in out if isinstance(x, SendVoteRequest)]
    assert {r.to for r in reqs} == set(MEMBERS) - {"a"}
    assert all(r.pre_vote and r.term == 1 for r in reqs)
    assert e.term == 0 and not [x for x in out if isinstance(x, PersistTerm)]  # pre-vote changes nothing


def _win(e: Election, now: float) -> list[object]:
    out: list[object] = list(e.handle(ElectionTick(), now))
    for voter in ("b", "c"):
        out += e.handle(VoteReplied(voter, "job", e.term, True, True), now)
    assert e.state is ElectionState.CANDIDATE and e.term == 1
    assert PersistTerm("job", 1, "a") in out
    for voter in ("b", "c"):
        out += e.handle(VoteReplied(voter, "job", 1, True, False), now)
    return out


def test_majority_of_votes_makes_leader_and_not_before() -> None:
    e = make("a")
    now = CFG.election_timeout
    e.handle(ElectionTick(), now)
    e.handle(VoteReplied("b", "job", 0, True, True), now)
    e.handle(VoteReplied("c", "job", 0, True, True), now)
    e.handle(VoteReplied("b", "job", 1, True, False), now)
    assert e.state is ElectionState.CANDIDATE  # 2 of 5 is not a majority
    out = e.handle(VoteReplied("c", "job", 1, True, False), now)
    assert state_of(e) is ElectionState.LEADER and BecameLeader("job", 1) in out


def test_votes_once_per_term_and_persists_before_replying() -> None:
    e = make("c")
    e.handle(ViewChanged(frozenset({"b", "c", "d", "e"})), 0.0)  # 'a' is dead in this view; 'b' is candidate
    out = e.handle(VoteRequested("b", "job", 4, False), 0.0)
    assert out.index(PersistTerm("job", 4, "b")) < next(i for i, x in enumerate(out) if isinstance(x, SendVoteReply))
    assert SendVoteReply("b", "job", 4, True, False, "") in out
    # another candidate in the same term gets nothing, even if our view now ranks it first
    e.handle(ViewChanged(frozenset({"a", "b", "c", "d"})), 0.0)
    out = e.handle(VoteRequested("a", "job", 4, False), 0.0)
    assert SendVoteReply("a", "job", 4, False, False, "") in out
    assert e.voted_for == "b"
    # a restarted peer with the persisted vote behaves the same
    again = make("c", term=4, voted="b")
    out = again.handle(VoteRequested("a", "job", 4, False), 0.0)
    assert SendVoteReply("a", "job", 4, False, False, "") in out


def test_older_term_is_rejected_with_our_term() -> None:
    e = make("c", term=7)
    out = e.handle(VoteRequested("a", "job", 6, False), 0.0)
    assert out[-1] == SendVoteReply("a", "job", 7, False, False, "")
    assert e.term == 7


def test_check_command_rejects_older_terms_other_jobs_and_impostors() -> None:
    e = make("c", term=3)
    ok = e.check_command("job", 3, "a", 0.0)
    assert ok.accepted and e.leader == "a"
    assert not e.check_command("job", 2, "a", 0.0).accepted
    assert not e.check_command("other", 3, "a", 0.0).accepted
    assert not e.check_command("job", 3, "b", 0.0).accepted
    newer = e.check_command("job", 4, "b", 0.0)
    assert newer.accepted and newer.actions[0] == PersistTerm("job", 4, None) and e.term == 4
    assert not e.check_command("job", 3, "a", 0.0).accepted


def test_minority_view_pauses_and_a_leader_steps_down() -> None:
    e = make("a")
    _win(e, CFG.election_timeout)
    assert e.state is ElectionState.LEADER
    e.handle(ViewChanged(frozenset({"a", "b"})), 1.0)
    assert state_of(e) is ElectionState.PAUSED and e.leader is None
    out = e.handle(ElectionTick(), 5.0)
    assert not [x for x in out if isinstance(x, SendVoteRequest)]  # a minority never campaigns


def test_voters_stick_to_a_live_leader() -> None:
    e = make("c")
    e.handle(LeaderAnnounced("b", "job", 2), 0.1)
    out = e.handle(VoteRequested("a", "job", 3, False), 0.15)
    assert SendVoteReply("a", "job", 2, False, False, "b") in out and e.term == 2


def test_higher_term_announce_deposes_a_leader() -> None:
    e = make("a")
    _win(e, CFG.election_timeout)
    out = e.handle(LeaderAnnounced("b", "job", 2), 1.0)
    assert e.state is ElectionState.FOLLOWER and e.leader == "b" and PersistTerm("job", 2, None) in out


def test_stale_leader_is_told_the_newer_term_and_steps_down() -> None:
    follower = make("c", term=5)
    out = follower.handle(LeaderAnnounced("a", "job", 1), 0.1)
    notice = next(x for x in out if isinstance(x, SendVoteReply))
    assert (notice.to, notice.term, notice.granted) == ("a", 5, False)
    leader = make("a")
    _win(leader, CFG.election_timeout)
    leader.handle(VoteReplied("c", "job", notice.term, notice.granted, notice.pre_vote, notice.leader), 1.0)
    assert leader.state is not ElectionState.LEADER and leader.term == 5


def ranked(me: str, ranking: tuple[str, ...], live: frozenset[str] = frozenset({"a", "b", "c"})) -> Election:
    e = Election("job", me, ("a", "b", "c"), CFG, random.Random(2), now=0.0, ranking=ranking)
    e.handle(ViewChanged(live), 0.0)
    return e


def test_ranking_puts_the_leader_first_and_the_standby_second_whatever_the_ids() -> None:
    # 'c' leads, 'b' stands by: 'a' (the lowest id) is outside the ranking and never campaigns
    assert ranked("a", ("c", "b")).candidate() == "c"
    assert ranked("a", ("c", "b"), frozenset({"a", "b"})).candidate() == "b"
    assert ranked("a", ("c", "b"), frozenset({"a"})).candidate() is None
    outsider = ranked("a", ("c", "b"), frozenset({"a", "b"}))
    assert not [x for x in outsider.handle(ElectionTick(), 10.0) if isinstance(x, SendVoteRequest)]


def test_the_standby_campaigns_only_once_the_leader_is_gone_from_the_view() -> None:
    standby = ranked("b", ("c", "b"))
    assert not [x for x in standby.handle(ElectionTick(), 10.0) if isinstance(x, SendVoteRequest)]
    out = standby.handle(ViewChanged(frozenset({"a", "b"})), 10.0)  # membership declared 'c' dead
    asked = [x for x in out if isinstance(x, SendVoteRequest)]
    assert {r.to for r in asked} == {"a", "c"} and all(r.pre_vote for r in asked)
    # the voter grants only when 'c' is gone from ITS view too
    voter = ranked("a", ("c", "b"))
    replies = [x for x in voter.handle(VoteRequested("b", "job", 1, True), 10.0) if isinstance(x, SendVoteReply)]
    assert replies and not replies[0].granted
    voter.handle(ViewChanged(frozenset({"a", "b"})), 10.0)
    replies = [x for x in voter.handle(VoteRequested("b", "job", 1, True), 10.0) if isinstance(x, SendVoteReply)]
    assert replies and replies[0].granted
    standby.handle(VoteReplied("a", "job", 0, True, True), 10.01)
    out = standby.handle(VoteReplied("a", "job", 1, True, False), 10.01)
    assert standby.state is ElectionState.LEADER and BecameLeader("job", 1) in out  # 2 of 3


def test_a_ranking_must_name_members_only() -> None:
    with pytest.raises(ElectionError, match="ranking"):
        Election("job", "a", ("a", "b"), CFG, random.Random(0), now=0.0, ranking=("a", "z"))
    with pytest.raises(ElectionError, match="ranking"):
        Election("job", "a", ("a", "b"), CFG, random.Random(0), now=0.0, ranking=())


def test_a_new_plans_members_keep_the_leader_and_its_term() -> None:
    """Re-tracking a job on a new plan's members (one gone, one new) carries the term's leader over: the leader
    stays leader and announces to the new member at once, a follower keeps following, nobody campaigns, the term
    stays. A leader no longer among the members, or no longer ranked, is not carried over."""
    leader = make("a")
    _win(leader, CFG.election_timeout)
    follower = make("c")
    follower.handle(LeaderAnnounced("a", "job", 1), CFG.election_timeout)
    assert follower.leader == "a" and follower.term == 1
    now = CFG.election_timeout + 0.1
    members = ("a", "b", "c", "f")
    new_leader = Election(
        "job", "a", members, CFG, random.Random(1), now, leader.term, leader.voted_for, ranking=("a", "b")
    )
    new_leader.carry_over(leader, now)
    out = new_leader.handle(ViewChanged(frozenset(members)), now)
    assert state_of(new_leader) is ElectionState.LEADER and new_leader.term == 1
    assert {x.to for x in out if isinstance(x, SendLeaderAnnounce)} == {"b", "c", "f"}
    assert not [x for x in out if isinstance(x, SendVoteRequest | PersistTerm)]
    new_follower = Election(
        "job", "c", members, CFG, random.Random(1), now, follower.term, follower.voted_for, ranking=("a", "b")
    )
    new_follower.carry_over(follower, now)
    new_follower.handle(ViewChanged(frozenset(members)), now)
    assert new_follower.state is ElectionState.FOLLOWER and new_follower.leader == "a"
    assert not [
        x for x in new_follower.handle(ElectionTick(), now + CFG.election_timeout / 2) if isinstance(x, SendVoteRequest)
    ]
    for kept, ranking in ((("b", "c", "f"), None), (members, ("b",))):
        fresh = Election("job", "c", kept, CFG, random.Random(1), now, 1, None, ranking=ranking)
        fresh.carry_over(follower, now)
        assert fresh.leader is None and fresh.state is ElectionState.PAUSED


def test_a_standby_without_its_copies_never_stands_and_the_leader_seen_again_leads_on() -> None:
    """A standby that holds no checked copy of the data yet tracks the job without itself in its ranking
    (``leadership.own_ranking``): with its leader declared dead by a loaded machine's membership it does not
    campaign (elected, it could not lead, and the leader that stepped down for it never stood again: the job
    stalled), and the leader, seen again, is the candidate of every view."""
    from arceusd.jobs.core.leadership import own_ranking

    assert own_ranking("b", ["c", "b"], ready_to_lead=False) == ["c"]
    assert own_ranking("b", ["c", "b"], ready_to_lead=True) == ["c", "b"]
    assert own_ranking("c", ["c", "b"], ready_to_lead=False) == ["c", "b"], "the leader always stands"
    assert own_ranking("a", ["c", "b", ""], ready_to_lead=False) == ["c", "b"], "a voter keeps the job's ranking"
    standby = ranked("b", tuple(own_ranking("b", ["c", "b"], ready_to_lead=False)))
    out = standby.handle(ViewChanged(frozenset({"a", "b"})), 10.0)  # membership declared 'c' dead
    out += standby.handle(ElectionTick(), 20.0)
    assert not [x for x in out if isinstance(x, SendVoteRequest)] and standby.state is not ElectionState.LEADER
    # 'c' is seen again: it is the candidate of the standby's view and of the voter's, and wins their votes
    standby.handle(ViewChanged(frozenset({"a", "b", "c"})), 21.0)
    voter = ranked("a", ("c", "b"))
    for peer in (standby, voter):
        assert peer.candidate() == "c"
        replies = [x for x in peer.handle(VoteRequested("c", "job", 1, True), 21.0) if isinstance(x, SendVoteReply)]
        assert replies and replies[0].granted
    # with its copies checked it stands second again, as before
    ready = ranked("b", tuple(own_ranking("b", ["c", "b"], ready_to_lead=True)))
    asked = [x for x in ready.handle(ViewChanged(frozenset({"a", "b"})), 10.0) if isinstance(x, SendVoteRequest)]
    assert {r.to for r in asked} == {"a", "c"}
