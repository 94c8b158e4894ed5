"""The jobs the job attacks train and the swarms they train on, shared by ``tests/adversarial/test_job_hostile.py``
and ``bench/adversarial.py --jobs``: the MLP spec of wide layers (:func:`big_spec`), the spec of two replicas
(:func:`replicas_spec`, with DiLoCo that computes what one process does: :data:`DILOCO_EXACT`), a
:class:`HostileSwarm`'s per-daemon lent memory and measured speed (:func:`prepare`), where the witness attacks'
swarms put the attacker (:data:`WITNESS_PLACES`, :data:`DILOCO_PLACES`), and the devices of a plan
(:func:`placed`, :func:`replica_of`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.adversarial.hostile_job import HostileSwarm
from tests.integration.test_recovery import write_spec


def big_spec(tmp_path: Path, steps: int, interval: int, width: int, batch: int, calm: bool = False) -> Path:
    """The MLP spec with three hidden layers of ``width`` and batches of ``batch`` (a lie about speed shows above
    the overheads only on a model whose steps take a good part of a second).

    ``calm``: SGD at lr 0.02, momentum 0.5 instead of 0.05 and 0.9, for a test that compares the result with the
    failure-free run closely. At 0.05/0.9 and width 512, training is chaotic in its first 50 steps: a 1e-7
    relative change of the weights at step 20 (what another plan's matmul split does) moves the weights at step
    100 by 5e-3, more than a lost step at step 90 does (3e-3), so no tolerance told a rounding from a lost step
    and a run failed in CI at 1e-4 (3.5e-3). Calm: rounding 5e-5, a lost step at least 8e-4 (measured with the
    reference loop of ``tests.integration.worker_harness``)."""
    spec = write_spec(tmp_path, steps=steps, interval=interval)
    text = spec.read_text().replace(
        "layer_sizes = [784, 64, 32, 10]", f"layer_sizes = [784, {width}, {width}, {width}, 10]"
    )
    if calm:
        text = text.replace("lr = 0.05\nmomentum = 0.9", "lr = 0.02\nmomentum = 0.5")
        assert "momentum = 0.5" in text
    spec.write_text(text.replace("batch_size = 64", f"batch_size = {batch}"))
    assert f"{width}, {width}" in spec.read_text() and f"batch_size = {batch}" in spec.read_text()
    return spec


DILOCO_EXACT = """
[training.diloco]
inner_steps = 1
outer_lr = 1.0
outer_momentum = 0.0
compression = "none"
"""
"""DiLoCo that computes what one process does (so a run with an exclusion can be held to the failure-free run):
one inner SGD step without momentum from the anchor on each replica's part of the global batch, then an outer
step of lr 1 without momentum sets the anchor to the replicas' mean, the full batch's SGD step. The witness is
still the outer anchor and momentum (the last pseudo-gradient), not the shard's bytes."""


def replicas_spec(tmp_path: Path, steps: int, layers: str, sync: str = "every_step", interval: int = 20) -> Path:
    """The MLP spec with two replicas (``sync``: ``every_step`` or ``diloco``, then :data:`DILOCO_EXACT`) and
    ``layers`` (``"[784, 64, 10]"``) for its layer sizes."""
    spec = write_spec(tmp_path, steps=steps, interval=interval)
    text = spec.read_text().replace("[training]\n", f'[training]\nreplicas = 2\nsync = "{sync}"\n')
    if sync == "diloco":
        text = text.replace("momentum = 0.9", "momentum = 0.0") + DILOCO_EXACT
    spec.write_text(text.replace("layer_sizes = [784, 64, 32, 10]", f"layer_sizes = {layers}"))
    assert f"layer_sizes = {layers}" in spec.read_text()
    return spec


@dataclass(frozen=True)
class Placement:
    """A swarm whose plan puts the attacker (daemon 2) where a witness case needs it: ``arg``, how many times its
    speed it offers; ``lend_mib``, each daemon's ``lend_memory_mib``; ``faster``, daemon index -> how many times
    the swarm's shared measurement of this machine its own says it computes (an honest offer: a plan that does not
    hang on peer ids' order); ``replica``: the attacker's replica in the first plan (None: any)."""

    arg: str
    lend_mib: tuple[int, ...]
    faster: Mapping[int, float] = field(default_factory=dict)
    replica: int | None = None

    @property
    def size(self) -> int:
        return len(self.lend_mib)


WITNESS_PLACES = {
    1: Placement("3", (4, 4, 3, 3), {1: 1.5}, replica=1),
    0: Placement("1.2", (4, 4, 3, 3), {1: 1.5, 3: 1.5}, replica=0),
}
"""Two replicas of two places on four daemons, on ``[784, 256, 256, 10]`` (its training state needs about 4.3 MiB,
its first layer 3.8): a 4 MiB device at the first layer of each replica, the attacker (3 MiB) at the rest, dealt as
in :data:`DILOCO_PLACES` without the spare. (Without daemon 1's 1.5x the plan hung on the peer ids' order: dealt by
speed, it put the attacker in the first replica when daemon 3's id was the smallest, else by memory in the
second.)"""

DILOCO_PLACES = {
    1: Placement("3", (4, 4, 3, 3, 3), {1: 1.5}, replica=1),
    0: Placement("1.2", (4, 4, 3, 3, 3), {1: 1.5, 3: 1.5}, replica=0),
}
"""Two replicas of two stages on five daemons lending 4/4/3/3/3 MiB (the first layer needs a 4): the plan deals
the four fastest into replicas by memory (a 4 and a 3 MiB device each; dealt by speed, a replica of two 3s holds
no first layer), snake-wise: the faster 4 (daemon 1, 1.5x) with the slower of the two 3s chosen, the leader with
the faster 3; the attacker is at the second stage either way (a place the leader never holds) and the fifth
daemon a spare. By the attacker's replica: 1, it offers 3x (the faster 3: the leader's replica); 0, it offers 1.2x
and daemon 3 measures itself 1.5x (the faster 3), so the attacker is dealt beside daemon 1 into the first
replica, whose shards are the ones committed."""


def prepare(s: HostileSwarm, lend_mib: tuple[int, ...] = (), faster: Mapping[int, float] | None = None) -> None:
    """Before ``s.start()``: daemon ``i`` lends ``lend_mib[i]`` MiB and says it computes ``faster[i]`` times the
    swarm's shared measurement (see :class:`Placement`)."""
    for i, mib in enumerate(lend_mib):
        s.state_dir(i).mkdir(parents=True, exist_ok=True)
        (s.state_dir(i) / "config.toml").write_text(f"lend_memory_mib = {mib}\n")
    for i, factor in (faster or {}).items():
        s._measure_once()  # the shared profile, which start() copies to the daemons that have none
        assert s.profile is not None, "a faster daemon needs the swarm's shared profile (ARCEUSD_SWARM_PROFILE)"
        measured = json.loads(s.profile.read_text())
        for device in measured["devices"]:
            device["flops_per_s"] *= factor
        s.state_dir(i).mkdir(parents=True, exist_ok=True)
        (s.state_dir(i) / s.profile.name).write_text(json.dumps(measured))


def replica_of(plan: Mapping[str, Any]) -> dict[str, int]:
    """Each placed device's replica in a job view's ``plan`` (0 for a plan of one pipeline)."""
    return {
        d["peer_id"]: k for k, r in enumerate(plan.get("replicas", [plan])) for st in r["stages"] for d in st["devices"]
    }


def placed(plan: Mapping[str, Any]) -> set[str]:
    """The devices a job view's ``plan`` places, in any replica."""
    return set(replica_of(plan))


def place_of(plan: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Each placed device's place (stage, rank) in a job view's plan (cut alike in every replica)."""
    return {
        d["peer_id"]: (i, j)
        for r in plan.get("replicas", [plan])
        for i, st in enumerate(r["stages"])
        for j, d in enumerate(st["devices"])
    }


__all__ = [
    "DILOCO_EXACT",
    "DILOCO_PLACES",
    "WITNESS_PLACES",
    "Placement",
    "big_spec",
    "place_of",
    "placed",
    "prepare",
    "replica_of",
    "replicas_spec",
]
