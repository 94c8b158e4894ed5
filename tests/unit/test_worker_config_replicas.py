"""The worker config's data-parallel replica layout: round trip, the ring of a worker, and refusals."""

from __future__ import annotations

import json

import pytest

from arceusd.worker.protocol import MemberConfig, ReplicaSyncConfig, StageConfig, WorkerConfig, WorkerProtocolError


def _replica(rep: int) -> tuple[StageConfig, ...]:
    return tuple(StageConfig(2 * s, 2 * s + 2, (MemberConfig(f"{rep:016x}{s:016x}"),)) for s in range(2))


def _config(replicas: int = 2, me: tuple[int, int] = (1, 1), **sync: object) -> WorkerConfig:
    reps = tuple(_replica(r) for r in range(replicas))
    own = reps[me[0]]
    return WorkerConfig(
        job_id="job",
        term=1,
        epoch=1,
        spec={},
        stages=own,
        micro_batches=2,
        schedule="1f1b",
        peer_id=own[me[1]].members[0].peer_id,
        state_dir="/nonexistent",
        listen_host="127.0.0.1",
        owner=reps[0][0].members[0].peer_id,
        checkpoint_dir="/nonexistent",
        checkpoint_interval=0,
        total_steps=1,
        replicas=reps,
        replica_sync=ReplicaSyncConfig(**sync),  # type: ignore[arg-type]
    )


def test_replicas_survive_the_round_trip_and_name_the_ring() -> None:
    config = _config(3, me=(1, 1), mode="diloco", diloco_h=7, codec="fp16")
    back = WorkerConfig.from_json(config.to_json())
    assert back == config
    assert back.replica_of() == 1 and back.replica_count() == 3
    assert back.ring() == tuple(_replica(r)[1].members[0].peer_id for r in range(3))
    assert back.stage_members(0) == [_replica(r)[0].members[0].peer_id for r in range(3)]
    # the owner is in replica 0, not in this worker's own stages: allowed with replicas
    assert back.owner not in {m.peer_id for st in back.stages for m in st.members}


def test_differently_cut_replicas_are_refused() -> None:
    raw = json.loads(_config().to_json())
    raw["replicas"][0][0]["end"] = 1
    raw["replicas"][0][1]["start"] = 1
    with pytest.raises(WorkerProtocolError, match=r"replicas\[0\]: cut differently"):
        WorkerConfig.from_dict(raw)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("mode", "sometimes", "replica_sync.mode"),
        ("diloco_h", 0, "diloco_h"),
        ("outer_momentum", 1.0, "outer_mom"),
        ("codec", "zip", "replica_sync.codec"),
    ],
)
def test_bad_sync_settings_are_refused(field: str, value: object, match: str) -> None:
    raw = json.loads(_config().to_json())
    raw["replica_sync"][field] = value
    with pytest.raises(WorkerProtocolError, match=match):
        WorkerConfig.from_dict(raw)


def test_replicas_without_a_sync_mode_are_refused() -> None:
    raw = json.loads(_config().to_json())
    raw["replica_sync"] = None
    with pytest.raises(WorkerProtocolError, match="replica_sync: required"):
        WorkerConfig.from_dict(raw)
