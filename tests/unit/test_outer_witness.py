"""The DiLoCo witness rebuilt without torch from a checkpoint shard (``arceusd.files.outer_witness``) is the
digest a worker sends (``arceusd.worker.process``: its outer tensors serialised with ``save_bytes``), and the
torch-free layout (``arceusd.files.safetensors_image``) is the one ``save_bytes`` writes."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import torch

from arceusd.files import outer_witness
from arceusd.files.checkpoint import step_dir, write_shard
from arceusd.files.safetensors_image import ImageError, entries
from arceusd.files.safetensors_io import load_bytes, save_bytes


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A stage's state as a DiLoCo worker holds it: parameters, inner optimizer state, outer anchor and momentum."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in (("blocks.0.weight", (7, 5)), ("blocks.0.bias", (7,)), ("blocks.1.weight", (3, 7))):
        out[f"param.{name}"] = torch.randn(shape, generator=g)
        out[f"optim.{name}.momentum_buffer"] = torch.randn(shape, generator=g)
        out[f"optim.{name}.{outer_witness.OUTER_ANCHOR}"] = torch.randn(shape, generator=g)
        out[f"optim.{name}.{outer_witness.OUTER_MOMENTUM}"] = torch.randn(shape, generator=g)
    out["optim.step"] = torch.tensor([12], dtype=torch.int64)
    return out


def _worker_witness(state: dict[str, torch.Tensor], step: int, stage: int, rank: int) -> str:
    """What a worker's ``_witness`` sends with DiLoCo (the same selection, metadata and serialiser)."""
    tensors = {k: v for k, v in state.items() if outer_witness.is_outer(k)}
    return hashlib.sha256(save_bytes(tensors, outer_witness.metadata(step, stage, rank))).hexdigest()


def test_the_witness_rebuilt_from_a_written_shard_is_the_workers(tmp_path: Path) -> None:
    state = _state()
    meta = {"job_id": "j" * 32, "step": "40", "stage": "1", "rank": "0", "start": "2", "end": "4"}
    record = write_shard(tmp_path, 40, "stage1-rank0.safetensors", state, meta)
    shard = (step_dir(tmp_path, 40) / record.name).read_bytes()
    assert hashlib.sha256(shard).hexdigest() == record.sha256
    assert outer_witness.from_shard(shard, 40, 1, 0) == _worker_witness(state, 40, 1, 0)
    # another step or place, or another anchor, is another witness
    assert outer_witness.from_shard(shard, 60, 1, 0) != _worker_witness(state, 40, 1, 0)
    assert outer_witness.from_shard(shard, 40, 0, 1) != _worker_witness(state, 40, 1, 0)
    other = dict(state)
    key = f"optim.blocks.1.weight.{outer_witness.OUTER_MOMENTUM}"
    other[key] = other[key].clone()
    other[key][0, 0] += 1e-6
    assert _worker_witness(other, 40, 1, 0) != _worker_witness(state, 40, 1, 0)
    # the inner state and the parameters are not covered: they differ between replicas
    inner = dict(state, **{"param.blocks.0.bias": torch.zeros(7)})
    assert _worker_witness(inner, 40, 1, 0) == _worker_witness(state, 40, 1, 0)


def test_the_torch_free_layout_is_save_bytes_and_reads_back() -> None:
    state = {**_state(1), "flag": torch.tensor([True, False]), "half": torch.ones(3, dtype=torch.bfloat16)}
    data = save_bytes(state, {"a": "1"})
    found, body = entries(data)
    assert set(found) == set(state) and body == 8 + struct.unpack("<Q", data[:8])[0]
    assert found["param.blocks.0.weight"].shape == (7, 5) and found["half"].dtype == "BF16"
    back = load_bytes(data)  # the reference parser agrees
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_a_malformed_or_hostile_shard_is_refused_with_a_reason() -> None:
    good = save_bytes(_state(), {"step": "40"})
    n = struct.unpack("<Q", good[:8])[0]
    cases = {
        "short": b"\x01\x02",
        "length beyond the file": struct.pack("<Q", 1 << 40) + good[8:],
        "not JSON": struct.pack("<Q", 4) + b"{{{{" + b"\0" * 16,
        "not an object": struct.pack("<Q", 8) + b"[1,2,3] ",
        "truncated body": good[: 8 + n + 10],
        "no outer tensor": save_bytes({"param.x": torch.ones(2)}),
    }
    for why, data in cases.items():
        with pytest.raises(ImageError):
            outer_witness.from_shard(data, 40, 0, 0)
            pytest.fail(why)
    for header in (  # offsets outside the body, a shape that does not fit them, an unknown dtype, rank, sign
        b'{"x.outer_anchor":{"dtype":"F32","shape":[4],"data_offsets":[0,1600]}}',
        b'{"x.outer_anchor":{"dtype":"F32","shape":[400],"data_offsets":[0,16]}}',
        b'{"x.outer_anchor":{"dtype":"Q99","shape":[4],"data_offsets":[0,16]}}',
        b'{"x.outer_anchor":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,4],"data_offsets":[0,16]}}',
        b'{"x.outer_anchor":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}}',
    ):
        lying = struct.pack("<Q", len(header)) + header + b"\0" * 16
        with pytest.raises(ImageError):
            outer_witness.from_shard(lying, 40, 0, 0)
