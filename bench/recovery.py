"""Recovery benchmark: from SIGKILL of a member daemon to the first training step after the job resumed.

Runs a 3-daemon local swarm (real daemons, workers, transport) per timing preset, trains an MLP on MNIST (or with
``--model llama`` a tiny stock transformers Llama on Tiny Shakespeare, whose workers import transformers) paced
at about 20 steps/s, SIGKILLs the daemon that holds the middle pipeline stage (another member when the owner
holds it: the owner is never the victim here), and reads the leader's recovery record. With ``--victim leader``
it SIGKILLs the leader (the job's owner) instead, once the plan's standby holds
the data and a committed checkpoint, and reads the record of the standby that the survivors elected. Prints, per
preset: kill -> detected (membership), detected -> first step (replan, re-slice, restart
workers; and where that time went: planned (members reached, links measured, plan made), sliced (the checkpoint
re-sliced in a child), started (every worker listening), went (every device told to go), resume (go -> first
step)), the total against the issue's target, the steps recomputed (at most the checkpoint interval), and the
total as a ratio of this run's own cold start (submit -> first step), since absolute times drift on a shared box.

    python bench/recovery.py [--quick] [--presets local lan] [--victim middle|leader] [--model mlp|llama]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arceusd.cli.swarm import LocalSwarm

DATA = Path(__file__).resolve().parents[1] / "data"  # the repository's own data sets
TARGET_S = {"local": 5.0, "lan": 15.0}
INTERVAL = 20
SPEC = """
name = "recovery-bench"
seed = 1
[model]
type = "mlp"
layer_sizes = [784, 128, 64, 10]
[data]
kind = "mnist"
dir = "{mnist}"
train_count = 8000
holdout_count = 500
[training]
steps = {steps}
batch_size = 64
micro_batches = 2
optimizer = "sgd"
lr = 0.05
momentum = 0.9
eval_interval_steps = 0
[checkpoint]
interval_steps = {interval}
"""
# ``--model llama``: a stock transformers Llama (the library's own decoder layers, built in the workers, which then
# import transformers too) on Tiny Shakespeare through the shipped BPE tokenizer.
LLAMA_SPEC = """
name = "recovery-bench-llama"
seed = 1
[model]
type = "hf"
config = "{examples}/llama-tiny.config.json"
block_size = 64
[data]
kind = "tokens"
path = "{data}/tinyshakespeare/input.txt"
tokenizer = "{data}/tokenizers/shakespeare-bpe.json"
format = "text"
val_fraction = 0.1
[training]
steps = {steps}
batch_size = 8
micro_batches = 2
optimizer = "adamw"
lr = 1e-3
eval_interval_steps = 0
[checkpoint]
interval_steps = {interval}
"""
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def spec_text(model: str, steps: int) -> str:
    """The bench's job: the MNIST MLP, or a tiny stock Llama (``model == "llama"``)."""
    if model == "llama":
        return LLAMA_SPEC.format(examples=EXAMPLES, data=DATA, steps=steps, interval=INTERVAL)
    return SPEC.format(mnist=DATA / "mnist", steps=steps, interval=INTERVAL)


def poll(fn: Any, timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def pick_victim(plan: dict[str, Any], owner: str, standby: str | None) -> str:
    """The member to SIGKILL: the middle stage's device when that is not the owner (plans follow measured links
    and may put the owner there), else another plan device that is neither the owner nor, if possible, the
    standby."""
    stages = plan["stages"]
    middle = [d["peer_id"] for d in stages[len(stages) // 2]["devices"]]
    devices = [d["peer_id"] for stage in stages for d in stage["devices"]]
    for candidates in (middle, [p for p in devices if p != standby], devices):
        for peer in candidates:
            if peer != owner:
                return str(peer)
    raise ValueError("the plan has no device but the owner's: nothing to kill but the leader (use --victim leader)")


def one_run(root: Path, preset: str, kill_at: int, victim_role: str = "middle", model: str = "mlp") -> dict[str, Any]:
    spec = root / "job.toml"
    spec.write_text(spec_text(model, kill_at + 8 * INTERVAL))
    swarm = LocalSwarm(
        root / "swarm", 3, ["--auto-join"], preset=preset, env={"ARCEUSD_FAILPOINTS": "worker.step=sleep:0.05"}
    )
    try:
        swarm.start()
        poll(
            lambda: all(sum(p["state"] == "alive" for p in swarm.call(i, "peers")) == 2 for i in range(3)),
            60,
            "the swarm to converge",
            0.2,
        )
        submitted = time.time()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "arceusd",
                "--state-dir",
                str(swarm.state_dir(0)),
                "submit",
                str(spec),
                "--members",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        job_id = out.stdout.split()[2]

        def job(i: int = 0) -> dict[str, Any]:
            result: dict[str, Any] = swarm.call(i, "job", {"job_id": job_id})
            return result

        poll(lambda: job()["step"] >= 1, 180, "the first step")
        cold = time.time() - submitted
        first = poll(lambda: (j := job())["step"] >= kill_at and j["committed_step"] > 0 and j, 180, "steps")
        reader = 0
        if victim_role == "leader":
            index = 0
            reader = next(i for i in range(3) if swarm.call(i, "status")["peer_id"] == first["standby"])
            poll(lambda: (j := job(reader))["standby_ready"] and j["committed_step"] > 0, 60, "the standby's copy")
        else:
            owner = swarm.call(0, "status")["peer_id"]
            victim = pick_victim(first["plan"], owner, first.get("standby"))
            index = next(i for i in range(3) if swarm.call(i, "status")["peer_id"] == victim)
        killed = time.time()
        swarm.signal(index, signal.SIGKILL)
        rec = poll(
            lambda: (r := job(reader)["recoveries"]) and r[-1]["first_step_at"] and r[-1], 120, "the resumed step"
        )
        return {
            "cold_s": cold,
            "detect_s": rec["began_at"] - killed,
            "restart_s": rec["first_step_after_s"],
            "total_s": rec["first_step_at"] - killed,
            "recomputed": rec["recomputed_steps"],
            "lost_step": rec["lost_step"],
            **_phases(rec),
            "detail": _detail(swarm, index, killed),
        }
    finally:
        swarm.close()


PHASES = ("planned", "checked", "sliced", "started", "went")
DETAIL = ("re-sliced in", "listening", "ran arceusd")
"""The daemons' own log lines on where a re-slice and each worker start went (after the kill)."""


def _detail(swarm: LocalSwarm, victim: int, killed: float) -> list[str]:
    """Each surviving daemon's log lines of :data:`DETAIL` written after the kill (wall clock)."""
    out = []
    for i in range(3):
        if i == victim:
            continue
        for line in (swarm.state_dir(i) / "arceusd.log").read_text(errors="replace").splitlines():
            try:
                at = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1e3
            except ValueError:
                continue
            if at >= killed - 1 and any(d in line for d in DETAIL):
                out.append(f"daemon {i}: {line[24:].split(': ', 1)[-1]}")
    return out


def _phases(rec: dict[str, Any]) -> dict[str, float]:
    """Each start phase's own duration (the record holds when each ended, from detection), and the resume:
    go -> first step."""
    ends = rec.get("phases") or {}
    out: dict[str, float] = {}
    last = 0.0
    for phase in PHASES:
        if phase in ends:
            out[phase] = float(ends[phase]) - last
            last = float(ends[phase])
    out["resume"] = float(rec["first_step_after_s"]) - last
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run per preset (default: three)")
    parser.add_argument("--presets", nargs="+", default=["local", "lan"], choices=sorted(TARGET_S))
    parser.add_argument(
        "--victim",
        choices=["middle", "leader"],
        default="middle",
        help="whose daemon to SIGKILL: the middle stage's, or the leader's (the standby takes over)",
    )
    parser.add_argument(
        "--model",
        choices=["mlp", "llama"],
        default="mlp",
        help="the job: the MNIST MLP, or a tiny stock transformers Llama (heavier worker imports)",
    )
    args = parser.parse_args()
    runs = 1 if args.quick else 3
    whose = (
        "a member's daemon (the middle stage's, never the owner's)"
        if args.victim == "middle"
        else "the leader's daemon (the owner)"
    )
    job = "MLP on MNIST" if args.model == "mlp" else "a tiny transformers Llama on Tiny Shakespeare"
    print(
        f"recovery after SIGKILL of {whose} (3 daemons, {job}, checkpoint every "
        f"{INTERVAL} steps); {runs} run(s) per preset"
    )
    ok = True
    for preset in args.presets:
        results = []
        for r in range(runs):
            with tempfile.TemporaryDirectory(prefix="arceus-recovery-") as tmp:
                results.append(
                    one_run(Path(tmp), preset, kill_at=30 + 7 * r, victim_role=args.victim, model=args.model)
                )
        for res in results:
            met = res["total_s"] <= TARGET_S[preset] and res["recomputed"] <= INTERVAL
            ok = ok and met
            print(
                f"  {preset:<5} kill->detected {res['detect_s']:5.2f} s  detected->first step "
                f"{res['restart_s']:5.2f} s  total {res['total_s']:5.2f} s (target {TARGET_S[preset]:.0f} s, "
                f"{res['total_s'] / TARGET_S[preset]:.2f}x of it; {res['total_s'] / res['cold_s']:.2f}x this "
                f"run's cold start of {res['cold_s']:.1f} s)  recomputed {res['recomputed']} steps "
                f"(<= {INTERVAL})  {'ok' if met else 'MISSED'}"
            )
            where = ", ".join(f"{p} {res[p]:.2f} s" for p in (*PHASES, "resume") if p in res)
            print(f"        after detection: {where}")
            for line in res["detail"]:
                print(f"          {line[:220]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
