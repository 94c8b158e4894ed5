"""The job core (arceusd.jobs.core): every lifecycle path on the pure state machine, no I/O, no trio.

Each test writes a job's life as events and checks the state and the actions the driver would carry out.
"""

from __future__ import annotations

import json
from typing import TypeVar, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.jobs.core import MAX_RESTARTS_PER_CHECKPOINT, TERMINAL, JobCore, JobState, Role, Stamp, lifecycle
from arceusd.jobs.core import actions as a
from arceusd.jobs.core import events as e
from arceusd.jobs.core.leadership import Accept, AskElection, Refuse, refusal

ME, B, C = "a" * 32, "b" * 32, "c" * 32


T = TypeVar("T")


def state(core: JobCore) -> JobState:
    """The core's state, read through a call (so the type checker does not narrow it between events)."""
    return core.state


def role(core: JobCore) -> Role:
    return core.role


def kinds(actions: list[a.Action]) -> list[type]:
    return [type(x) for x in actions]


def find(actions: list[a.Action], kind: type[T]) -> list[T]:
    return [x for x in actions if isinstance(x, kind)]


def running(
    total: int = 100,
    members: tuple[str, ...] = (ME, B),
    min_members: int = 2,
    replicas: tuple[tuple[str, ...], ...] = (),
) -> JobCore:
    """An owner whose plan over ``members`` runs (one shard per member; ``replicas``: how they are grouped)."""
    core = JobCore.owned(ME, total, min_members=min_members)
    for peer in members[1:]:
        out = core.handle(e.MemberJoined(peer), 0.0)
    assert state(core) == JobState.PLANNING and find(out, a.Plan) == [a.Plan(frozenset(members), False)]
    out = core.handle(e.PlanFound(members, members[1] if len(members) > 1 else "", replicas), 0.0)
    assert state(core) == JobState.STARTING and core.stamp == Stamp(1, 1)
    assert find(out, a.SendStart) == [a.SendStart(Stamp(1, 1), members, False)]
    out = core.handle(e.StartAnswered(core.stamp), 0.0)
    assert out == [a.SendGo(Stamp(1, 1), members)]
    out = core.handle(e.GoAnswered(core.stamp), 0.0)
    assert state(core) == JobState.RUNNING and core.error == ""
    return core


def checkpoint(core: JobCore, step: int) -> list[a.Action]:
    """Every device reported ``step`` (the driver judged the reports): the core commits it, once."""
    out = core.handle(e.CheckpointComplete(core.stamp, step), 0.0)
    assert core.handle(e.CheckpointComplete(core.stamp, step), 0.0) == [], "a step is committed once"
    return out


# ------------------------------------------------------------------------------------------------ values
def test_states_keep_the_strings_users_see() -> None:
    assert json.dumps({"state": JobState.RUNNING, "role": Role.OWNER}) == '{"state": "running", "role": "owner"}'
    assert f"{JobState.PAUSED}" == "paused" and JobState("paused") is JobState.PAUSED
    assert {s.value for s in TERMINAL} == {"done", "failed", "cancelled"}


def test_stamps_order_by_term_then_epoch() -> None:
    assert Stamp(1, 5) < Stamp(2, 0) and Stamp(2, 1).older_than(Stamp(2, 2))
    assert not Stamp(2, 1).older_than(Stamp(2, 2), epochs=False) and Stamp(1, 9).older_than(Stamp(2, 0))
    assert Stamp(1, 1).next_term() == Stamp(2, 1) and Stamp(2, 1).next_epoch() == Stamp(2, 2)


# ------------------------------------------------------------------------------------------------ the happy path
def test_a_job_runs_commits_exports_and_ends_leaving_its_election() -> None:
    core = running(total=20)
    out = checkpoint(core, 10)
    assert find(out, a.Commit) == [a.Commit(Stamp(1, 1), 10)]
    out = core.handle(e.CommitDone(core.stamp, 10), 0.0)
    assert core.committed_step == 10 and out == [a.SyncStandby(10)]
    checkpoint(core, 20)
    assert core.handle(e.CommitDone(core.stamp, 20), 0.0) == [a.Export(20)]
    out = core.handle(e.ExportDone("/m.safetensors"), 0.0)
    assert state(core) == JobState.DONE
    assert kinds(out) == [a.StopWorkers, a.Finish, a.UntrackElection, a.Persist]
    assert find(out, a.StopWorkers) == [a.StopWorkers(Stamp(1, 1), (B,), "done")]


def test_cancel_stops_the_members_and_leaves_the_election() -> None:
    core = running()
    out = core.handle(e.Cancel(), 0.0)
    assert state(core) == JobState.CANCELLED and core.error == "cancelled by the owner"
    assert a.UntrackElection() in out and find(out, a.StopWorkers)[0].peers == (B,)


# ------------------------------------------------------------------------------------------------ failures
def test_a_lost_worker_repartitions_then_the_job_gives_up_after_the_restart_limit() -> None:
    core = running()  # this device's own worker is lost each time: nobody to blame (issue #29 item 6)
    for attempt in range(1, MAX_RESTARTS_PER_CHECKPOINT + 1):
        before = core.stamp
        out = core.handle(e.WorkerFailed(core.stamp, ME, "broken pipe", lost=True), 0.0)
        assert state(core) == JobState.RECOVERING and core.stamp == before.next_term(), attempt
        assert find(out, a.StopWorkers) == [a.StopWorkers(core.stamp, (B,), "replanning")]
        out = core.handle(e.MembersReachable(core.stamp, frozenset({ME, B})), 0.0)
        assert find(out, a.Plan) == [a.Plan(frozenset({ME, B}), True)]
        core.handle(e.PlanFound((ME, B), B), 0.0)
        assert find(core.handle(e.StartAnswered(core.stamp), 0.0), a.SendGo)
        core.handle(e.GoAnswered(core.stamp), 0.0)
        assert state(core) == JobState.RUNNING
    out = core.handle(e.WorkerFailed(core.stamp, ME, "broken pipe"), 0.0)
    assert state(core) == JobState.FAILED and "gave up after 4 repartitions" in core.error
    assert a.UntrackElection() in out


def test_a_lost_device_drops_its_replica_and_the_others_go_on() -> None:
    core = running(members=(ME, B, C), min_members=3, replicas=((ME,), (B,), (C,)))
    stamp = core.stamp
    out = core.handle(e.WorkerFailed(core.stamp, C, "broken pipe"), 0.0)
    assert out == [
        a.DropReplica(stamp, 2, 3, C, f"worker on {C[:12]} failed: broken pipe"),
        a.StopWorkers(stamp, (C,), "replanning", local=False),  # this device's worker goes on
        a.TrackElection((ME, B), (ME, B)),
        a.Persist(),
    ]
    assert state(core) == JobState.RUNNING and core.stamp == stamp  # no repartition, no new epoch
    assert core.handle(e.MemberDead(C), 0.0) == []  # no longer in the plan
    # a second loss before the next commit: the job replans from that commit
    core.handle(e.WorkerFailed(core.stamp, B, "broken pipe"), 0.0)
    assert state(core) == JobState.RECOVERING


def test_after_a_commit_another_replica_may_be_dropped_and_the_standby_follows() -> None:
    core = running(members=(ME, B, C), min_members=3, replicas=((ME,), (B,), (C,)))
    core.handle(e.MemberDead(C), 0.0)
    checkpoint(core, 10)
    core.handle(e.CommitDone(core.stamp, 10), 0.0)
    out = core.handle(e.MemberDead(B), 0.0)  # the standby's replica
    assert find(out, a.DropReplica) == [a.DropReplica(core.stamp, 1, 2, B, f"member {B[:12]} is dead")]
    assert find(out, a.TrackElection) == [a.TrackElection((ME,), (ME,))]
    assert state(core) == JobState.RUNNING
    assert core.lead is not None and core.standby == "" and core.lead.replicas == ((ME,),)
    core.handle(e.WorkerFailed(core.stamp, ME, "oom"), 0.0)  # one pipeline left: a loss replans
    assert state(core) == JobState.RECOVERING


def test_a_loss_in_the_leaders_replica_replans_and_idle_devices_rebuild_a_dropped_replica_at_its_hold_step() -> None:
    d = "d" * 32
    core = running(members=(ME, B, C, d), min_members=4, replicas=((ME, B), (C, d)))
    out = core.handle(e.MemberDead(B), 0.0)  # the leader's own replica: its worker retires, serving the data
    assert find(out, a.DropReplica) == [a.DropReplica(core.stamp, 0, 2, B, f"member {B[:12]} is dead", retire=True)]
    assert find(out, a.StopWorkers) == [a.StopWorkers(core.stamp, (B,), "replanning", local=False)]
    assert find(out, a.TrackElection) == [a.TrackElection((C, d, ME), (ME,))]  # it still leads (B stood by)
    assert state(core) == JobState.RUNNING and core.lead is not None and core.lead.plan == (C, d)
    core.handle(e.WorkerFailed(core.stamp, ME, "x"), 0.0)  # a second loss before the next commit: replan
    assert state(core) == JobState.RECOVERING
    core = running(members=(ME, B, C, d), min_members=4, replicas=((ME, B), (C, d)))
    out = core.handle(e.MemberDead(C), 0.0)
    assert find(out, a.StopWorkers) == [a.StopWorkers(core.stamp, (C, d), "replanning", local=False)]
    assert find(out, a.DropReplica)[0].hold  # d is idle: the replica left holds for a rebuild
    core.handle(e.HoldAt(core.stamp, 20), 0.0)  # ... after checkpoint 20, the driver says
    checkpoint(core, 10)
    assert not find(core.handle(e.CommitDone(core.stamp, 10), 0.0), a.Regrow)  # an earlier commit: not yet
    checkpoint(core, 20)
    out = core.handle(e.CommitDone(core.stamp, 20), 0.0)
    assert find(out, a.Regrow) == [a.Regrow(core.stamp, 20)] and state(core) == JobState.RUNNING
    out = core.handle(e.Regrown(core.stamp, 0, (d, C)), 0.0)  # rebuilt on spares, first in slot order
    assert core.lead is not None and core.lead.replicas == ((d, C), (ME, B))
    assert find(out, a.TrackElection) == [a.TrackElection((d, C, ME, B), (ME, B))]
    # a failed commit of the hold step releases the hold instead
    core = running(members=(ME, B, C, d), min_members=4, replicas=((ME, B), (C, d)))
    core.handle(e.MemberDead(C), 0.0)
    core.handle(e.HoldAt(core.stamp, 20), 0.0)
    checkpoint(core, 20)
    out = core.handle(e.CommitFailed(core.stamp, 20, "disk full"), 0.0)
    assert find(out, a.ReleaseHold) == [a.ReleaseHold(core.stamp)]
    assert not find(core.handle(e.CommitDone(core.stamp, 20), 0.0), a.Regrow)


def test_which_replica_a_lost_device_takes_down() -> None:
    assert lifecycle.replica_to_drop(((ME,), (B,)), B, ME) == 1
    assert lifecycle.replica_to_drop(((ME, B), (C,)), B, ME) == 0  # the leader's replica: its worker retires
    assert lifecycle.replica_to_drop(((ME, B), (C,)), ME, ME) is None  # the leader's worker itself
    assert lifecycle.replica_to_drop(((ME,),), ME, ME) is None  # one pipeline
    assert lifecycle.replica_to_drop(((ME,), (B,)), C, ME) is None  # in no replica
    assert lifecycle.replica_to_drop(((ME,), (B,), (B, C)), B, ME) is None  # in several: not a plan we made


def test_progress_resets_the_restart_limit() -> None:
    core = running()
    for _ in range(MAX_RESTARTS_PER_CHECKPOINT):
        core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
        core.handle(e.MembersReachable(core.stamp, frozenset({ME, B})), 0.0)
        core.handle(e.PlanFound((ME, B), B), 0.0)
        core.handle(e.StartAnswered(core.stamp), 0.0)
        core.handle(e.GoAnswered(core.stamp), 0.0)
    checkpoint(core, 10)
    core.handle(e.CommitDone(core.stamp, 10), 0.0)
    core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
    assert state(core) == JobState.RECOVERING


def test_pause_when_no_plan_fits_and_resume_when_capacity_returns() -> None:
    core = running()
    core.handle(e.MemberDead(B), 0.0)
    out = core.handle(e.MembersReachable(core.stamp, frozenset({ME})), 0.0)
    assert find(out, a.Plan) == [a.Plan(frozenset({ME}), True)]
    out = core.handle(e.NoPlanFits("the model needs 2 GiB"), 0.0)
    assert state(core) == JobState.PAUSED and "paused until more capacity joins" in core.error
    assert find(out, a.Pause)
    assert not find(core.handle(e.Tick(), 5.0), a.Plan)  # still one member: stays paused
    out = core.handle(e.MemberJoined(C), 6.0)
    assert kinds(out) == [a.Announce, a.Resume, a.Plan] and state(core) == JobState.PLANNING
    core.handle(e.PlanFound((ME, C), C), 6.0)
    core.handle(e.StartAnswered(core.stamp), 6.0)
    core.handle(e.GoAnswered(core.stamp), 6.0)
    assert state(core) == JobState.RUNNING


def test_a_failed_final_commit_is_retried_then_fails_with_a_clear_error() -> None:
    core = running(total=10)
    checkpoint(core, 10)
    for attempt in range(1, lifecycle.FINAL_COMMIT_ATTEMPTS):
        out = core.handle(e.CommitFailed(core.stamp, 10, "no shard from b"), 0.0)
        assert out == [a.Commit(core.stamp, 10, lifecycle.COMMIT_RETRY_S[attempt - 1])]
        assert state(core) == JobState.RUNNING
    out = core.handle(e.CommitFailed(core.stamp, 10, "no shard from b"), 0.0)
    assert state(core) == JobState.FAILED
    assert "final checkpoint (step 10)" in core.error and "no shard from b" in core.error
    assert a.UntrackElection() in out


def test_a_failed_intermediate_commit_keeps_running_and_the_next_one_counts() -> None:
    core = running(total=20)
    checkpoint(core, 10)
    assert core.handle(e.CommitFailed(core.stamp, 10, "slow"), 0.0) == []
    assert state(core) == JobState.RUNNING and core.error == "slow"
    checkpoint(core, 20)
    assert core.handle(e.CommitDone(core.stamp, 20), 0.0) == [a.Export(20)]


def test_a_lost_go_is_resent_then_the_plan_restarts() -> None:
    core = JobCore.owned(ME, 100, min_members=2)
    core.handle(e.MemberJoined(B), 0.0)
    core.handle(e.PlanFound((ME, B), B), 0.0)
    core.handle(e.StartAnswered(core.stamp), 0.0)
    out = core.handle(e.GoAnswered(core.stamp, {B: "no answer"}), 0.0)
    assert out == [a.SendGo(core.stamp, (B,))] and state(core) == JobState.STARTING
    out = core.handle(e.GoAnswered(core.stamp, {B: "no answer"}), 0.0)
    assert state(core) == JobState.RECOVERING and "go not acknowledged" in core.error
    assert find(out, a.CheckReachable)


def test_a_member_takes_go_once_per_epoch_and_refuses_another_epoch() -> None:
    member = JobCore(B, ME, 100, Role.MEMBER, JobState.JOINED, Stamp(1, 1))
    member.handle(e.StartReceived(Stamp(1, 1)), 0.0)
    assert member.handle(e.WorkerStarted(Stamp(1, 1)), 0.0) == []
    assert state(member) == JobState.STARTING
    assert member.handle(e.GoReceived(Stamp(1, 1)), 0.0) == [a.LetWorkerGo(Stamp(1, 1))]
    assert member.handle(e.GoReceived(Stamp(1, 1)), 0.0) == []  # resent after a lost answer: a no-op
    assert isinstance(member.handle(e.GoReceived(Stamp(1, 0)), 0.0)[0], a.Refuse)


def test_a_first_start_this_device_cannot_make_fails_the_job() -> None:
    core = JobCore.owned(ME, 100, min_members=2)
    core.handle(e.MemberJoined(B), 0.0)
    core.handle(e.PlanFound((ME, B), B), 0.0)
    core.handle(e.StartAnswered(core.stamp, ((ME, "out of memory", ""), (B, "out of memory", ""))), 0.0)
    assert state(core) == JobState.FAILED and "out of memory" in core.error


def test_a_member_that_keeps_refusing_starts_is_excluded_and_the_job_goes_on_without_it() -> None:
    """Issue #19: one member refusing every start used to spend the job's restarts and fail it."""
    core = JobCore.owned(ME, 100, min_members=3)
    core.handle(e.MemberJoined(B), 0.0)
    core.handle(e.MemberJoined(C), 0.0)
    core.handle(e.PlanFound((ME, B, C), B), 0.0)
    out = core.handle(e.StartAnswered(core.stamp, ((C, "no", ""),)), 0.0)  # once: maybe a hiccup
    assert state(core) == JobState.RECOVERING and not find(out, a.Exclude)
    core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
    core.handle(e.PlanFound((ME, B, C), B), 0.0)
    out = core.handle(e.StartAnswered(core.stamp, ((C, "no", ""),)), 0.0)  # twice in a row: out
    assert find(out, a.Exclude) == [a.Exclude(C, "it refused or failed 2 starts in a row")]
    assert find(out, a.CheckReachable) == [a.CheckReachable(core.stamp, (B,))]
    out = core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
    assert find(out, a.Plan) == [a.Plan(frozenset({ME, B}), True)]  # even though it still answers
    core.handle(e.PlanFound((ME, B), B), 0.0)
    assert find(core.handle(e.StartAnswered(core.stamp), 0.0), a.SendGo)
    core.handle(e.GoAnswered(core.stamp), 0.0)
    assert state(core) == JobState.RUNNING


def test_a_refusal_then_a_start_resets_the_count_and_a_failed_own_start_blames_nobody() -> None:
    core = JobCore.owned(ME, 100, min_members=3)
    core.handle(e.MemberJoined(B), 0.0)
    core.handle(e.MemberJoined(C), 0.0)

    def start(refusals: tuple[tuple[str, str, str], ...]) -> list[a.Action]:
        core.handle(e.PlanFound((ME, B, C), B), 0.0)
        out = core.handle(e.StartAnswered(core.stamp, refusals), 0.0)
        if refusals:
            core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
        return out

    assert not find(start(((C, "no", ""),)), a.Exclude)  # 1
    start(())  # it started: the count starts again
    core.handle(e.GoAnswered(core.stamp), 0.0)
    checkpoint(core, 10)
    core.handle(e.CommitDone(core.stamp, 10), 0.0)
    core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
    core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
    assert not find(start(((C, "no", ""),)), a.Exclude)  # 1 again
    assert not find(start(((ME, "x", ""), (C, "no", ""))), a.Exclude)  # our own start failed too: not counted
    assert find(start(((C, "no", ""),)), a.Exclude) == [a.Exclude(C, "it refused or failed 2 starts in a row")]


def test_a_restart_asked_for_repartitions_once_and_a_stale_commit_is_dropped() -> None:
    core = running()
    old = core.stamp
    checkpoint(core, 10)
    out = core.handle(e.RestartAsked("member b excluded: shard size -1"), 0.0)
    assert state(core) == JobState.RECOVERING and core.stamp == old.next_term() and "excluded" in core.error
    assert kinds(out) == [a.CancelStart, a.StartRecovery, a.StopWorkers, a.CheckReachable]
    assert core.handle(e.RestartAsked("another reason"), 0.0) == [] and "excluded" in core.error  # first wins
    assert core.handle(e.CommitDone(old, 10), 0.0) == [] and core.committed_step == 0


def test_a_dead_member_is_named_as_the_cause_of_the_recovery_its_neighbours_broken_link_began() -> None:
    """Issue 31: a SIGKILLed member's neighbour reports a broken link first; the recovery said only that, naming
    the neighbour's worker. Once membership declares the member dead, the record names it (and keeps the first
    sign); a death outside the old plan, or one already named, changes nothing."""
    core = running(members=(ME, B, C), min_members=3)
    out = core.handle(e.WorkerFailed(core.stamp, B, f"LinkError: peer {C[:12]} closed the stream"), 0.0)
    assert state(core) == JobState.RECOVERING and find(out, a.StartRecovery)
    first = core.error
    assert C[:12] in first and "dead" not in first
    out = core.handle(e.MemberDead(C), 0.0)
    assert out == [a.RecoveryCause(f"member {C[:12]} is dead (first seen as: {first})")]
    assert core.error.startswith(f"member {C[:12]} is dead")
    assert core.handle(e.MemberDead(C), 0.0) == [], "named once"
    assert core.handle(e.MemberDead("d" * 32), 0.0) == [], "not in the plan the recovery began from"


def test_a_spent_budget_fails_the_job_and_a_waiting_job_plans_only_with_the_memory_it_needs() -> None:
    core = running()
    out = core.handle(e.Fail("the job's budget is spent"), 0.0)
    assert state(core) == JobState.FAILED and core.error == "the job's budget is spent" and find(out, a.Finish)
    waiting = JobCore.owned(ME, 100, min_members=2)
    assert not find(waiting.handle(e.MemberJoined(B, memory_ok=False), 0.0), a.Plan)
    assert not find(waiting.handle(e.Tick(memory_ok=False), 1.0), a.Plan) and state(waiting) == JobState.WAITING
    assert find(waiting.handle(e.Tick(memory_ok=True), 2.0), a.Plan)


def test_a_member_joins_starts_mirrors_the_leader_holds_checkpoints_and_leaves() -> None:
    member = JobCore(B, ME, 100)
    assert member.role == Role.SEEN and state(member) == JobState.ANNOUNCED
    member.handle(e.Joined(), 0.0)
    assert role(member) == Role.MEMBER and state(member) == JobState.JOINED
    member.handle(e.StartReceived(Stamp(2, 5)), 0.0)
    assert member.stamp == Stamp(2, 5)
    member.handle(e.WorkerStarted(Stamp(2, 5)), 0.0)
    assert state(member) == JobState.STARTING
    member.handle(e.StandbyCommitted(40), 0.0)
    member.handle(e.StandbyCommitted(20), 0.0)
    member.handle(e.StandbyCommitted(10**9), 0.0)  # never past the job's end, whatever a leader claims
    assert member.committed_step == 100
    assert member.handle(e.StopReceived("\x1b[2Jpwned"), 0.0)[0] == a.StopWorkers(Stamp(2, 5), (), "stopped")
    out = member.handle(e.LeaveJob(), 0.0)
    assert role(member) == Role.SEEN and state(member) == JobState.LEFT and find(out, a.StopWorkers)


def test_the_owner_exports_the_final_checkpoint_its_leader_handed_it() -> None:
    owner = JobCore(ME, ME, 100, Role.OWNER, JobState.JOINED, Stamp(0, 0), leader=C)
    assert not owner.leads
    out = owner.handle(e.ExportDone("/m.safetensors"), 0.0)
    assert state(owner) == JobState.DONE and find(out, a.StopWorkers) == [a.StopWorkers(Stamp(0, 0), (), "done")]


# ------------------------------------------------------------------------------------------------ leadership
def test_the_owner_hands_over_when_its_members_follow_the_standby() -> None:
    core = running()
    core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
    core.handle(e.MembersReachable(core.stamp, frozenset({ME, B})), 0.0)
    core.handle(e.PlanFound((ME, B), B), 0.0)
    refused = refusal(C, 3)
    out = core.handle(e.StartAnswered(core.stamp, ((B, refused.reason, refused.follows),)), 0.0)
    assert out == [a.HandOver(C)]
    out = core.handle(e.HandOverAnswered(C, accepted=True), 0.0)
    assert core.leader == C and not core.leads and state(core) == JobState.JOINED and core.stamp == Stamp(0, 0)
    assert a.CancelStart() in out and a.Persist() in out
    assert isinstance(core.judge(C, Stamp(3, 1)), Accept)  # the new leader's commands are not stale to us


def test_one_peers_word_that_another_leads_changes_nothing_unless_that_leader_takes_us_in() -> None:
    """An announce's answer naming another leader makes the owner ask that peer to take it in; a refusal (or no
    answer) leaves the job as it was: a stranger's claim cannot make the owner restart its job until it fails.
    When the plan's members refused its start naming that leader, a refusal restarts the plan (it cannot start)."""
    core = running()
    before = core.stamp
    assert core.handle(e.FollowsOther(C, B), 0.0) == [a.HandOver(C)]  # B, the plan's only other device, says so
    assert core.handle(e.HandOverAnswered(C, accepted=False), 0.0) == []
    assert state(core) == JobState.RUNNING and core.stamp == before and core.leads
    core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
    core.handle(e.MembersReachable(core.stamp, frozenset({ME, B})), 0.0)
    core.handle(e.PlanFound((ME, B), B), 0.0)
    assert core.handle(e.StartAnswered(core.stamp, ((B, "follows c", C),)), 0.0) == [a.HandOver(C)]
    out = core.handle(e.HandOverAnswered(C, accepted=False), 0.0)
    assert state(core) == JobState.RECOVERING and "did not take us in" in core.error and find(out, a.CheckReachable)


def test_the_owner_hands_over_only_when_most_of_the_job_says_who_leads() -> None:
    """One member's word that another peer leads (a hostile member's, say) neither hands the job over nor
    restarts it; when most of the plan's other devices say so (they elected a standby while this owner was
    thought dead), the owner asks that leader to take it in. The same holds for refusals of a start."""
    d = "d" * 32
    core = running(members=(ME, B, C), min_members=3)
    assert core.handle(e.FollowsOther(d, B), 0.0) == [] and core.leads
    assert core.handle(e.FollowsOther(d, "e" * 32), 0.0) == [], "a peer outside the plan does not count"
    assert core.handle(e.FollowsOther(d, B), 0.0) == [], "nor does the same member twice"
    assert core.handle(e.FollowsOther(d, C), 0.0) == [a.HandOver(d)]
    liar = running(members=(ME, B, C), min_members=3)
    liar.handle(e.WorkerFailed(liar.stamp, B, "x"), 0.0)
    liar.handle(e.MembersReachable(liar.stamp, frozenset({ME, B, C})), 0.0)
    liar.handle(e.PlanFound((ME, B, C), B), 0.0)
    out = liar.handle(e.StartAnswered(liar.stamp, ((B, "follows d", d), (C, "out of memory", ""))), 0.0)
    assert not find(out, a.HandOver) and state(liar) == JobState.RECOVERING and "follow" in liar.error


def test_an_owner_back_after_the_end_records_the_job_done_and_leaves_the_election() -> None:
    core = running()
    core.handle(e.FollowsOther(C, B), 0.0)
    out = core.handle(e.HandOverAnswered(C, accepted=False, done=True), 0.0)
    assert state(core) == JobState.DONE and a.UntrackElection() in out


def test_the_standby_takes_over_when_elected_and_leads_from_its_checkpoint() -> None:
    standby = JobCore(B, ME, 100, Role.MEMBER, JobState.RUNNING, Stamp(2, 3))
    assert standby.handle(e.TakeoverElected(3, holds_data=False), 0.0) == []  # no data: cannot lead
    assert standby.handle(e.TakeoverElected(3, holds_data=True), 0.0) == [a.PrepareTakeover(ME)]
    out = standby.handle(e.TakeoverReady(frozenset({C}), committed_step=40), 0.0)
    assert standby.leads and standby.committed_step == 40 and state(standby) == JobState.RECOVERING
    assert standby.stamp == Stamp(3, 3) and "took over" in standby.error
    assert find(out, a.CheckReachable)
    out = standby.handle(e.MembersReachable(standby.stamp, frozenset({C})), 0.0)
    assert find(out, a.Plan) == [a.Plan(frozenset({B, C}), True)]


def test_a_leader_steps_down_when_another_is_elected() -> None:
    core = running()
    out = core.handle(e.OtherElected(B, 5), 0.0)
    assert state(core) == JobState.PAUSED and core.leader == B and not core.leads and find(out, a.Pause)


def test_a_member_pauses_when_its_leader_dies_and_ends_on_stop() -> None:
    member = JobCore(B, ME, 100, Role.MEMBER, JobState.RUNNING, Stamp(1, 1))
    out = member.handle(e.LeaderGone("dead"), 0.0)
    assert state(member) == JobState.PAUSED and find(out, a.Pause)
    out = member.handle(e.StopReceived("done"), 0.0)
    assert state(member) == JobState.DONE and a.UntrackElection() in out


def test_stale_stamps_are_refused() -> None:
    core = running()
    old = core.stamp
    core.handle(e.WorkerFailed(core.stamp, B, "x"), 0.0)
    out = core.handle(e.CheckpointComplete(old, 10), 0.0)
    assert isinstance(out[0], a.Refuse) and "outside the current plan epoch" in out[0].reason
    assert core.handle(e.CommitDone(old, 10), 0.0) == [] and core.committed_step == 0
    member = JobCore(B, ME, 100, Role.MEMBER, JobState.RUNNING, Stamp(2, 4))
    assert isinstance(member.judge(ME, Stamp(2, 3)), Refuse)
    assert isinstance(member.judge(ME, Stamp(2, 3), epochs=False), Accept)
    assert isinstance(member.judge(C, Stamp(3, 0)), AskElection)
    assert isinstance(member.judge(C, Stamp(2, 9)), Refuse)


def test_the_owner_restored_after_its_restart_waits_for_its_members_not_for_long() -> None:
    core = JobCore.owned(ME, 100, stamp=Stamp(3, 2), committed_step=40, gather_until=15.0, expected=frozenset({B, C}))
    assert not find(core.handle(e.Tick(), 1.0), a.Plan)
    assert not find(core.handle(e.MemberJoined(B), 2.0), a.Plan)
    assert find(core.handle(e.Tick(), 15.0), a.Plan) == [a.Plan(frozenset({ME, B}), True)]


# ------------------------------------------------------------------------------------------------ properties
PEERS = (ME, B, C)
EVENTS = st.one_of(
    st.builds(e.MemberJoined, st.sampled_from(PEERS[1:]), st.booleans()),
    st.builds(e.RestartAsked, st.just("a member was excluded")),
    st.builds(e.Fail, st.just("budget spent")),
    st.builds(e.MemberDead, st.sampled_from(PEERS[1:])),
    st.builds(e.MemberLeft, st.sampled_from(PEERS[1:])),
    st.builds(e.PlanFound, st.sampled_from([(ME, B), (ME, C), (ME, B, C), (B,)]), st.sampled_from(["", B])),
    st.builds(e.NoPlanFits, st.just("too small")),
    st.just("start"),
    st.just("start-refused"),
    st.just("go"),
    st.just("go-lost"),
    st.just("checkpoint"),
    st.just("commit"),
    st.just("commit-failed"),
    st.just("worker-failed"),
    st.just("reachable"),
    st.builds(e.ExportDone, st.just("/m")),
    st.builds(e.ExportFailed, st.just("disk full")),
    st.builds(e.Tick, st.booleans()),
    st.just(e.Cancel()),
    st.builds(e.FollowsOther, st.just(C), st.sampled_from(PEERS)),
    st.builds(e.HandOverAnswered, st.just(C), st.booleans(), st.booleans()),
    st.builds(e.OtherElected, st.sampled_from(PEERS), st.integers(1, 9)),
)


def concrete(core: JobCore, raw: object, step: int) -> e.Event:
    """Events that carry the current stamp (the interesting ones; stale ones are tested above)."""
    if not isinstance(raw, str):
        return cast(e.Event, raw)
    s = core.stamp
    made: dict[str, e.Event] = {
        "start": e.StartAnswered(s),
        "start-refused": e.StartAnswered(s, ((B, "no", ""),)),
        "go": e.GoAnswered(s),
        "go-lost": e.GoAnswered(s, {B: "no answer"}),
        "checkpoint": e.CheckpointComplete(s, step),
        "commit": e.CommitDone(s, step),
        "commit-failed": e.CommitFailed(s, step, "x"),
        "worker-failed": e.WorkerFailed(s, B, "x"),
        "reachable": e.MembersReachable(s, frozenset(PEERS)),
    }
    return made[raw]


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=60), st.integers(1, 40))
def test_random_lives_never_leave_an_end_nor_go_back_in_stamp(raw: list[object], total: int) -> None:
    core = JobCore.owned(ME, total, min_members=2)
    ended: JobState | None = None
    step = 0
    for n, item in enumerate(raw):
        step = min(total, step + 5)
        before = core.stamp
        out = core.handle(concrete(core, item, step), float(n))
        if ended is not None:
            assert state(core) == ended and out in ([], [a.Refuse(f"the job is {ended.value}")])
        if core.state in TERMINAL:
            ended = ended or core.state
        finishes = find(out, a.Finish)
        assert len(finishes) <= 1 and (not finishes or core.state in TERMINAL)
        if core.leader != C:  # a hand-over resets the stamp to count the new leader's commands
            assert not core.stamp.older_than(before), (before, core.stamp)
        assert core.committed_step <= total
        if state(core) == JobState.RUNNING and core.leads:
            assert core.lead is not None and core.lead.plan, "a leader runs a plan"


def replan(core: JobCore, members: tuple[str, ...]) -> None:
    """After a restart: the members answer, the plan over ``members`` is found, started and let go."""
    core.handle(e.MembersReachable(core.stamp, frozenset(members)), 0.0)
    core.handle(e.PlanFound(members, members[1]), 0.0)
    assert find(core.handle(e.StartAnswered(core.stamp), 0.0), a.SendGo)
    core.handle(e.GoAnswered(core.stamp), 0.0)
    assert state(core) == JobState.RUNNING


def test_a_member_whose_worker_fails_first_in_two_plans_in_a_row_is_excluded() -> None:
    """Issue #29 item 6: a member answering every checkpoint with an error spent the job's restarts and failed
    it. The first failure of a plan is pinned on its reporter (a failure after it is usually a neighbour's broken
    link); twice in a row without a commit between, and the member is out. A commit clears the count."""
    core = running(members=(ME, B, C), min_members=3)
    out = core.handle(e.WorkerFailed(core.stamp, C, "checkpoint failed"), 0.0)
    assert state(core) == JobState.RECOVERING and not find(out, a.Exclude)
    replan(core, (ME, B, C))
    checkpoint(core, 20)
    core.handle(e.CommitDone(core.stamp, 20), 0.0)  # it ran to a commit: the count starts again
    out = core.handle(e.WorkerFailed(core.stamp, C, "checkpoint failed"), 0.0)
    assert not find(out, a.Exclude)
    replan(core, (ME, B, C))
    out = core.handle(e.WorkerFailed(core.stamp, C, "checkpoint failed"), 0.0)
    assert [x.peer for x in find(out, a.Exclude)] == [C] and "failed 2 plans in a row first" in core.error
    out = core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
    assert find(out, a.Plan) == [a.Plan(frozenset({ME, B}), True)]


def test_only_the_first_failure_of_a_plan_is_pinned_and_never_on_this_device() -> None:
    core = running(members=(ME, B, C), min_members=3, replicas=((ME,), (B,), (C,)))
    core.handle(e.WorkerFailed(core.stamp, ME, "out of memory"), 0.0)  # its own: nobody blamed
    replan(core, (ME, B, C))
    core.handle(e.WorkerFailed(core.stamp, B, "the link to c broke"), 0.0)  # pinned on b (once)
    out = core.handle(e.WorkerFailed(core.stamp, C, "lost"), 0.0)  # after it: not counted
    assert not find(out, a.Exclude)
    replan(core, (ME, B, C))
    out = core.handle(e.WorkerFailed(core.stamp, C, "lost"), 0.0)  # c's first pin: still in
    assert not find(out, a.Exclude)


def test_a_member_whose_shard_serving_fails_two_commits_in_a_row_is_excluded() -> None:
    """Issue #29 item 6: a member serving its shard too slowly or too big failed every commit, then the job."""
    core = running(total=100, members=(ME, B, C), min_members=3)
    checkpoint(core, 20)
    out = core.handle(e.CommitFailed(core.stamp, 20, "could not copy shard", C), 0.0)
    assert out == [] and state(core) == JobState.RUNNING
    checkpoint(core, 40)
    out = core.handle(e.CommitFailed(core.stamp, 40, "could not copy shard", C), 1.0)  # the same moment: once
    assert out == [] and state(core) == JobState.RUNNING
    checkpoint(core, 60)
    out = core.handle(e.CommitFailed(core.stamp, 60, "could not copy shard", C), 20.0)
    assert [x.peer for x in find(out, a.Exclude)] == [C] and state(core) == JobState.RECOVERING
    assert "serving failed 2 commits in a row" in core.error
    out = core.handle(e.MembersReachable(core.stamp, frozenset({ME, B, C})), 0.0)
    assert find(out, a.Plan) == [a.Plan(frozenset({ME, B}), True)]


def test_a_final_commit_a_member_does_not_serve_excludes_it_instead_of_failing_the_job() -> None:
    """Each retry of the final commit counts (the retry starts after the last attempt failed), however soon it
    comes: within the blame spacing the job used to fail after its attempts with the member never excluded."""
    core = running(total=20, members=(ME, B, C), min_members=3)
    checkpoint(core, 10)
    assert not core.handle(e.CommitFailed(core.stamp, 10, "not served", C), 0.0)  # counted once
    checkpoint(core, 20)
    assert find(core.handle(e.CommitFailed(core.stamp, 20, "not served", C), 0.5), a.Commit)  # in line: retried
    out = core.handle(e.CommitFailed(core.stamp, 20, "not served", C), 1.5)  # its first retry, 1 s later
    assert find(out, a.Exclude) and state(core) == JobState.RECOVERING
    core.handle(e.CommitFailed(core.stamp, 20, "not served", ME), 0.0)  # a stale or own failure: nothing
    assert state(core) == JobState.RECOVERING


def test_a_member_withholding_its_shard_at_two_witness_disputes_in_a_row_is_excluded() -> None:
    """Issue #29 item 6, DiLoCo: a first-replica member that lies about its witness and does not serve the shard
    that would settle it made every dispute word against word and spent the job's restarts. Each withheld shard
    counts as a failed serving (once per spacing); twice with no commit between exclude it; a commit clears it."""
    core = running(total=100, members=(ME, B, C), min_members=3)
    assert core.handle(e.ShardWithheld(core.stamp, C, "not served"), 0.0) == []
    assert core.handle(e.ShardWithheld(core.stamp, C, "not served"), 1.0) == []  # the same moment: once
    assert core.handle(e.ShardWithheld(core.stamp, ME, "not served"), 30.0) == []  # never itself
    assert core.handle(e.ShardWithheld(Stamp(0, 0), C, "not served"), 30.0) == []  # a stale plan's
    checkpoint(core, 20)
    core.handle(e.CommitDone(core.stamp, 20), 0.0)  # a commit between: counted afresh
    assert core.handle(e.ShardWithheld(core.stamp, C, "not served"), 40.0) == []
    out = core.handle(e.ShardWithheld(core.stamp, C, "shard x not served"), 60.0)
    assert [x.peer for x in find(out, a.Exclude)] == [C] and state(core) == JobState.RECOVERING
    assert "serving failed 2 times in a row (shard x not served)" in core.error


def test_a_shard_withheld_at_disputes_in_two_plans_counts_twice_however_soon() -> None:
    """Each witness dispute whose shard was withheld ends its plan: the next plan's is another incident, counted
    even within the blame spacing (disputes of a small DiLoCo job came 3.5 s apart: the spacing counted one in
    three and the job failed after its restarts, end to end in ``test_job_hostile.py``)."""
    core = running(total=100, members=(ME, B, C), min_members=3)
    assert core.handle(e.ShardWithheld(core.stamp, C, "not served"), 0.0) == []
    core.handle(e.RestartAsked("the replicas hold different states at step 20"), 0.0)  # word against word
    replan(core, (ME, B, C))
    out = core.handle(e.ShardWithheld(core.stamp, C, "not served again"), 3.5)
    assert [x.peer for x in find(out, a.Exclude)] == [C] and state(core) == JobState.RECOVERING
    assert "serving failed 2 times in a row (not served again)" in core.error


def test_the_core_owns_the_members_the_standby_and_the_go_guard() -> None:
    """Issue 32 item 2: one owner per fact. Membership, whom the owner announced to, the plan's standby and the
    "go only once" guard live in the core alone; the job's I/O reads them there."""
    core = running(members=(ME, B, C), min_members=3)
    assert core.members == frozenset({ME, B, C}) and core.standby == B
    assert core.to_announce([ME, B, C, "d" * 32]) == [B, C, "d" * 32] and core.to_announce([B, "d" * 32]) == []
    core.drop_member(C)  # it left (or its reports got it excluded): not invited straight back
    assert not core.is_member(C) and core.to_announce([C]) == []
    core.drop_member(ME)  # the leader stays
    assert core.is_member(ME)
    core.handle(e.MemberDead(B), 0.0)  # the core drops it: announced to again when it comes back
    assert state(core) == JobState.RECOVERING and core.to_announce([B]) == [B]
    assert core.let_go(7) and not core.let_go(7) and core.let_go(8)  # the leader's own go: once per epoch
    member = JobCore(B, ME, 100)
    member.handle(e.Joined(), 0.0)
    member.handle(e.StartReceived(Stamp(2, 5), C), 0.0)
    assert member.standby == C and member.members == frozenset()
    member.handle(e.WorkerStarted(Stamp(2, 5)), 0.0)
    assert find(member.handle(e.GoReceived(Stamp(2, 5)), 0.0), a.LetWorkerGo)
    assert member.handle(e.GoReceived(Stamp(2, 5)), 0.0) == [] and not member.let_go(5)  # the same guard
    member.handle(e.ReplicaDropped((B,)), 0.0)
    assert member.standby == C
    member.handle(e.ReplicaDropped((C, "d" * 32)), 0.0)  # the standby's replica: none until the next plan
    assert member.standby == ""
