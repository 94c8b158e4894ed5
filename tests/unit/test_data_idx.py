"""IDX reader: the real MNIST files, and every malformed-input class with a clear error."""

from __future__ import annotations

import collections
import gzip
import struct
from pathlib import Path

import pytest
import torch

from arceusd.data.errors import DataError, IdxFormatError
from arceusd.data.idx import read_idx, read_idx_header

DATA = Path(__file__).resolve().parents[2] / "data"
IMAGES = DATA / "mnist" / "t10k-images-idx3-ubyte.gz"
LABELS = DATA / "mnist" / "t10k-labels-idx1-ubyte.gz"


def test_real_images_shape_and_bytes_match_the_raw_file() -> None:
    raw = gzip.decompress(IMAGES.read_bytes())
    images = read_idx(IMAGES, expect_magic=2051)
    assert images.dtype == torch.uint8
    assert tuple(images.shape) == struct.unpack(">III", raw[4:16]) == (10000, 28, 28)
    flat = images.reshape(-1)
    payload = raw[16:]
    for k in (0, 1, 200, 7 * 784 + 300, 5000 * 784 + 411, len(payload) - 1):
        assert int(flat[k]) == payload[k]
    assert int(flat.sum(dtype=torch.int64)) == sum(payload)


def test_real_labels_match_the_raw_file() -> None:
    raw = gzip.decompress(LABELS.read_bytes())
    labels = read_idx(LABELS, expect_magic=2049)
    assert labels.dtype == torch.uint8 and labels.shape == (10000,)
    assert labels.tolist() == list(raw[8:])
    assert int(labels.min()) >= 0 and int(labels.max()) <= 9
    counts = collections.Counter(raw[8:])
    assert torch.bincount(labels.to(torch.int64), minlength=10).tolist() == [counts[c] for c in range(10)]


def test_plain_and_gzip_read_the_same(tmp_path: Path) -> None:
    plain = tmp_path / "labels-no-extension"
    plain.write_bytes(gzip.decompress(LABELS.read_bytes()))
    assert torch.equal(read_idx(plain), read_idx(LABELS))
    header = read_idx_header(IMAGES)
    assert header.magic == 2051 and header.shape == (10000, 28, 28) and header.payload_bytes == 10000 * 784


def _idx(code: int, dims: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + payload


def test_multibyte_dtypes_are_big_endian(tmp_path: Path) -> None:
    ints = [1, -2, 70000, -(2**31)]
    p = tmp_path / "ints.idx"
    p.write_bytes(_idx(0x0C, (2, 2), struct.pack(">4i", *ints)))
    got = read_idx(p)
    assert got.dtype == torch.int32 and got.reshape(-1).tolist() == ints
    floats = [0.5, -3.25, 1e10]
    q = tmp_path / "floats.idx.gz"
    q.write_bytes(gzip.compress(_idx(0x0E, (3,), struct.pack(">3d", *floats))))
    assert read_idx(q).tolist() == floats


BAD_CASES = {
    "nonzero magic prefix": (b"\x01\x02\x08\x01" + struct.pack(">I", 1) + b"\x00", "expected 0000"),
    "unknown dtype code": (_idx(0x07, (1,), b"\x00"), "unknown IDX dtype code 0x07"),
    "zero dimensions": (b"\x00\x00\x08\x00", "declares 0 dimensions"),
    "too many dimensions": (b"\x00\x00\x08\x09" + b"\x00\x00\x00\x01" * 9 + b"\x00", "declares 9 dimensions"),
    "a zero dimension": (_idx(0x08, (3, 0), b""), "contain a zero"),
    "truncated header": (b"\x00\x00\x08\x03\x00\x00", "truncated IDX dimensions"),
    "truncated magic": (b"\x00\x00", "truncated IDX magic"),
    "truncated payload": (_idx(0x08, (10, 4), b"\x01" * 39), "expected 40 bytes, file has only 39"),
    "trailing bytes": (_idx(0x08, (2,), b"\x01\x02\x03"), "trailing bytes"),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_files_fail_with_file_and_reason(tmp_path: Path, case: str, gz: bool) -> None:
    data, expected = BAD_CASES[case]
    p = tmp_path / "bad.idx"
    p.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(IdxFormatError) as info:
        read_idx(p)
    assert str(p) in str(info.value)
    assert expected in str(info.value)


def test_declared_size_over_limit_is_refused_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "huge.idx"
    p.write_bytes(_idx(0x08, (60000, 28, 28), b""))  # claims 47 MB, holds nothing
    with pytest.raises(IdxFormatError, match="over the limit of 1000000 bytes"):
        read_idx(p, max_bytes=1_000_000)


def test_corrupt_gzip_stream(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gz"
    cut.write_bytes(LABELS.read_bytes()[:2000])
    with pytest.raises(IdxFormatError, match=r"cut.gz"):
        read_idx(cut)
    flipped = bytearray(LABELS.read_bytes())
    flipped[100] ^= 0xFF
    bad = tmp_path / "flipped.gz"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(IdxFormatError, match=r"flipped.gz"):
        read_idx(bad)


def test_wrong_kind_of_file_is_named() -> None:
    with pytest.raises(IdxFormatError, match="IDX magic is 2049, expected 2051"):
        read_idx(LABELS, expect_magic=2051)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_idx(tmp_path / "nope.gz")
    with pytest.raises(DataError, match="is a directory"):
        read_idx(tmp_path)
