"""Data-parallel replicas through real daemons (issue 22): submit a spec that asks for replicas, and the leader
plans R pipelines that every member verifies, starts each device's worker in its replica, and commits and exports
the first replica's checkpoint.

Two daemons, ``training.replicas = 2``: every device holds the whole model and trains half of each global batch.
With the gradients averaged every step the exported model equals a plain single-process loop on the whole batch;
with DiLoCo the replicas talk only at outer steps, so each device's ring carries far fewer bytes.
"""

from __future__ import annotations

import json
import math
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arceusd.cli.swarm import LocalSwarm
from tests.harness import wait_for
from tests.integration.test_jobs import cli

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]

STEPS = 24
DILOCO = """
[training.diloco]
inner_steps = 6
compression = "int8"
"""


def _log_lines(s: LocalSwarm, *words: str) -> list[str]:
    """The lines of every daemon's log holding one of ``words`` (what a failed assertion shows of the daemons'
    side: a CI run keeps no files)."""
    out = []
    for i in range(len(s.procs)):
        log = s.state_dir(i) / "arceusd.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        out += [f"{i}: {line[:300]}" for line in text.splitlines() if any(w in line for w in words)]
    return out[-80:]


def _spec(tmp: Path, name: str, sync: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f"""
name = "{name}"
seed = 7

[model]
type = "mlp"
layer_sizes = [784, 64, 10]

[data]
kind = "mnist"
dir = "{ROOT / "data" / "mnist"}"
train_count = 8000
holdout_count = 2000

[training]
steps = {STEPS}
batch_size = 64
micro_batches = 2
optimizer = "sgd"
lr = 0.05
momentum = 0.9
replicas = 2
sync = "{sync}"
{DILOCO if sync == "diloco" else ""}
[checkpoint]
interval_steps = 12
""")
    return path


@pytest.fixture
def swarm2(tmp_path: Path) -> Iterator[LocalSwarm]:
    with LocalSwarm(tmp_path / "swarm", 2, ["--auto-join"], preset="lan") as s:
        yield s


def _run(s: LocalSwarm, spec: Path, timeout: float = 240) -> dict[str, Any]:
    submitted = cli(s.state_dir(0), "submit", str(spec), "--members", "2")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = s.call(0, "job", {"job_id": job_id, "history": "all"})
        if job["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert job["state"] == "done", f"job ended {job['state']}: {job['error']}"
    return job


def _member_ring_bytes(s: LocalSwarm, job_id: str) -> int:
    return int(s.call(1, "job", {"job_id": job_id})["ring_bytes"])


@pytest.mark.timeout(600)
def test_two_replicas_through_daemons_equal_one_process_and_diloco_talks_less(
    swarm2: LocalSwarm, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from arceusd.jobs.spec.schema import parse_spec
    from tests.integration.worker_harness import reference_run

    ids = {swarm2.call(i, "status")["peer_id"] for i in range(2)}
    spec_path = _spec(tmp_path, "replicas-allreduce", "every_step")
    job = _run(swarm2, spec_path)
    plan = job["plan"]
    assert plan["sync"] == "allreduce" and len(plan["replicas"]) == 2, plan
    placed = [{d["peer_id"] for st in r["stages"] for d in st["devices"]} for r in plan["replicas"]]
    assert placed[0] | placed[1] == ids and not placed[0] & placed[1], "each daemon is one whole replica"
    shares = {c["peer_id"]: c["share"] for c in job["contributions"]}
    assert set(shares) == ids and all(abs(v - 0.5) < 1e-3 for v in shares.values()), shares
    allreduce_bytes = _member_ring_bytes(swarm2, job["job_id"])
    # the other replica's device is paid for both commits, by its witness matching the shards; the owner's own
    # device is not billed to the owner (issue 31)
    assert job["refused_reports"] == {} and job["excluded"] == {}, job

    def paid() -> list[dict[str, Any]] | None:
        earned = [json.loads(cli(swarm2.state_dir(i), "earnings", "--json").stdout) for i in range(2)]
        return earned if earned[1]["by_job"].get(job["job_id"], 0.0) > 0 else None

    earned = wait_for(paid, 60, 1.0, "the other replica's device earned for the job")
    assert job["job_id"] not in earned[0]["by_job"], earned[0]
    # paid for its half of the work (equal shares): its receipts' FLOPs are its contribution's
    member = next(c for c in job["contributions"] if c["peer_id"] != job["owner"])
    assert abs(earned[1]["flops"] - member["tflop"] * 1e12) <= max(1e6, 0.01 * member["tflop"] * 1e12), (
        earned[1],
        member,
    )
    assert allreduce_bytes > 0, "the member's worker sent its gradients to the other replica"

    # The first replica's checkpoint, exported, is one process's training on the whole global batch.
    spec = parse_spec(tomllib.loads(spec_path.read_text()), base_dir=spec_path.parent)
    _, reference = reference_run(spec, STEPS)
    exported = load_file(job["model_path"])
    assert set(exported) == set(reference)
    worst = max(float((exported[k] - reference[k]).abs().max()) for k in reference)
    assert worst < 1e-4, f"exported model differs from one process by {worst:.2e}"
    description = json.loads((Path(job["model_path"]).parent / "model.json").read_text())
    assert description["step"] == STEPS

    # DiLoCo, H = 6: the same job talks only at its 4 outer steps, int8.
    diloco = _run(swarm2, _spec(tmp_path, "replicas-diloco", "diloco"))
    assert diloco["plan"]["sync"] == "diloco" and diloco["plan"]["diloco_h"] == 6, diloco["plan"]
    diloco_bytes = _member_ring_bytes(swarm2, diloco["job_id"])
    assert diloco["refused_reports"] == {} and diloco["excluded"] == {}, diloco  # the outer states agreed
    print(
        f"replicas: exported vs one process {worst:.2e}; ring bytes all-reduce {allreduce_bytes}, "
        f"DiLoCo {diloco_bytes} ({allreduce_bytes / max(diloco_bytes, 1):.1f}x fewer)"
    )
    assert 0 < diloco_bytes * 10 < allreduce_bytes, (diloco_bytes, allreduce_bytes)
    assert diloco["val_accuracy"] is not None and diloco["val_accuracy"] > 0.5
    assert not torch.isnan(torch.tensor(diloco["loss"]))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sync", ["every_step", "diloco"])
def test_a_killed_replica_device_drops_its_replica_and_the_other_trains_on_then_a_spare_rebuilds_it(
    tmp_path: Path, sync: str
) -> None:
    """Three daemons, two replicas of one device each (the third waits): SIGKILL the other replica's device once
    a checkpoint is committed. The leader drops that replica and its own trains on without a restart (same plan
    epoch, same worker process, steps going on past the kill), holds after the next checkpoint, and the spare
    device rebuilds the second replica from that checkpoint; the ring grows back and the job ends done with a
    sound model, never repartitioned. With DiLoCo the ring is idle between outer steps: the one after the kill is
    redone over the smaller ring."""
    import signal

    from tests.integration.test_recovery import index_of, job_of, wait_end, wait_step

    spec = tmp_path / "replicas-drop.toml"
    spec.write_text(
        _spec(tmp_path, "replicas-drop", sync)
        .read_text()
        .replace(f"steps = {STEPS}", "steps = 300")
        .replace("interval_steps = 12", "interval_steps = 100")
    )
    with LocalSwarm(tmp_path / "swarm", 3, ["--auto-join"], preset="local") as s:
        submitted = cli(s.state_dir(0), "submit", str(spec), "--members", "3")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        job = wait_step(s, job_id, 105, timeout=180, committed=100)
        replicas = job["plan"]["replicas"]
        assert len(replicas) == 2
        placed = {d["peer_id"] for r in replicas for st in r["stages"] for d in st["devices"]}
        victim = next(p for p in placed if p != job["owner"])
        spare = next(p for p in job["members"] if p not in placed)
        spare_index = index_of(s, spare)
        s.signal(index_of(s, victim), signal.SIGKILL)
        deadline = time.monotonic() + 120
        dropped: dict[str, Any] = {}
        while time.monotonic() < deadline:
            dropped = job_of(s, job_id)
            if dropped["dropped_replicas"] and dropped["step"] > dropped["dropped_replicas"][0]["step"]:
                break
            assert dropped["state"] == "running", dropped
            time.sleep(0.05)
        assert dropped["dropped_replicas"], dropped
        drop = dropped["dropped_replicas"][0]
        assert drop["devices"] == [victim] and drop["replicas_left"] == 1 and drop["step"] >= 105, drop
        # the owner's replica went on: no repartition, the same plan epoch and worker process
        assert dropped["committed_step"] == 100, "the next commit came before the test looked: a longer interval"
        assert dropped["recoveries"] == [] and dropped["epoch"] == job["epoch"], dropped
        assert dropped["worker_pid"] == job["worker_pid"] and dropped["state"] == "running"
        assert "replicas" not in dropped["plan"], dropped["plan"]  # one pipeline left: the owner's
        assert [d["peer_id"] for st in dropped["plan"]["stages"] for d in st["devices"]] == [job["owner"]]
        end = wait_end(s, job_id, timeout=300)
        assert end["state"] == "done", end
        # the owner's replica held after checkpoint 200; once it was committed the spare rebuilt the second replica
        # from it, and the ring grew back: still no repartition, the owner's worker never restarted
        assert "replicas" in end["plan"], (
            "the dropped replica was never rebuilt",
            end["rebuilt_replicas"],
            _log_lines(s, "replica", "rebuil", "hold", "dead", "suspect"),
        )
        final = {d["peer_id"] for r in end["plan"]["replicas"] for st in r["stages"] for d in st["devices"]}
        assert final == {job["owner"], spare}, end["plan"]
        assert end["rebuilt_replicas"] == [{"step": 200, "devices": [spare]}], end["rebuilt_replicas"]
        assert end["recoveries"] == [] and end["epoch"] == job["epoch"], end["recoveries"]
        spare_view = job_of(s, job_id, spare_index)
        assert spare_view["state"] == "done" and spare_view["ring_bytes"] > 0, spare_view
        # the ledger follows: the spare is credited for the steps after the rebuild, the lost device not after it
        steps = {c["peer_id"]: c["steps"] for c in end["contributions"]}
        assert steps[job["owner"]] == 300 and steps[spare] == 100 and steps[victim] < 200, steps
        assert end["val_accuracy"] is not None and math.isfinite(end["loss"])
        if sync == "every_step":  # (DiLoCo over SGD with momentum drifts on this spec even without a failure)
            assert end["val_accuracy"] > 0.8, end


@pytest.mark.timeout(600)
def test_a_lost_device_of_the_owners_replica_retires_the_owners_worker_and_the_other_replica_trains_on(
    tmp_path: Path,
) -> None:
    """Four daemons lending 8 MiB each: two replicas of two stages. SIGKILL the owner's partner in its replica:
    the leader drops its own replica; its worker, whose links broke, retires and serves the other replica's data
    to the end; that replica trains on and writes the checkpoints. No repartition, and the job ends done."""
    import signal

    from tests.integration.test_recovery import index_of, job_of, wait_end, wait_step

    spec = tmp_path / "replicas-retire.toml"
    spec.write_text(
        _spec(tmp_path, "replicas-retire", "every_step")
        .read_text()
        .replace("layer_sizes = [784, 64, 10]", "layer_sizes = [784, 512, 512, 10]")
        .replace(f"steps = {STEPS}", "steps = 300")
        .replace("interval_steps = 12", "interval_steps = 100")
    )
    with LocalSwarm(tmp_path / "swarm", 4, ["--auto-join", "--lend-memory-mib", "8"], preset="local") as s:
        submitted = cli(s.state_dir(0), "submit", str(spec), "--members", "4")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        job = wait_step(s, job_id, 105, timeout=240, committed=100)
        replicas = [[d["peer_id"] for st in r["stages"] for d in st["devices"]] for r in job["plan"]["replicas"]]
        assert sorted(len(r) for r in replicas) == [2, 2], replicas
        own = next(r for r in replicas if job["owner"] in r)
        other = next(r for r in replicas if job["owner"] not in r)
        partner = next(p for p in own if p != job["owner"])
        watcher = index_of(s, other[0])
        s.signal(index_of(s, partner), signal.SIGKILL)
        end = wait_end(s, job_id, timeout=300)
        assert end["state"] == "done", end
        assert [d["devices"] for d in end["dropped_replicas"]] == [own], end["dropped_replicas"]
        assert end["recoveries"] == [] and end["epoch"] == job["epoch"], end["recoveries"]
        final = [d["peer_id"] for st in end["plan"]["stages"] for d in st["devices"]]
        assert final == other and "replicas" not in end["plan"], end["plan"]  # the owner's worker only served data
        assert end["step"] == 300 and end["model_path"], end
        member = job_of(s, job_id, watcher)
        assert member["state"] == "done" and member["val_accuracy"] > 0.8, member
        # the ledger follows: the replica that trained on is credited for every step (from its reports once the
        # leader's own worker retired), the dropped one only until the drop
        steps = {c["peer_id"]: c["steps"] for c in end["contributions"]}
        assert all(steps[p] == 300 for p in other) and all(steps[p] < 200 for p in own), steps
