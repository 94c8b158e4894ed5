"""Issue #19's job items against real daemons: three daemons train a small MLP; one of them is a hostile member
(tests/adversarial/hostile_job.py: a real daemon in its own process whose checkpoint reports and shard serving lie)
from its second checkpoint on. Each test asserts that no daemon exits, nothing is written outside the job's folder,
the owner's memory stays under its bound and its ``status`` answers within 1 s all along, the attacker is named
(``excluded``) and its report counted (``refused_reports``) in ``status``, and the job resumes from the last good
checkpoint over the two honest devices and ends ``done`` with exactly the failure-free run's model (1e-5)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from arceusd.cli.swarm import LocalSwarm
from tests.adversarial.hostile_job import ABUSES, HOSTILE, LEADER, HostileSwarm
from tests.adversarial.job_cases import (
    DILOCO_PLACES,
    WITNESS_PLACES,
    big_spec,
    place_of,
    placed,
    prepare,
    replica_of,
    replicas_spec,
)
from tests.adversarial.victim import Report, Watch, assert_healthy
from tests.harness import Daemon, wait_for
from tests.integration.test_recovery import assert_equals_failure_free, job_of, submit, wait_end, write_spec
from tests.procfs import name_of, processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ATTACK_FROM_STEP = 40
"""The first checkpoint step the hostile member lies about (step 20 commits honestly)."""
SLOW_MACHINE = "lan"
"""The membership timings of issue #29's job tests: memberlist's, so a member busy loading torch on a loaded
two-core machine is not declared dead again and again (each a restart of the job) while the attack plays out."""


@pytest.fixture
def swarm_of(tmp_path: Path) -> Iterator[Any]:
    made: list[LocalSwarm] = []

    def make(attack: str, arg: str = "", preset: str = "local") -> LocalSwarm:
        s = HostileSwarm(tmp_path / "swarm", attack, arg, after=ATTACK_FROM_STEP, preset=preset)
        made.append(s)
        s.start()
        s.wait_converged()
        return s

    yield make
    for s in made:
        s.close()


def as_daemon(s: LocalSwarm, i: int) -> Daemon:
    """What tests.adversarial.victim.Watch samples (pid, control socket, process) of swarm daemon ``i``."""
    return cast(Daemon, SimpleNamespace(pid=s.procs[i].pid, state_dir=s.state_dir(i), proc=s.procs[i]))


def baseline_of(s: LocalSwarm) -> Report:
    with Watch(as_daemon(s, 0)) as w:
        time.sleep(1.5)
    return w.report


def files_outside(tmp_path: Path, s: LocalSwarm) -> list[Path]:
    """Files under ``tmp_path`` outside the swarm's state folders, the spec and the logs (what an escape from a
    job's folder would leave)."""
    return [p for p in tmp_path.rglob("*") if p.is_file() and s.root not in p.parents and p.name != "job.toml"]


def run_attack(
    swarm_of: Any, tmp_path: Path, attack: str, problem: str, arg: str = ""
) -> tuple[dict[str, Any], LocalSwarm]:
    spec = write_spec(tmp_path, steps=100, interval=20)
    s = swarm_of(attack, arg)
    hostile_peer = s.call(HOSTILE, "status")["peer_id"]
    base = baseline_of(s)
    with Watch(as_daemon(s, 0)) as watch:
        job_id = submit(s, spec)
        end = wait_end(s, job_id, timeout=240)
    assert_healthy(watch.report, base, rss_extra_mib=300)
    assert all(p.poll() is None for p in s.procs), "a daemon exited (the hostile one included)"
    assert hostile_peer in end["excluded"], f"the attacker is not named in status: {end['excluded']}"
    assert end["refused_reports"].get(problem, 0) >= 1, end["refused_reports"]
    assert hostile_peer not in placed(end["plan"]), "the excluded member is out of the plan"
    # (a member briefly declared dead while the workers import torch may cause an earlier, unrelated recovery)
    named = [r for r in end["recoveries"] if hostile_peer in r["reason"] and "excluded" in r["reason"]]
    assert named, f"no recovery names the attacker: {end['recoveries']}"
    # from the last committed checkpoint before the attack (step 20, or 0 while step 20's commit was still checking)
    assert named[0]["resumed_step"] in (0, ATTACK_FROM_STEP - 20) and named[0]["lost_step"] >= ATTACK_FROM_STEP, named
    assert_equals_failure_free(end, spec)
    assert job_of(s, job_id)["state"] == "done"
    assert files_outside(tmp_path, s) == [], "a file was written outside the swarm's folders"
    return end, s


def test_a_shard_named_as_a_path_is_refused_and_never_written(swarm_of: Any, tmp_path: Path) -> None:
    target = tmp_path / "outside" / "authorized_keys.safetensors"
    run_attack(swarm_of, tmp_path, "path", "shard_name", str(target))
    assert not target.exists() and not target.parent.exists(), "the member's name became a path on the leader"


def test_a_shard_named_as_another_stages_is_refused(swarm_of: Any, tmp_path: Path) -> None:
    run_attack(swarm_of, tmp_path, "mismatch", "shard_name")


def test_a_16_gib_shard_claim_is_refused_before_any_download(swarm_of: Any, tmp_path: Path) -> None:
    run_attack(swarm_of, tmp_path, "huge", "shard_size")


def test_a_member_that_writes_nan_into_its_shard_is_dropped_and_the_job_resumes(swarm_of: Any, tmp_path: Path) -> None:
    end, _ = run_attack(swarm_of, tmp_path, "nan", "shard_content")
    assert "non-finite" in end["excluded"][next(iter(end["excluded"]))], end["excluded"]


@pytest.mark.timeout(900)
def test_a_member_whose_shard_holds_1e30_is_refused_and_the_model_stays_clean(tmp_path: Path) -> None:
    """Issue #29 item 8: finite poison passed the finite-value scan (the job ended done with 1e30 in most of the
    exported weights). The shard of step 40 on: its values moved further from the last commit than SGD can move
    them in 20 steps: the shard is refused, its sender excluded, and the job ends done from the last good
    checkpoint with the failure-free model, no 1e30 in it. (Poisoning only the final shard, the attacker dropped
    out of the plan before step 100 in 2 runs of 3 on two busy cores, and its shard was never used.)"""
    from safetensors.torch import load_file

    spec = write_spec(tmp_path, steps=100, interval=20)
    s = HostileSwarm(tmp_path / "swarm", "finite", "1e30", after=40, preset=SLOW_MACHINE)
    try:
        s.start()
        s.wait_converged()
        hostile_peer = s.call(HOSTILE, "status")["peer_id"]
        job_id = submit(s, spec)
        end = wait_end(s, job_id, timeout=840)  # (two busy cores: a member may look dead while torch loads)
        assert all(p.poll() is None for p in s.procs), "a daemon exited"
        assert end["state"] == "done", (end["error"], end["excluded"], end["recoveries"])
        assert "moved further than training can move them" in end["excluded"].get(hostile_peer, ""), end["excluded"]
        assert end["refused_reports"].get("shard_content", 0) >= 1, end["refused_reports"]
        named = [r for r in end["recoveries"] if hostile_peer in r["reason"] and "excluded" in r["reason"]]
        assert named and named[0]["resumed_step"] == 20 and named[0]["lost_step"] >= 40, end["recoveries"]
        exported = load_file(end["model_path"])
        assert max(float(v.abs().max()) for v in exported.values()) < 1e3, "poison in the exported model"
        assert_equals_failure_free(end, spec)
    finally:
        s.close()


def test_an_offer_beyond_physical_bounds_is_refused_at_the_join(swarm_of: Any, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, steps=60, interval=20)
    s = swarm_of("claims")
    hostile_peer = s.call(HOSTILE, "status")["peer_id"]
    job_id = submit(s, spec, members=2)
    end = wait_end(s, job_id, timeout=240)
    assert all(p.poll() is None for p in s.procs), "a daemon exited"
    assert hostile_peer not in placed(end["plan"]) and hostile_peer not in end["members"], (
        "the 2^50-byte offer was taken"
    )
    assert end["standby"] != hostile_peer
    assert_equals_failure_free(end, spec)


def test_a_member_that_refuses_every_start_is_excluded_and_the_job_ends_without_it(
    swarm_of: Any, tmp_path: Path
) -> None:
    """It joins, then refuses each start: after two in a row it is excluded (named in ``status``) and the job
    ends ``done`` over the two honest devices with the failure-free run's model (it used to spend the job's
    restarts and fail it)."""
    spec = write_spec(tmp_path, steps=60, interval=20)
    s = swarm_of("refuse")
    hostile_peer = s.call(HOSTILE, "status")["peer_id"]
    with Watch(as_daemon(s, 0)) as watch:
        job_id = submit(s, spec)
        end = wait_end(s, job_id, timeout=240)
    assert end["state"] == "done", end
    assert all(p.poll() is None for p in s.procs), "a daemon exited"
    assert "refused or failed 2 starts in a row" in end["excluded"].get(hostile_peer, ""), end["excluded"]
    planned = placed(end["plan"])
    assert hostile_peer not in planned and len(planned) == 2 and hostile_peer not in end["members"]
    assert watch.report.status_max_s < 1.0, watch.report
    assert_equals_failure_free(end, spec)


OVERCLAIM_SPEC: dict[str, Any] = {"steps": 60, "interval": 30, "width": 1536, "batch": 768}
"""The spec of the tests of members that offer 100 times their speed (:func:`big_spec`'s arguments): stages that
take a good part of a second, so the job runs past its plan by well over claims.MIN_EXCESS_S a step and the leader
times its devices (with batch 256, 2048 wide, an idle machine ran the liar's stage 0.1 s over its prediction);
checkpoints 30 steps apart, so the leader's challenge is judged before two reports of step times could be (step
60). 2048 wide at batch 1024 (2.4x the FLOPs a step) ran the timed-challenge tests past their 300 s limit. One
spec, so one pytest process runs its failure-free reference once.

60 steps (was 90): the liar's challenge ended at step 5-20 of the first 30 (nine runs, load 5-13); the leader
judges it at the step-30 checkpoint and plans again from the last commit (none yet: the overclaim paced that
checkpoint, so it is not committed), and the job trains its 60 steps again. A challenge judged only at step 60
still restarts the job from the step-30 commit (a checkpoint with a restart reason is never the job's end), so 60
steps keep a checkpoint of margin. The 30 steps fewer saved ~40 s a test at load 6-8, and a third of the
reference."""


def planned_speed(view: dict[str, Any], peer: str) -> float | None:
    """The FLOP/s the job view's plan rates ``peer`` at (None when the plan leaves it out)."""
    return next(
        (float(d["flops_per_s"]) for st in view["plan"]["stages"] for d in st["devices"] if d["peer_id"] == peer), None
    )


@pytest.mark.timeout(420)  # (run alone, it pays OVERCLAIM_SPEC's failure-free run: 57-85 s on two busy cores)
def test_a_member_that_overstates_its_speed_is_planned_again_at_its_measured_speed(
    swarm_of: Any, tmp_path: Path
) -> None:
    """``overclaim``: the leader's timed challenge or its own step times give it away. (``overclaim-hidden``,
    whose reports say its stage took what its offer predicts, was a second case here: the same swarm and attack
    as the timed-challenge test's below, where the leader's challenge caught it too; that test now holds its
    checks.)"""
    from arceusd.jobs.judging import claims

    # the timed-challenge test's spec: the leader's challenge catches this liar as it does the one whose reports
    # hide its step times (its step times may catch it first), and one pytest process runs the failure-free loop
    # once for both (this test's 2048-wide one at batch 1024, 60 steps, took 122 s on two busy cores, 1536 at
    # 768 for 90 steps 57-82 s, for 60 steps 85 s at load 7-8)
    spec = big_spec(tmp_path, **OVERCLAIM_SPEC)
    # memberlist's timings: three workers of wide layers fill both cores, and with the local ones the daemons,
    # starved for a second, declared each other dead again and again (a take-over, the owner left paused)
    s = swarm_of("overclaim", "100", preset=SLOW_MACHINE)
    hostile_peer = s.call(HOSTILE, "status")["peer_id"]
    job_id = submit(s, spec)
    first = wait_for(lambda: (v := job_of(s, job_id)).get("plan") and v, 120, 0.2, "the first plan")
    end = wait_end(s, job_id, timeout=240)
    assert all(p.poll() is None for p in s.procs), "a daemon exited"
    assert end["discounted"].get(hostile_peer, 0.0) > claims.RELATIVE_SLOW, (end["discounted"], end["measured_step_s"])
    assert list(end["discounted"]) == [hostile_peer], "an honest member was discounted"
    named = [
        r for r in end["recoveries"] if hostile_peer[:12] in r["reason"] and "slower than its offer" in r["reason"]
    ]
    assert named, f"no recovery names the member that overstated its speed: {end['recoveries']}"
    # planned at its offer first, then at the offer divided by what was measured
    offered, planned = planned_speed(first, hostile_peer), planned_speed(end, hostile_peer)
    assert offered and (
        planned is None or planned == pytest.approx(offered / end["discounted"][hostile_peer], rel=0.02)
    ), (offered, planned)
    # resumed exactly, within rounding: with 2048-wide layers the plain loop alone differed by 2.4e-3 between one
    # and two torch threads after 60 steps; the small model's recoveries are held to 1e-5
    assert_equals_failure_free(end, spec, tolerance=1e-2)


@contextmanager
def hostile_job(tmp_path: Path, spec: Path, attack: str, arg: str) -> Iterator[SimpleNamespace]:
    """A :class:`HostileSwarm` running ``attack`` from the first report on, trained on ``spec`` to its end:
    ``swarm``, ``hostile`` (its peer id), ``first`` (the job's view with its first plan) and ``end``; no daemon
    may have exited."""
    s = HostileSwarm(tmp_path / "swarm", attack, arg, after=0)
    try:
        s.start()
        s.wait_converged()
        hostile_peer = s.call(HOSTILE, "status")["peer_id"]
        job_id = submit(s, spec)
        first = wait_for(lambda: (v := job_of(s, job_id)).get("plan") and v, 120, 0.2, "the first plan")
        end = wait_end(s, job_id, timeout=280)
        assert all(p.poll() is None for p in s.procs), "a daemon exited"
        yield SimpleNamespace(swarm=s, hostile=hostile_peer, first=first, end=end)
    finally:
        s.close()


@pytest.mark.parametrize("attack", ["overclaim-hidden", "challenge-forge"])
def test_the_leader_times_each_member_and_plans_an_overclaimer_at_what_it_measured(tmp_path: Path, attack: str) -> None:
    """A member offering 100 times its speed whose checkpoint reports cover the lie from the first one on: the
    leader's timed speed challenge (its own clock, nobody's word: the case a neighbour alone sees it is word
    against word) catches it, before its step times could (they need two reports in a row: step 60 here). With
    ``challenge-forge`` it answers at once with a made-up root and blocks: the blocks fail their proofs, and it
    is planned at its offer over :data:`claims.MAX_DISCOUNT`. Every device's figures are in ``status``; the job
    resumes exactly. (``overclaim-hidden`` is also the overstating test's hidden case: its recovery says the
    member ran slower than its offer, and its reports said it kept to it.)"""
    from arceusd.jobs.judging import claims

    spec = big_spec(tmp_path, **OVERCLAIM_SPEC)
    with hostile_job(tmp_path, spec, attack, "100") as run:
        hostile_peer, first, end = run.hostile, run.first, run.end
        checks = end["speed_checks"]
        assert set(checks) == {d["peer_id"] for st in first["plan"]["stages"] for d in st["devices"]}, checks
        honest = [c for p, c in checks.items() if p != hostile_peer]
        assert all(c["failed"] == "" and c["measured_gflops"] > 0 for c in honest), checks
        assert list(end["discounted"]) == [hostile_peer], (end["discounted"], checks)
        named = [r["reason"] for r in end["recoveries"] if hostile_peer[:12] in r["reason"]]
        assert named and "timed speed challenge" in named[0], end["recoveries"]
        assert "slower than its offer" in named[0], end["recoveries"]
        if attack == "challenge-forge":
            assert "not the one its root committed to" in checks[hostile_peer]["failed"], checks
            assert end["discounted"][hostile_peer] == claims.MAX_DISCOUNT
        else:
            assert checks[hostile_peer]["failed"] == "" and end["discounted"][hostile_peer] > claims.RELATIVE_SLOW
            slowest_honest = max(c["slowdown"] for c in honest)
            assert checks[hostile_peer]["slowdown"] > claims.RELATIVE_SLOW * slowest_honest, checks
            # its reports said it kept to its offer all along
            assert end["measured_step_s"][hostile_peer][0] <= end["measured_step_s"][hostile_peer][1] * 1.001, end
        offered, planned = planned_speed(first, hostile_peer), planned_speed(end, hostile_peer)
        assert offered and (
            planned is None or planned == pytest.approx(offered / end["discounted"][hostile_peer], rel=0.02)
        ), (offered, planned)
        assert_equals_failure_free(end, spec, tolerance=1e-2)


def challenge_children(daemons: list[int]) -> list[int]:
    """Speed challenge child processes of these daemons: forked by a daemon's fork server (its grandchild, named
    for the program: its command line is the server's) or, where there is none, started cold (its child)."""
    from arceusd.jobs.procs.challenge_child import MODULE
    from arceusd.jobs.procs.fork_server import PROGRAMS

    table = processes()

    def cold(pid: int) -> bool:
        try:
            return MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    return [
        pid
        for pid, (parent, _) in table.items()
        if (parent in daemons and cold(pid))
        or (table.get(parent, (0, ""))[0] in daemons and name_of(pid) == PROGRAMS[MODULE])
    ]


def test_a_leader_that_abuses_speed_challenges_is_refused_and_leaves_no_child_behind(tmp_path: Path) -> None:
    """The job's own leader (hostile: ``challenge-abuse``) sends its members challenges out of every bound, seeds
    and opens for challenges that do not exist, two at once and one whose seed never comes. Each member refuses
    what is out of bounds or out of order with a reason, keeps one challenge at a time, kills the child of the
    abandoned one within the ready time, keeps answering ``status`` within 1 s, and the job ends done."""
    from arceusd.jobs.judging import challenges

    spec = write_spec(tmp_path, steps=100, interval=20)
    s = HostileSwarm(tmp_path / "swarm", "challenge-abuse", hostile=LEADER)
    try:
        s.start()
        s.wait_converged()
        members = [s.call(i, "status")["peer_id"][:12] for i in (1, 2)]
        with Watch(as_daemon(s, 1)) as watch:
            job_id = submit(s, spec)
            end = wait_end(s, job_id, timeout=240)
            stderr = s.root / "hostile.stderr"

            def answered() -> dict[tuple[str, str], str]:
                lines = [
                    ln.split("hostile: answer ", 1)[1]
                    for ln in stderr.read_text().splitlines()
                    if "hostile: answer " in ln
                ]
                return {(ln[:12], ln[13:].split(": ", 1)[0]): ln.split(": ", 1)[1] for ln in lines}

            wait_for(lambda: len(answered()) == 2 * len(ABUSES), 120, 0.5, "every abuse answered")
            member_pids = [s.procs[1].pid, s.procs[2].pid]
            assert challenge_children(member_pids), "the pending challenge's child is not running"
            limit = challenges.READY_S + challenges.REPLY_S + 20
            wait_for(lambda: not challenge_children(member_pids), limit, 0.5, "the abandoned challenge's child ended")
        assert end["state"] == "done", end
        assert all(p.poll() is None for p in s.procs), "a daemon exited"
        assert watch.report.status_max_s < 1.0, watch.report
        got = answered()
        for member in members:
            said = {case: got[(member, case)] for case in ABUSES}
            for case in ("size", "rounds", "long wait", "nan wait", "bad id", "go unknown", "open unknown"):
                assert said[case].startswith("False "), (case, said[case])
            assert "challenge size 8192" in said["size"] and "rounds" in said["rounds"], said
            assert said["first"].startswith("True") and said["pending"].startswith("True"), said
            assert said["second"].startswith("False") and "busy" in said["second"], said
            assert said["bad seed after first"].startswith("False") and "seed" in said["bad seed after first"], said
            assert said["go after ended"].startswith("False"), said  # the bad seed ended that challenge
    finally:
        s.close()


def test_a_member_that_slows_the_job_on_purpose_and_blames_its_neighbour_is_found_wherever_it_sits(
    tmp_path: Path,
) -> None:
    """An honest offer (it passes its speed challenge), but it naps 0.5 s before every step and says it spent
    that waiting on its neighbour. Next to the leader, the leader's own clock catches it; at the far end, it and
    its neighbour contradict each other, neither is judged on its neighbours' views (the honest one would be
    framed), and the leader plans it alone beside itself, where it is caught. Either way it is the one planned
    slower, no honest member is, and the job resumes exactly."""
    spec = big_spec(tmp_path, steps=100, interval=10, width=512, batch=256, calm=True)
    with hostile_job(tmp_path, spec, "sandbag", "0.5") as run:
        s, hostile_peer, first, end = run.swarm, run.hostile, run.first, run.end
        order = [d["peer_id"] for st in first["plan"]["stages"] for d in st["devices"]]
        assert list(end["discounted"]) == [hostile_peer], (order, end["discounted"], end["recoveries"])
        checks = end["speed_checks"]
        assert checks.get(hostile_peer, {}).get("failed", "") == "", checks  # its hardware is what it said
        reasons = [r["reason"] for r in end["recoveries"]]
        leader = s.call(0, "status")["peer_id"]
        far = len(order) == 3 and order.index(hostile_peer) - order.index(leader) in (2, -2)
        if far:  # word against word: settled by probation
            assert any("alone beside the leader" in r and hostile_peer[:12] in r for r in reasons), (order, reasons)
        assert end["probation"] == "" and hostile_peer not in end["cleared"], end
        assert_equals_failure_free(end, spec, tolerance=1e-4)


def run_blamed(
    tmp_path: Path,
    spec: Path,
    attack: str,
    arg: str,
    after: int,
    why: str,
    tolerance: float = 1e-5,
    size: int = 3,
    lend_mib: tuple[int, ...] = (),
    faster: Mapping[int, float] | None = None,
) -> dict[str, Any]:
    """Issue #29 item 6: ``attack`` from checkpoint step ``after`` on used to fail the job after its restarts,
    the attacker never named. Now the failure is pinned on it: it is excluded (``why`` in ``excluded``), the job
    plans again without it and ends ``done`` with the failure-free model. ``lend_mib``: each daemon's
    ``lend_memory_mib``; ``faster``: daemon index -> how many times the swarm's shared measurement of this
    machine its own says it computes (an honest offer, for a plan that does not hang on peer ids' order).
    Returns the job's first and last views, the leader's and the attacker's ids."""
    s = HostileSwarm(tmp_path / "swarm", attack, arg, after=after, preset=SLOW_MACHINE, size=size)
    try:
        prepare(s, lend_mib, faster)
        s.start()
        s.wait_converged()
        hostile_peer = s.call(HOSTILE, "status")["peer_id"]
        job_id = submit(s, spec, members=size)
        first = wait_for(lambda: (v := job_of(s, job_id)).get("plan") and v, 240, 0.2, "the first plan")
        end = wait_end(s, job_id, timeout=840)  # (two busy cores: a member may look dead while torch loads)
        assert all(p.poll() is None for p in s.procs), "a daemon exited"
        assert hostile_peer in placed(first["plan"]), "the attacker was not in the first plan: nothing was tested"
        assert end["state"] == "done", (end["error"], end["excluded"], end["recoveries"])
        assert why in end["excluded"].get(hostile_peer, ""), end["excluded"]
        assert list(end["excluded"]) == [hostile_peer], "an honest member was excluded"
        assert hostile_peer not in placed(end["plan"]) and hostile_peer not in end["members"]
        assert_equals_failure_free(end, spec, tolerance=tolerance)
        return {"first": first, "end": end, "leader": s.call(LEADER, "status")["peer_id"], "hostile": hostile_peer}
    finally:
        s.close()


@pytest.mark.timeout(900)
def test_a_member_serving_its_shard_too_big_is_excluded_and_the_job_ends_done(tmp_path: Path) -> None:
    """Its reports are true (its real size), but it serves a 16 GiB total: each commit refuses the copy; it used
    to fail every commit and then the job (and, when only its final shard was served so, the final commit's
    retries came within the blame spacing and failed the job before it was excluded)."""
    spec = write_spec(tmp_path, steps=100, interval=20)
    run_blamed(tmp_path, spec, "serve-big", "", ATTACK_FROM_STEP, "shard serving failed 2 commits in a row")


@pytest.mark.timeout(900)
def test_a_member_answering_every_checkpoint_with_an_error_is_excluded_and_the_job_ends_done(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, steps=100, interval=20)
    run_blamed(tmp_path, spec, "checkpoint-error", "", ATTACK_FROM_STEP, "failed 2 plans in a row first")


@pytest.mark.timeout(900)
def test_a_wrong_witness_with_two_replicas_is_settled_by_the_leaders_own_and_the_job_ends_done(tmp_path: Path) -> None:
    """Two replicas of one device each (the leader one of them, the attacker, offering 3x its speed to be planned,
    the other; the third member spare):
    the attacker's made-up witness differs from the leader's own, which settles it; it used to be word against
    word, the job replanned until it failed."""
    spec = replicas_spec(tmp_path, steps=60, layers="[784, 64, 10]")
    run_blamed(tmp_path, spec, "witness", "3", 0, "diverged from the other replicas", tolerance=1e-4)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("replica", [1, 0], ids=["second-replica", "first-replica"])
def test_a_wrong_witness_at_a_place_the_leader_does_not_hold_is_settled_by_the_first_replicas_shard(
    tmp_path: Path, replica: int
) -> None:
    """Two replicas of two places (stages or tensor ranks) on four daemons (:data:`WITNESS_PLACES`): the
    attacker's place is not the leader's, so no witness of the leader's own can settle it; the first replica's
    reported shard digest does: ``second-replica``, the attacker's made-up witness differs from it;
    ``first-replica``, the attacker writes that shard and its witness contradicts its own shard's digest (the
    shard is never committed). It used to be word against word. The three left train as one replica (averaging
    every step, fewer replicas are planned when the spec's no longer fit)."""
    spec = replicas_spec(tmp_path, steps=60, layers="[784, 256, 256, 10]")
    where = WITNESS_PLACES[replica]
    seen = run_blamed(
        tmp_path,
        spec,
        "witness",
        where.arg,
        0,
        "diverged from the other replicas",
        tolerance=1e-4,
        size=where.size,
        lend_mib=where.lend_mib,
        faster=where.faster,
    )
    plan = seen["first"]["plan"]
    places = place_of(plan)  # (stage, rank): stages or tensor ranks, whichever the planner chose for four devices
    assert len(plan["replicas"]) == 2 and len(places) == 4, plan["replicas"]
    assert places[seen["hostile"]] != places[seen["leader"]], "the leader held the attacker's place"
    assert replica_of(plan)[seen["hostile"]] == replica, ("the attacker is not where this case puts it", plan)
    assert "first replica's shard" in seen["end"]["excluded"][seen["hostile"]], seen["end"]["excluded"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("replica", "attack"),
    [(1, "witness"), (0, "witness"), (0, "witness-withhold")],
    ids=["second-replica", "first-replica", "first-replica-withholds"],
)
def test_a_wrong_diloco_witness_at_a_place_the_leader_does_not_hold_is_settled_by_the_outer_state_in_the_shard(
    tmp_path: Path, replica: int, attack: str
) -> None:
    """With DiLoCo the witness is the outer anchor and momentum: at a place the leader does not hold, the leader
    copies the first replica's shard of that place, rebuilds the witness its outer tensors give (no torch in the
    daemon) and names who lied. It used to be word against word: the job replanned, and a member lying at every
    checkpoint failed it.

    Two replicas of two stages on five daemons, the attacker at the second stage (a place the leader never
    holds), the fifth daemon a spare that takes its place (DiLoCo keeps the spec's two replicas: on four daemons
    the three left could hold none); :data:`DILOCO_PLACES` puts the attacker in the ``replica`` asked for.
    ``second-replica``: its made-up witness differs from the one the leader rebuilt from the first replica's
    shard at its place. ``first-replica``: it writes that shard itself; its made-up witness contradicts the outer
    state of its own shard, which names it (its shard is never committed: the job replans from the last commit
    without it). ``first-replica-withholds``: it also serves its shard as 16 GiB, so the leader cannot read it
    and the dispute is word against word: the job replans, and the withheld shard counts as a failure of its
    serving, twice in a row (no commit between) excluding it (it used to spend the job's restarts)."""
    spec = replicas_spec(tmp_path, steps=60, layers="[784, 256, 256, 10]", sync="diloco")
    where = DILOCO_PLACES[replica]
    withholds = attack == "witness-withhold"
    seen = run_blamed(
        tmp_path,
        spec,
        attack,
        where.arg,
        0,
        "its shard serving failed 2 times in a row" if withholds else "diverged from the other replicas",
        tolerance=1e-4,
        size=where.size,
        lend_mib=where.lend_mib,
        faster=where.faster,
    )
    plans = [seen["first"]["plan"], seen["end"]["plan"]]
    for plan in plans:
        assert plan["sync"] == "diloco" and len(plan["replicas"]) == 2, plan
    places = place_of(plans[0])
    assert len(places) == 4 and places[seen["hostile"]] != places[seen["leader"]], plans[0]["replicas"]
    assert replica_of(plans[0])[seen["hostile"]] == replica, ("the attacker is not where this case puts it", plans[0])
    why = seen["end"]["excluded"][seen["hostile"]]
    assert withholds or "first replica's shard, whose outer anchor and momentum the leader read" in why, why
    if withholds:  # the first dispute left word against word, the second excluded it (it took four disputes,
        # or failed the job, when a withheld shard counted once per 10 s: these came 3.5 s apart)
        assert seen["end"]["refused_reports"].get("replica_witness", 0) >= 1, seen["end"]["refused_reports"]
        reasons = [r["reason"] for r in seen["end"]["recoveries"]]
        named = [i for i, r in enumerate(reasons) if seen["hostile"] in r and "excluded" in r]
        assert named and named[0] <= 2, reasons  # (one more: a member a loaded machine declared dead)
