"""Bigger than any one device (issue 30, item 7), with real daemons: four daemons each lending 4 MiB train a GPT
whose training state needs about 2.5 x 4 MiB to ``done``, its stages spread over at least three of them; one
daemon alone refuses it at ``submit`` and warns at ``submit --quote``, with the numbers (needed, offered).

On the shared 2-core machine (27 Nov) it took 94 s at load 17 and 103 s at load 9 (that run had a recovery: a
worker's stream handshake closed under the load; the job resumed and ended done): the daemons' start, the
peers' offers and the leader's link measurements and worker starts, not the 12 steps, take the time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arceusd.cli.swarm import LocalSwarm
from tests.integration.test_recovery import wait_end

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEND_MIB = 4
SPEC = f"""# A GPT of ten layers: its training state needs 11 MiB (10.4), about 2.6 x one device's {LEND_MIB} MiB.
name = "bigger-than-one"
seed = 5

[model]
type = "gpt"
n_layer = 10
n_head = 4
n_embd = 64
block_size = 16
vocab_size = "auto"

[data]
kind = "text"
path = "{ROOT / "data/tinyshakespeare/input.txt"}"
val_fraction = 0.1

[training]
steps = 12
batch_size = 4
micro_batches = 4
optimizer = "adamw"
lr = 1e-3
eval_interval_steps = 12
eval_iters = 1

[checkpoint]
interval_steps = 12
"""


DEEP_SPEC = (
    SPEC.replace('name = "bigger-than-one"', 'name = "bigger-with-the-warm-up"')
    .replace("n_layer = 10", "n_layer = 4")
    .replace("block_size = 16", "block_size = 64")
    .replace("batch_size = 4", "batch_size = 16")
    .replace(
        "# A GPT of ten layers: its training state needs 11 MiB (10.4)", "# Four layers of long sequences: 9.2 MiB"
    )
)
"""Activations, not weights: with the pipeline's warm-up (up to 4 micro-batches stashed on a stage) no plan fits
the four devices, with at most 2 in flight one does (``partitioner/cost.py``'s capped 1F1B)."""


def cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arceusd", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(420)
def test_four_devices_train_what_one_device_refuses(tmp_path: Path) -> None:
    began = time.monotonic()
    spec = tmp_path / "bigger.toml"
    spec.write_text(SPEC)
    lend = ["--lend-memory-mib", str(LEND_MIB)]
    with LocalSwarm(tmp_path / "alone", 1, lend, preset="lan") as alone:
        quoted = cli(alone.state_dir(0), "submit", str(spec), "--quote")
        assert quoted.returncode == 0, quoted.stderr
        assert "memory    the model's training state needs 11 MiB" in quoted.stdout, quoted.stdout
        assert f"this device lends {LEND_MIB} MiB and the 0 other device(s)" in quoted.stdout, quoted.stdout
        assert "warning   it cannot be trained on the devices this daemon sees" in quoted.stdout, quoted.stdout
        refused = cli(alone.state_dir(0), "submit", str(spec))
        assert refused.returncode != 0 and refused.stdout == "", refused.stdout
        assert (
            f"the model's training state needs 11 MiB (weights, gradients and optimizer state 10 MiB, "
            f"activations 1 MiB); this device lends {LEND_MIB} MiB and the 0 other device(s) it sees lend 0 MiB, "
            f"{LEND_MIB} MiB in all: it cannot be trained on them."
        ) in refused.stderr, refused.stderr
        assert "--lend-memory-mib" in refused.stderr and alone.call(0, "jobs") == [], "nothing was announced"
        profile = alone.state_dir(0) / "device_profile.json"
    alone_s = time.monotonic() - began

    swarm = LocalSwarm(tmp_path / "swarm", 4, ["--auto-join", *lend], preset="lan")
    for i in range(4):  # the same machine: its measurement (cached a day) spares three more
        swarm.state_dir(i).mkdir(parents=True)
        shutil.copy(profile, swarm.state_dir(i) / "device_profile.json")
    with swarm:
        quoted = cli(swarm.state_dir(0), "submit", str(spec), "--quote")
        assert f"the 3 other device(s) it sees lend {3 * LEND_MIB} MiB, {4 * LEND_MIB} MiB in all" in quoted.stdout, (
            quoted.stdout
        )
        assert "warning   it cannot" not in quoted.stdout, quoted.stdout
        submitted = cli(swarm.state_dir(0), "submit", str(spec), "--members", "4")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        end = wait_end(swarm, job_id, timeout=180)
        assert end["state"] == "done" and end["step"] == 12 and end["model_path"], end
        placed = [d["peer_id"] for st in end["plan"]["stages"] for d in st["devices"]]
        assert len(set(placed)) >= 3, end["plan"]  # no two devices hold it (the plan may leave a 4th out: issue 31)
        assert end["plan"]["in_flight_cap"] == 0, end["plan"]  # weights: the warm-up's stashes fit
        # a model whose activations need fewer micro-batches in flight: planned so, and trained to the end
        deep = tmp_path / "deep.toml"
        deep.write_text(DEEP_SPEC)
        quoted = cli(swarm.state_dir(0), "submit", str(deep), "--quote", "--members", "4")
        assert "at most 2 micro-batch(es) in flight to fit memory" in quoted.stdout, quoted.stdout
        submitted = cli(swarm.state_dir(0), "submit", str(deep), "--members", "4")
        assert submitted.returncode == 0, submitted.stderr
        end = wait_end(swarm, submitted.stdout.split()[2], timeout=180)
        assert end["state"] == "done" and end["step"] == 12 and end["model_path"], end
        assert end["plan"]["in_flight_cap"] == 2 and end["plan"]["schedule"] == "1f1b", end["plan"]
        shown = cli(swarm.state_dir(0), "status", end["job_id"])
        assert "at most 2 in flight, to fit memory" in shown.stdout, shown.stdout
    print(f"alone: {alone_s:.1f} s; four daemons to done: {time.monotonic() - began - alone_s:.1f} s")
