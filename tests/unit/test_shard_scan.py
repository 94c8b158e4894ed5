"""The daemon's torch-free shard scan (arceusd/jobs/judging/shard_scan.py): it agrees with torch on which tensors hold a
NaN or an infinity in every float dtype a shard may hold, checks the parameters' names and shapes, and refuses
a header that lies about where its tensors are before reading any value."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.judging import shard_scan
from arceusd.jobs.judging.shard_scan import ShardScanError, scan_shard

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SPECIALS = (float("nan"), float("inf"), float("-inf"))


def write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.write_bytes(save_bytes(tensors, {"stage": "0"}))
    return path


def shapes(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tensors.items() if k.startswith("param.")}


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    n=st.integers(1, 300),
    at=st.integers(0, 299),
    special=st.sampled_from((None, *SPECIALS)),
    scale=st.sampled_from((1e-3, 1.0, 1e4)),
)
def test_the_scan_agrees_with_torch_isfinite(
    tmp_path_factory: pytest.TempPathFactory, dtype: torch.dtype, n: int, at: int, special: float | None, scale: float
) -> None:
    values = (torch.randn(n, dtype=torch.float64) * scale).to(dtype)
    if special is not None:
        values[at % n] = special
    tensors = {"param.blocks.0.w": values, "optim.blocks.0.w.exp_avg": torch.zeros(n, dtype=dtype)}
    path = write(tmp_path_factory.mktemp("scan") / "s.safetensors", tensors)
    finite = bool(torch.isfinite(values).all())
    if finite:
        scan_shard(path, shapes(tensors))
    else:
        with pytest.raises(ShardScanError, match=r"non-finite values \(param.blocks.0.w\)"):
            scan_shard(path, shapes(tensors))


def test_a_non_finite_optimizer_buffer_is_found_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_scan, "CHUNK_BYTES", 64)  # many chunks: the last one holds the infinity
    buffer = torch.zeros(1000)
    buffer[-1] = float("inf")
    tensors = {
        "param.blocks.0.w": torch.ones(10, 3),
        "optim.blocks.0.w.exp_avg_sq": buffer,
        "optim.step": torch.tensor([3], dtype=torch.int64),
    }
    path = write(tmp_path / "s.safetensors", tensors)
    with pytest.raises(ShardScanError, match="exp_avg_sq"):
        scan_shard(path, shapes(tensors))
    buffer[-1] = 0.0
    scan_shard(write(path, tensors), shapes(tensors))


def test_names_and_shapes_must_be_the_places(tmp_path: Path) -> None:
    tensors = {"param.blocks.0.w": torch.ones(4, 3), "param.blocks.0.b": torch.ones(4)}
    path = write(tmp_path / "s.safetensors", tensors)
    scan_shard(path, shapes(tensors))
    with pytest.raises(ShardScanError, match="names or shapes differ"):
        scan_shard(path, {"param.blocks.0.w": (3, 4), "param.blocks.0.b": (4,)})
    with pytest.raises(ShardScanError, match=r"param\.blocks\.1\.w"):
        scan_shard(path, {**shapes(tensors), "param.blocks.1.w": (2,)})


def raw(header: object, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x01\x02", "shorter than a safetensors header"),
        (struct.pack("<Q", 1 << 40) + b"{}", "header length is out of range"),
        (struct.pack("<Q", 4) + b"nope", "not JSON"),
        (raw([1, 2], b""), "not an object"),
        (
            raw({"param.blocks.0.w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 30]}}, b"\0" * 16),
            "does not fit the file",
        ),
        (
            raw({"param.blocks.0.w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, b"\0" * 16),
            "does not fit the file",
        ),
        (
            raw({"param.blocks.0.w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, b"\0" * 16),
            "malformed shape",
        ),
        (
            raw({"param.blocks.0.w": {"dtype": "PICKLE", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16),
            "unknown dtype",
        ),
        (
            raw({"param.blocks.0.w": {"dtype": "F32", "shape": [4], "data_offsets": "0-16"}}, b"\0" * 16),
            "malformed data offsets",
        ),
    ],
)
def test_a_lying_header_is_refused_before_any_value_is_read(tmp_path: Path, data: bytes, why: str) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(data)
    with pytest.raises(ShardScanError, match=why):
        scan_shard(path, {"param.blocks.0.w": (4,)})


def test_a_missing_file_is_an_os_error_not_the_members_fault(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        scan_shard(tmp_path / "gone.safetensors", {})
