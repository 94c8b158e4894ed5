"""A GPU machine in a swarm (issue 30, item 8), with real daemons on loopback.

- On any machine: a daemon's device line names its GPU and memory once its device is measured (here: a measured
  profile naming an H100, cached as ``device_profile.json``), and reaches its peers' ``arceusd peers`` then (the
  hello is sent again), and its own ``arceusd status``.
- With CUDA (``cuda`` in the id: ``bench/gpu_check.sh`` runs ``-k cuda``): two daemons on the one GPU machine,
  one lending the GPU and one the CPU only (``devices = ["cpu"]``); a job submitted to the GPU daemon is planned on
  the GPU alone (the CPU would only slow the step: issue 31) and ends done. With ``ARCEUS_GPU_OUT`` set, the
  daemons' ``peers`` and ``status`` are written there (``bench/gpu_check.sh`` keeps them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from arceusd.cli.swarm import PROFILE_ENV, LocalSwarm
from arceusd.device.profile import CACHE_FILE, CACHE_VERSION, DeviceMeasurement
from tests.harness import run_cli
from tests.integration.test_recovery import wait_end

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(state_dir, *args, timeout=120)


def write_profile(state: Path, found: list[DeviceMeasurement]) -> None:
    """A measurement of ``found`` taken now at one torch thread (the daemons' default), as the probe caches it."""
    now = time.time()
    data = {
        "version": CACHE_VERSION,
        "measured_at": now,
        "devices": [dataclasses.asdict(dataclasses.replace(d, measured_at=now)) for d in found],
    }
    state.mkdir(parents=True, exist_ok=True)
    (state / CACHE_FILE).write_text(json.dumps(data))


def wait_output(state: Path, args: tuple[str, ...], text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = cli(state, *args).stdout
        if text in out:
            return out
        time.sleep(0.25)
    raise AssertionError(f"`arceusd {' '.join(args)}` did not show {text!r} within {timeout} s:\n{out}")


CPU = DeviceMeasurement("cpu", 4e10, 100 * GIB, 1, "cpu", 0.0, 0.6, 2e-4, 5e-9, 2e-9)
GPU = DeviceMeasurement("cuda", 2.5e13, 79 * GIB + 5, 1, H100, 0.0, 0.3, 1e-3, 1e-10, 5e-11)


@pytest.mark.timeout(180)
def test_peers_and_status_name_a_daemons_gpu_once_it_is_measured(tmp_path: Path) -> None:
    swarm = LocalSwarm(tmp_path, 2, env={PROFILE_ENV: ""})  # no shared profile: node 1 starts unmeasured
    write_profile(swarm.state_dir(0), [CPU])
    gpu_line = f"cuda {H100} 79 GiB"
    with swarm:
        swarm.wait_converged(60)
        peers = cli(swarm.state_dir(0), "peers")
        assert peers.returncode == 0 and "cores" in peers.stdout and gpu_line not in peers.stdout, peers.stdout
        write_profile(swarm.state_dir(1), [CPU, GPU])  # its GPU measured (here: a measured-like profile)
        swarm.call(1, "lending", {})  # the daemon reads its offer: the probe finds the measurement
        shown = wait_output(swarm.state_dir(0), ("peers",), gpu_line, 30)
        peer_1 = swarm.call(1, "status")["peer_id"]
        assert any(peer_1[:12] in line and gpu_line in line for line in shown.splitlines()), shown
        status = cli(swarm.state_dir(1), "status").stdout
        assert any(line.startswith("  device ") and gpu_line in line for line in status.splitlines()), status
        own = swarm.call(0, "status")["device"]
        assert "cores" in own and "cuda" not in own, own


SPEC = f"""# A GPT that keeps a GPU busy for a moment and a CPU core for long: the plan should leave the CPU out.
name = "gpu-beside-cpu"
seed = 3

[model]
type = "gpt"
n_layer = 4
n_head = 4
n_embd = 256
block_size = 128
vocab_size = "auto"

[data]
kind = "text"
path = "{ROOT / "data/tinyshakespeare/input.txt"}"
val_fraction = 0.1

[training]
steps = 30
batch_size = 16
micro_batches = 2
optimizer = "adamw"
lr = 1e-3
eval_interval_steps = 30
eval_iters = 2

[checkpoint]
interval_steps = 30
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on this machine)")
def test_cuda_daemon_beside_a_cpu_daemon_trains_alone(tmp_path: Path) -> None:
    spec = tmp_path / "gpu-beside-cpu.toml"
    spec.write_text(SPEC)
    swarm = LocalSwarm(tmp_path / "swarm", 2, ["--auto-join"], preset="lan")
    swarm.state_dir(1).mkdir(parents=True)
    (swarm.state_dir(1) / "config.toml").write_text('devices = ["cpu"]\n')  # the CPU only, on the GPU machine
    with swarm:
        swarm.wait_converged(120)
        submitted = cli(swarm.state_dir(0), "submit", str(spec), "--members", "2")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        end = wait_end(swarm, job_id, timeout=240)
        gpu_peer, cpu_peer = (swarm.call(i, "status")["peer_id"] for i in range(2))
        placed = {d["peer_id"] for st in end["plan"]["stages"] for d in st["devices"]}
        report = {
            "state": end["state"],
            "step": end["step"],
            "plan": end["plan"],
            "members": end["members"],
            "peers": cli(swarm.state_dir(0), "peers").stdout,
            "status_gpu": cli(swarm.state_dir(0), "status").stdout,
            "status_cpu": cli(swarm.state_dir(1), "status").stdout,
            "job": cli(swarm.state_dir(0), "status", job_id).stdout,
        }
        out = os.environ.get("ARCEUS_GPU_OUT")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            for name in ("peers", "status_gpu", "status_cpu", "job"):
                (Path(out) / f"{name}.txt").write_text(str(report[name]))
        print(json.dumps({k: v for k, v in report.items() if k != "plan"}, indent=1))
        assert end["state"] == "done" and end["step"] == 30, end
        assert placed == {gpu_peer}, f"the GPU alone: {end['plan']}"
        assert cpu_peer in end["members"], "the CPU daemon joined (a spare)"
        assert "cuda" in swarm.call(0, "status")["device"], "the GPU daemon's line names its GPU"
        assert "cuda" not in swarm.call(1, "status")["device"], "the CPU-only daemon lends no GPU"
