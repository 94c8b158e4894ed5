"""Checkpoints: two-phase write, signed manifest, atomicity, pruning, corrupt shards and replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arceusd.base.identity import Identity
from arceusd.files.checkpoint import (
    CheckpointError,
    Manifest,
    commit_manifest,
    committed_steps,
    load_latest,
    load_step,
    parse_manifest,
    read_manifest,
    step_dir,
    write_shard,
)


def _write_step(root: Path, step: int, leader: Identity, scale: float = 1.0) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(step)
    shards = {
        "stage0.safetensors": {"w": torch.randn(4, 3, generator=g) * scale, "b": torch.zeros(3)},
        "stage1.safetensors": {"w": torch.randn(3, 2, generator=g), "steps": torch.tensor([step])},
    }
    records = tuple(write_shard(root, step, name, tensors) for name, tensors in shards.items())
    commit_manifest(root, Manifest("job1", 1, 0, step, records, {"cursor": {"step": step}}), leader)
    return shards


def test_round_trip_and_signature(tmp_path: Path) -> None:
    leader = Identity.generate()
    shards = _write_step(tmp_path, 5, leader)
    loaded = load_latest([tmp_path], [leader.peer_id])
    assert loaded is not None and loaded.manifest.step == 5 and loaded.signer == leader.peer_id
    assert loaded.manifest.extra == {"cursor": {"step": 5}}
    for name, tensors in shards.items():
        for key, value in tensors.items():
            assert torch.equal(loaded.shards[name][key], value)


def test_untrusted_or_forged_manifest_is_refused(tmp_path: Path) -> None:
    leader, stranger = Identity.generate(), Identity.generate()
    _write_step(tmp_path, 1, leader)
    with pytest.raises(CheckpointError, match="not a trusted member"):
        read_manifest(step_dir(tmp_path, 1), [stranger.peer_id])
    path = step_dir(tmp_path, 1) / "manifest.json"
    envelope = json.loads(path.read_text())
    envelope["manifest"]["step"] = 2  # tamper with the signed body
    path.write_text(json.dumps(envelope))
    with pytest.raises(CheckpointError, match="invalid signature"):
        read_manifest(step_dir(tmp_path, 1), [leader.peer_id])
    assert load_latest([tmp_path], [leader.peer_id]) is None


def test_manifest_bytes_from_the_network_are_checked_like_a_file(tmp_path: Path) -> None:
    """What a standby receives (StandbySync.manifest) passes the same checks before it is stored."""
    leader, stranger = Identity.generate(), Identity.generate()
    _write_step(tmp_path, 3, leader)
    data = (step_dir(tmp_path, 3) / "manifest.json").read_bytes()
    manifest, signer = parse_manifest(data, [leader.peer_id], "the leader's manifest")
    assert manifest.step == 3 and signer == leader.peer_id
    with pytest.raises(CheckpointError, match="not a trusted member"):
        parse_manifest(data, [stranger.peer_id])
    envelope = json.loads(data)
    envelope["manifest"]["shards"][0][1] = "0" * 64  # a different shard hash under the old signature
    with pytest.raises(CheckpointError, match="invalid signature"):
        parse_manifest(json.dumps(envelope).encode(), [leader.peer_id])
    for junk in (b"", b"{", b"[]", b'{"manifest": {}}', data[:-20]):
        with pytest.raises(CheckpointError, match="malformed"):
            parse_manifest(junk, [leader.peer_id])


def test_uncommitted_step_is_invisible_and_latest_wins(tmp_path: Path) -> None:
    leader = Identity.generate()
    _write_step(tmp_path, 1, leader)
    _write_step(tmp_path, 2, leader)
    write_shard(tmp_path, 3, "stage0.safetensors", {"w": torch.ones(1)})  # phase one only
    assert committed_steps(tmp_path) == [1, 2]
    loaded = load_latest([tmp_path], [leader.peer_id])
    assert loaded is not None and loaded.manifest.step == 2


def test_commit_refuses_missing_or_modified_shard(tmp_path: Path) -> None:
    leader = Identity.generate()
    record = write_shard(tmp_path, 1, "a.safetensors", {"w": torch.ones(2)})
    (step_dir(tmp_path, 1) / "a.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        commit_manifest(tmp_path, Manifest("j", 1, 0, 1, (record,)), leader)
    assert committed_steps(tmp_path) == []


def test_keep_newest_three(tmp_path: Path) -> None:
    leader = Identity.generate()
    for step in range(1, 6):
        _write_step(tmp_path, step, leader)
    assert committed_steps(tmp_path) == [3, 4, 5]
    assert not step_dir(tmp_path, 1).exists()


def test_corrupt_shard_falls_back_to_replica_then_older_step(tmp_path: Path) -> None:
    leader = Identity.generate()
    local, replica = tmp_path / "local", tmp_path / "replica"
    _write_step(local, 1, leader)
    expected = _write_step(local, 2, leader)
    _write_step(replica, 2, leader)
    shard = step_dir(local, 2) / "stage1.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    loaded = load_step([local, replica], 2, [leader.peer_id])
    assert loaded.used_replica
    assert torch.equal(loaded.shards["stage1.safetensors"]["w"], expected["stage1.safetensors"]["w"])
    # Without the replica, step 2 is unusable and the newest good step (1) is used.
    fallback = load_latest([local], [leader.peer_id])
    assert fallback is not None and fallback.manifest.step == 1


def test_bad_shard_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="shard name"):
        write_shard(tmp_path, 1, "../evil.safetensors", {"w": torch.ones(1)})
    assert not (tmp_path.parent / "evil.safetensors").exists()
