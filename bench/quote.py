"""Does the quote hold? Jobs of different sizes through real daemons, quoted against what they took and cost.

Issue 31: ``submit --quote`` said 14.6 s and $0.0001; the job trained about 115 s and was billed $0.0007. This
bench starts a local swarm (2 daemons on loopback, ``--auto-join``, one shared measurement of the machine), and per
job asks ``arceusd submit --quote --json`` on the owner, submits it with ``--members 2``, times it from submit to
``done`` and reads the owner's ``arceusd bill``. Prints, per job, the quoted time (range) against the actual, and
the quoted cost (range) against the billed, with their ratios (goal: within 25 %), what each job measured
(start-up to its first step, its step time against the plan's prediction) and which of the quote's terms were
assumed (not yet measured by the daemon: :mod:`arceusd.market.timings`). A short job of each model runs first
(``first-*``), shown but not counted: before it the daemon has measured no job of its kind.

    python bench/quote.py [--jobs mnist,gpt-small,gpt] [--no-warmup] [--keep DIR]

The jobs: ``examples/mnist-mlp.toml`` (310 steps) and two character GPTs shrunk from
``examples/shakespeare-gpt.toml`` (2 layers x 64 wide, and 4 x 128), sized so the whole bench takes a few minutes
on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arceusd.base.control import ControlError
from arceusd.cli.swarm import PROFILE_ENV, LocalSwarm
from arceusd.jobs.spec.parsed import TrainingSpec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOAL = 0.25
SETTLE_S = 30.0
"""Seconds the bench lets the daemons settle before the first job (their own start-up work done). A daemon's fork
server, which imports torch once for every worker, starts with its first job: the first-* jobs pay that import (3 s
on a quiet 2-core machine), which the daemon measures and a later job's quote leaves out."""


@dataclass(frozen=True)
class JobCase:
    """One bench job: a name, the example it is shrunk from and the TOML keys it changes."""

    name: str
    example: str
    changes: dict[str, str]
    use_all_devices: bool = False


CASES = (
    JobCase("mnist", "mnist-mlp.toml", {"epochs": "10"}),
    JobCase(
        "gpt-small",
        "shakespeare-gpt.toml",
        {
            "n_layer": "2",
            "n_embd": "64",
            "block_size": "32",
            "batch_size": "16",
            "steps": "300",
            "warmup_steps": "20",
            "eval_interval_steps": "100",
            "interval_steps": "100",
            "eval_iters": "10",
        },
    ),
    JobCase(
        "gpt",
        "shakespeare-gpt.toml",
        {"steps": "150", "warmup_steps": "20", "eval_interval_steps": "50", "interval_steps": "50", "eval_iters": "10"},
    ),
    JobCase(
        "gpt-2dev",
        "shakespeare-gpt.toml",
        {"steps": "150", "warmup_steps": "20", "eval_interval_steps": "50", "interval_steps": "50", "eval_iters": "10"},
        use_all_devices=True,
    ),
)
"""``gpt-2dev``: the ``gpt`` job with ``training.use_all_devices``, so the second daemon works and is billed (the
planner leaves out a device that does not make the step faster, and these two share one machine's cores)."""
WARMUPS = (
    JobCase("first-mnist", "mnist-mlp.toml", {"epochs": "2"}),
    JobCase("first-gpt-small", "shakespeare-gpt.toml", {**CASES[1].changes, "steps": "100", "interval_steps": "50"}),
    JobCase("first-gpt", "shakespeare-gpt.toml", {**CASES[2].changes, "steps": "40", "interval_steps": "20"}),
)
"""A short job of each model first (the daemon's first jobs), quoted and timed like the others but not counted:
a daemon quotes from what it measured of its own past jobs (``arceusd.market.timings``); before its first job of a
kind it has measured nothing of it (its quote says which terms are assumed, from another machine)."""
WARMED = {c.name for c in WARMUPS}


@dataclass(frozen=True)
class Result:
    name: str
    quote: dict[str, Any]
    actual_s: float
    first_step_s: float
    last_step_s: float
    """Submit to the last step seen (the rest: the final commit, the model's export)."""
    billed_usd: float
    predicted_step_s: float
    measured_step_s: float
    plan_devices: int
    load: float
    """The machine's 1-minute load average when the job ended (other work on it slows every step)."""
    spare: bool = False
    """The second daemon said it is a spare (``status JOB`` there) while the job ran."""


def write_spec(case: JobCase, directory: Path) -> Path:
    """The example with ``case.changes`` applied and its data path made absolute, written under ``directory``."""
    text = (EXAMPLES / case.example).read_text()
    text = text.replace('"../data/', f'"{ROOT / "data"}/')
    for key, value in case.changes.items():
        text, n = re.subn(rf"(?m)^{key} = [^\n#]*", f"{key} = {value}", text)
        if n != 1:
            raise ValueError(f"{case.example} has {n} lines `{key} = ...`; the bench expects exactly one")
    text = re.sub(r'(?m)^name = "[^"]*"', f'name = "quote-{case.name}"', text)
    if case.use_all_devices:
        text = text.replace("[training]\n", "[training]\nuse_all_devices = true\n")
    path = directory / f"{case.name}.toml"
    path.write_text(text)
    return path


def arceusd(state: Path, *args: str, timeout: float = 300.0) -> str:
    cmd = [sys.executable, "-m", "arceusd", "--state-dir", str(state), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"`arceusd {' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()[-800:]}")
    return out.stdout


def bill_usd(state: Path, job_id: str) -> float:
    """The owner's bill once its receipts stop changing (they are settled after each commit, in the background)."""
    last, stable_since = -1.0, time.monotonic()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            usd = float(json.loads(arceusd(state, "bill", job_id, "--json"))["total_usd"])
        except RuntimeError:
            usd = 0.0  # no receipts (yet, or none: the owner's device alone is not billed)
        if usd != last:
            last, stable_since = usd, time.monotonic()
        elif time.monotonic() - stable_since > 4.0:
            break
        time.sleep(1.0)
    return last


def run_case(swarm: LocalSwarm, case: JobCase, spec_dir: Path) -> Result:
    spec = write_spec(case, spec_dir)
    owner = swarm.state_dir(0)
    quote = json.loads(arceusd(owner, "submit", str(spec), "--members", "2", "--quote", "--json"))
    began = time.monotonic()
    out = arceusd(owner, "submit", str(spec), "--members", "2")
    job_id = out.split()[2]
    first = last = None
    job: dict[str, Any] = {}
    spare = False  # whether the other daemon said it is a spare while the job ran (the plan left it out)
    asked = 0.0
    while True:
        job = swarm.call(0, "job", {"job_id": job_id})
        step = int(job.get("step") or 0)
        if step >= 1 and not spare and time.monotonic() - asked > 1.0:
            asked = time.monotonic()
            with contextlib.suppress(ControlError):  # (it may not know the job yet)
                spare = bool(swarm.call(1, "job", {"job_id": job_id}).get("spare"))
        if first is None and step >= 1:
            first = time.monotonic() - began
        if last is None and step >= int(job.get("total_steps") or 1):
            last = time.monotonic() - began
        if job["state"] == "done":
            break
        if job["state"] in ("failed", "cancelled"):
            raise RuntimeError(f"job {case.name} {job['state']}: {job.get('error')}")
        if time.monotonic() - began > 900:
            raise TimeoutError(f"job {case.name} did not end in 900 s (step {job.get('step')})")
        time.sleep(0.25)
    actual = time.monotonic() - began
    plan = job.get("plan") or {}
    timing = job.get("stage_timing") or {}
    devices = {d.get("peer_id") for s in plan.get("stages", []) for d in s.get("devices", [])}
    load = os.getloadavg()[0]
    return Result(
        case.name,
        quote,
        actual,
        first or 0.0,
        last or actual,
        bill_usd(owner, job_id),
        float(plan.get("predicted_step_time_s") or 0.0),
        float(timing.get("step_time_s") or 0.0),
        len(devices),
        load,
        spare,
    )


def ratio(actual: float, quoted: float) -> str:
    if quoted <= 0:
        return "  -  " if actual <= 0 else " inf "
    return f"{actual / quoted:5.2f}"


def report(results: list[Result]) -> bool:
    print(
        f"{'job':<10} {'quoted time (range)':<26} {'actual':>8} {'ratio':>6}   {'quoted cost (range)':<32} "
        f"{'billed':>10} {'ratio':>6}  first/last step s  step ms plan/measured  devices  load  assumed"
    )
    ok = True
    for r in results:
        q = r.quote
        t_ok = abs(r.actual_s / q["seconds"] - 1) <= GOAL
        c_ok = (q["usd"] <= 0 and r.billed_usd <= 0) or (q["usd"] > 0 and abs(r.billed_usd / q["usd"] - 1) <= GOAL)
        ok = ok and ((t_ok and c_ok) or r.name in WARMED)  # (a first of its kind: nothing measured, not counted)
        span = f"{q['seconds']:.1f} s ({q['low_s']:.1f}-{q['high_s']:.1f})"
        cost = f"${q['usd']:.6f} ({q['low_usd']:.6f}-{q['high_usd']:.6f})"
        print(
            f"{r.name:<10} {span:<26} {r.actual_s:7.1f}s {ratio(r.actual_s, q['seconds'])}{'' if t_ok else '!'}  "
            f"{cost:<32} ${r.billed_usd:.6f} {ratio(r.billed_usd, q['usd'])}{'' if c_ok else '!'}  "
            f"{r.first_step_s:5.1f}/{r.last_step_s:5.1f}  {1000 * r.predicted_step_s:6.1f}/"
            f"{1000 * r.measured_step_s:6.1f}  {r.plan_devices}  {r.load:4.1f}  "
            f"{','.join(q.get('assumed') or []) or '-'}{'  (spare)' if r.spare else ''}"
        )
    print("(spare): the other daemon's own status JOB said it is a spare (the plan left it out)")
    print(
        f"goal: within {GOAL:.0%} of the quote ('!' marks a miss; the first-* jobs, quoted before the daemon "
        f"measured a job of their kind, are not counted): {'met' if ok else 'NOT met'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(c.name for c in CASES), help="comma-separated job names")
    parser.add_argument("--no-warmup", action="store_true", help="skip the short first jobs (not counted)")
    parser.add_argument("--keep", type=Path, help="keep the swarm's state here (default: a temporary folder)")
    args = parser.parse_args()
    wanted = args.jobs.split(",")
    cases = [c for c in CASES if c.name in wanted]
    if len(cases) != len(wanted):
        raise SystemExit(f"unknown job in {wanted}; the jobs are {[c.name for c in CASES]}")
    if any(c.use_all_devices for c in cases) and "use_all_devices" not in TrainingSpec.__dataclass_fields__:
        print("skipping gpt-2dev: this checkout's specs have no training.use_all_devices", file=sys.stderr)
        cases = [c for c in cases if not c.use_all_devices]
    root = args.keep or Path(tempfile.mkdtemp(prefix="arceus-quote-"))
    env = {PROFILE_ENV: os.environ.get(PROFILE_ENV, str(root / "profile"))}
    swarm = LocalSwarm(root / "swarm", 2, ["--auto-join"], preset="lan", env=env)
    results = []
    try:
        swarm.start(timeout=120.0)
        swarm.wait_converged(60.0)
        time.sleep(SETTLE_S)  # daemons that have run a while
        for case in ([] if args.no_warmup else list(WARMUPS)) + cases:
            results.append(run_case(swarm, case, root))
            print(f"{case.name}: {results[-1]}", file=sys.stderr, flush=True)
    finally:
        swarm.close()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if report(results) else 1)


if __name__ == "__main__":
    main()
