"""The job attacks beside their no-attack runs (``python bench/adversarial.py --jobs``): per row a fresh swarm on
loopback (``tests/adversarial/hostile_job.py``: daemon 2 a real daemon whose job side lies) trains one job; printed
are the owner's peak RSS and ``status`` latency over the whole job and the job's wall time, each with its ratio to
the same job with an honest member (``none`` of that job, run first), the job's end (state, who was excluded or
discounted, refused reports, the standby) and pass/fail: whether the daemons did what the threat model says
(``docs/threat-model.md``; the same outcome ``tests/adversarial/test_job_hostile.py`` asserts, short of the
model's comparison with the failure-free run).

Jobs (``tests/adversarial/job_cases.py``): ``small``, the recovery MLP on three daemons (items 1, 3, 4; issue 29's
1e30 in the final shard, a shard served as 16 GiB, every checkpoint answered with an error, an 8 TiB offer, a
2^50-byte and 1e20 FLOP/s offer); ``big``, 2048-wide layers (a member offering 100x its speed with honest
reports, whose reports cover it, or that forges its speed challenges); ``calm``, 512-wide layers (a member
napping 0.5 s a step and blaming its neighbour); ``replicas``, two replicas of one device each (a made-up
witness, the leader holding the other place); ``places``, two replicas of two places on four daemons (a made-up
witness at a place the leader does not hold); ``diloco``, the same with DiLoCo on five daemons, the attacker in
the second replica and in the first (its witness contradicting its own shard; and, ``witness-withhold``, serving
that shard as 16 GiB so that nothing settles the dispute). ``--quick`` leaves out the
``calm``, ``places`` and ``diloco`` jobs (four and five daemons, or 100 steps of 512-wide layers: minutes each on
two cores); ``--only`` picks rows by name. Every swarm of a run shares one measurement of the machine
(``arceusd.cli.swarm.PROFILE_ENV``, as the tests do), so offers are multiples of one speed.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from tests.adversarial.victim import Report, Watch


@dataclass(frozen=True)
class JobCase:
    """One row: ``attack`` (``tests/adversarial/hostile_job.py``) with ``arg`` from checkpoint step ``after`` on,
    on ``job``; ``expect``: what passes (``clean``: done, nobody excluded or discounted; ``excluded``: done, the
    attacker alone excluded; ``discounted``: done, the attacker alone discounted; ``refused``: done, the attacker
    never a member; ``standby``: done, the attacker not the standby); ``replica``: with a placement, where the
    first plan must put the attacker (``tests/adversarial/job_cases.py``)."""

    attack: str
    job: str
    expect: str
    arg: str = ""
    after: int = 0
    replica: int | None = None

    @property
    def name(self) -> str:
        where = "" if self.replica is None else f", {('first', 'second')[self.replica]} replica"
        return f"{self.attack}{'' if self.job == 'small' else f' ({self.job}{where})'}"


HEAVY = ("calm", "places", "diloco")
"""Jobs ``--quick`` leaves out."""


def cases(steps: int) -> list[JobCase]:
    return [
        JobCase("none", "small", "clean"),
        JobCase("path", "small", "excluded", after=40),
        JobCase("huge", "small", "excluded", after=40),
        JobCase("nan", "small", "excluded", after=40),
        JobCase("finite", "small", "excluded", "1e30", after=steps),
        JobCase("serve-big", "small", "excluded", after=40),
        JobCase("checkpoint-error", "small", "excluded", after=40),
        JobCase("bigmem", "small", "standby"),
        JobCase("claims", "small", "refused"),
        JobCase("none", "big", "clean"),
        JobCase("overclaim", "big", "discounted", "100", after=40),
        JobCase("overclaim-hidden", "big", "discounted", "100"),
        JobCase("challenge-forge", "big", "discounted", "100"),
        JobCase("none", "calm", "clean"),
        JobCase("sandbag", "calm", "discounted", "0.5"),
        JobCase("none", "replicas", "clean"),
        JobCase("witness", "replicas", "excluded", "3"),
        JobCase("none", "places", "clean"),
        JobCase("witness", "places", "excluded", replica=1),
        JobCase("witness", "places", "excluded", replica=0),
        JobCase("none", "diloco", "clean"),
        JobCase("witness", "diloco", "excluded", replica=1),
        JobCase("witness", "diloco", "excluded", replica=0),
        JobCase("witness-withhold", "diloco", "excluded", replica=0),
    ]


def _spec(tmp: Path, case: JobCase, steps: int) -> Path:
    from tests.adversarial.job_cases import big_spec, replicas_spec
    from tests.integration.test_recovery import write_spec

    if case.job == "big":
        return big_spec(tmp, steps=steps, interval=20, width=2048, batch=1024)
    if case.job == "calm":
        return big_spec(tmp, steps=100, interval=10, width=512, batch=256, calm=True)
    if case.job == "replicas":
        return replicas_spec(tmp, steps=steps, layers="[784, 64, 10]")
    if case.job in ("places", "diloco"):
        return replicas_spec(
            tmp, steps=steps, layers="[784, 256, 256, 10]", sync=case.job.replace("places", "every_step")
        )
    return write_spec(tmp, steps=steps, interval=20)


def _verdict(case: JobCase, end: dict[str, Any], first: dict[str, Any], hostile: str, escaped: bool) -> bool:
    from tests.adversarial.job_cases import placed, replica_of

    if end["state"] != "done" or escaped:
        return False
    excluded, discounted = list(end.get("excluded", {})), list(end.get("discounted", {}))
    if case.replica is not None and case.attack != "none" and replica_of(first["plan"]).get(hostile) != case.replica:
        return False  # the attacker was not where the row says it is: nothing of that case was measured
    if case.expect == "clean":
        return not excluded and not discounted
    if case.expect == "excluded":
        return excluded == [hostile] and hostile not in placed(end["plan"])
    if case.expect == "discounted":
        return discounted == [hostile] and not excluded
    if case.expect == "refused":
        return hostile not in end["members"] and hostile not in placed(end["plan"]) and end.get("standby") != hostile
    if case.expect == "standby":
        return end.get("standby") != hostile
    raise ValueError(f"unknown expectation {case.expect!r}")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a is not None and b else "     -"


def _p50(report: Report) -> float | None:
    lat = sorted(report.status_latencies)
    return lat[len(lat) // 2] if lat else None


def run_case(case: JobCase, steps: int) -> tuple[Report, float, str, bool]:
    """Train ``case``'s job on a fresh swarm: the owner's report, the job's seconds, its end in words, and
    whether it passed."""
    from tests.adversarial.hostile_job import HostileSwarm
    from tests.adversarial.job_cases import DILOCO_PLACES, WITNESS_PLACES, prepare
    from tests.harness import Daemon, wait_for
    from tests.integration.test_recovery import job_of, submit, wait_end

    replica = 1 if case.replica is None else case.replica
    where = {"places": WITNESS_PLACES[replica], "diloco": DILOCO_PLACES[replica]}.get(case.job)
    size = where.size if where else 3
    arg = where.arg if where and case.attack.startswith("witness") else case.arg
    # memberlist's timings where the tests use them: workers of wide layers or four and five daemons fill both
    # cores, and with the local ones the daemons declared each other dead again and again
    preset = "lan" if where or case.job in ("big", "calm") else "local"
    with tempfile.TemporaryDirectory(prefix="arceus-adv-job-") as tmp:
        spec = _spec(Path(tmp), case, steps)
        outside = Path(tmp) / "outside" / "x.safetensors"
        s = HostileSwarm(
            Path(tmp) / "swarm",
            case.attack,
            str(outside) if case.attack == "path" else arg,
            case.after,
            preset=preset,
            size=size,
        )
        try:
            if where:
                prepare(s, where.lend_mib, where.faster)
            s.start()
            s.wait_converged(60)
            hostile = str(s.call(2, "status")["peer_id"])
            owner = cast(Daemon, SimpleNamespace(pid=s.procs[0].pid, state_dir=s.state_dir(0), proc=s.procs[0]))
            began = time.monotonic()
            with Watch(owner) as w:
                job_id = submit(s, spec, members=2 if case.attack == "claims" else size)
                first = wait_for(lambda: (v := job_of(s, job_id)).get("plan") and v, 240, 0.2, "the first plan")
                end = wait_end(s, job_id, timeout=900)
            took = time.monotonic() - began
            exited = [i for i, p in enumerate(s.procs) if p.poll() is not None]
        finally:
            s.close()
    ok = _verdict(case, end, first, hostile, outside.exists()) and not exited
    excluded = ",".join(p[:8] for p in end.get("excluded", {}))
    discounted = ",".join(f"{p[:8]}:{f:g}" for p, f in end.get("discounted", {}).items())
    placed_in = {
        k: [d["peer_id"][:8] for st in r["stages"] for d in st["devices"]]
        for k, r in enumerate(first["plan"].get("replicas", [first["plan"]]))
    }
    said = (
        f"{end['state']} hostile={hostile[:8]} excluded={excluded or '-'} discounted={discounted or '-'} "
        f"refused={end.get('refused_reports')} escaped={outside.exists()} standby={str(end.get('standby'))[:8]} "
        f"first plan={placed_in}{f' exited={exited}' if exited else ''}"
    )
    return w.report, took, said, ok


def job_attacks(quick: bool, only: str = "") -> int:
    import os

    from arceusd.cli.swarm import PROFILE_ENV

    with tempfile.TemporaryDirectory(prefix="arceus-adv-profile-") as profile:
        # one measurement of the machine for every swarm of the run, as the tests share one (daemons measuring
        # at once on two busy cores each measured a part of it; a placement's faster daemons are multiples of it)
        os.environ.setdefault(PROFILE_ENV, profile)
        return _job_rows(quick, only)


def _job_rows(quick: bool, only: str) -> int:
    steps = 60 if quick else 100
    base: dict[str, tuple[Report, float]] = {}
    failed = 0
    print(
        f"{'attack':<42} {'RSS MiB':>8} {'ratio':>6} {'status p50 ms':>14} {'max ms':>8} {'job s':>6} {'ratio':>6}"
        "  verdict  end"
    )
    for case in cases(steps):
        if (quick and case.job in HEAVY) or (only and only not in case.name and case.attack != "none"):
            continue
        if only and case.attack == "none" and not any(only in c.name and c.job == case.job for c in cases(steps)):
            continue
        report, took, said, ok = run_case(case, steps)
        if case.attack == "none":
            base[case.job] = (report, took)
        b_report, b_took = base.get(case.job, (None, None))
        failed += not ok
        print(
            f"{case.name:<42} {report.peak_rss_mib:8.1f} "
            f"{_ratio(report.peak_rss_mib, b_report.peak_rss_mib if b_report else None)} "
            f"{(_p50(report) or 0) * 1e3:14.2f} {report.status_max_s * 1e3:8.2f} {took:6.1f} {_ratio(took, b_took)}"
            f"  {'pass' if ok else 'FAIL'}     {said}",
            flush=True,
        )
    return 1 if failed else 0


__all__ = ["JobCase", "cases", "job_attacks", "run_case"]
