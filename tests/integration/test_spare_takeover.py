"""A spare outlives its leader (issue 31), with real daemons: four daemons each lending 5 MiB train a GPT whose
training state needs 11 MiB (the model of :mod:`tests.integration.test_memory_fit_jobs`), so a plan
needs three of them; the fourth says it computes 50x slower than the others, so the plan leaves it out: a spare.
The owner (the leader) is SIGKILLed after a commit its standby holds. The two planned survivors elect the
standby; two devices cannot hold the model, so the job goes on only if the new leader still leads the spare (the
old leader synced it the spare's offer; :func:`arceusd.jobs.plans.standby.takeover_offers` keeps it, and the spare
takes the start of the standby its gone leader named). The new plan places the spare and the job ends done.

Before (and with ``takeover_offers`` dropping spares) the new leader had two devices and no plan that fits:
the job waited, never trained again: with the standby's ``take_over`` keeping only the old plan's offers this
test fails at the wait for the new plan (checked 28 Nov). On the shared 2-core machine it took 76 s at load 3 and
95 s at load 12.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from arceusd.cli.swarm import LocalSwarm
from tests.harness import wait_for
from tests.integration.test_memory_fit_jobs import SPEC, cli
from tests.integration.test_recovery import index_of, job_of, wait_end

pytestmark = [pytest.mark.slow]

LEND_MIB = 5
"""Each daemon's lent memory: two hold 10 MiB, less than the model's 11; three hold it with room to split it."""
SLOWER = 50.0
"""How much slower than the swarm's shared measurement the spare's daemon says it computes."""


def placed(view: dict[str, Any]) -> set[str]:
    return {d["peer_id"] for st in view["plan"]["stages"] for d in st["devices"]}


@pytest.mark.timeout(420)
def test_the_new_leader_places_the_old_leaders_spare(tmp_path: Path) -> None:
    began = time.monotonic()
    spec = tmp_path / "spare.toml"
    spec.write_text(
        SPEC.replace("\nsteps = 12\n", "\nsteps = 60\n")
        .replace("\ninterval_steps = 12\n", "\ninterval_steps = 10\n")
        .replace("\neval_interval_steps = 12\n", "\neval_interval_steps = 60\n")
    )
    swarm = LocalSwarm(
        tmp_path / "swarm",
        4,
        ["--auto-join", "--lend-memory-mib", str(LEND_MIB)],
        preset="lan",
        env={"ARCEUSD_FAILPOINTS": "worker.step=sleep:0.2"},  # time to kill the leader between two commits
    )
    swarm.root.mkdir(parents=True)
    swarm._measure_once()  # the shared profile, which start() copies to the daemons that have none
    assert swarm.profile is not None, "the spare's slower profile is the swarm's shared one (ARCEUSD_SWARM_PROFILE)"
    measured = json.loads(swarm.profile.read_text())
    for device in measured["devices"]:  # every figure of its speed: compute, each op's dispatch, the optimizer
        device["flops_per_s"] /= SLOWER
        for key in ("dispatch_s", "adamw_s_per_param", "sgd_s_per_param"):
            device[key] = device.get(key, 0.0) * SLOWER
    swarm.state_dir(3).mkdir(parents=True)
    (swarm.state_dir(3) / swarm.profile.name).write_text(json.dumps(measured))
    with swarm as s:
        submitted = cli(s.state_dir(0), "submit", str(spec), "--members", "4")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        spare = str(s.call(3, "status")["peer_id"])

        def ready() -> dict[str, Any] | None:  # a commit the standby confirmed, the slow daemon a spare
            view = job_of(s, job_id)
            shown = {k: view.get(k) for k in ("state", "step", "spares", "standby_step", "members", "standby")}
            shown["placed"] = placed(view) if view.get("plan") else None
            assert view["state"] not in ("done", "failed", "cancelled"), f"{shown} {view['error']}"
            return view if view["spares"] and (view.get("standby_step") or 0) >= 10 else None

        before = wait_for(ready, 180, 0.1, "a commit the standby holds, with a spare")
        assert before["spares"] == [spare] and spare not in placed(before), before["plan"]
        assert len(placed(before)) == 3 and before["leader"] == before["owner"], before["plan"]
        assert job_of(s, job_id, 3)["spare"] is True, "the spare's own daemon says it is one"
        standby = str(before["standby"])
        k = index_of(s, standby)
        s.signal(0, signal.SIGKILL)
        s.wait(0, timeout=10)

        def replanned() -> dict[str, Any] | None:
            view = job_of(s, job_id, k)
            moved = view["leader"] == standby and view["epoch"] > before["epoch"] and view.get("plan")
            return view if moved and spare in placed(view) and view["step"] > view["committed_step"] else None

        after = wait_for(replanned, 120, 0.2, "the standby leads a plan that places the spare, and trains")
        assert placed(after) == set(before["members"]) - {before["owner"]}, after["plan"]
        assert after["spares"] == [], "no member is left out: the model needs all three"
        end = wait_end(s, job_id, timeout=180, index=k)
        assert end["state"] == "done" and end["step"] == 60 and end["model_path"], end
        assert end["leader"] == standby and placed(end) == placed(after), end["plan"]
        shares = {c["peer_id"]: c["steps"] for c in end["contributions"]}
        assert shares.get(spare, 0) > 0, ("the spare is credited for its steps", shares)
    print(f"spare take-over: {time.monotonic() - began:.1f} s")
