"""MNIST data set: file discovery, normalisation, flattening, deterministic splits."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import pytest
import torch

from arceusd.data.errors import DataError
from arceusd.data.idx import read_idx
from arceusd.data.mnist import find_mnist_files, load_mnist, read_mnist_info, split_order

DATA = Path(__file__).resolve().parents[2] / "data"
MNIST = DATA / "mnist"


def test_file_order_split_normalised_and_flattened() -> None:
    d = load_mnist(MNIST, train_count=8000, holdout_count=2000, mean=0.1307, std=0.3081)
    raw_x = read_idx(MNIST / "t10k-images-idx3-ubyte.gz")
    raw_y = read_idx(MNIST / "t10k-labels-idx1-ubyte.gz")
    assert d.train_images.shape == (8000, 784) and d.train_images.dtype == torch.float32
    assert d.holdout_images.shape == (2000, 784) and d.features == 784
    assert d.train_labels.dtype == torch.int64
    assert d.train_labels.tolist() == raw_y[:8000].tolist()
    assert d.holdout_labels.tolist() == raw_y[8000:].tolist()
    for i, k in [(0, 0), (0, 400), (123, 511), (7999, 783)]:
        pixel = int(raw_x[i].reshape(-1)[k])
        assert d.train_images[i, k].item() == pytest.approx((pixel / 255 - 0.1307) / 0.3081, abs=1e-6)
    hold_pixel = int(raw_x[9999].reshape(-1)[300])
    assert d.holdout_images[1999, 300].item() == pytest.approx((hold_pixel / 255 - 0.1307) / 0.3081, abs=1e-6)
    # The standard MNIST statistics hold roughly on this subset: about zero mean, unit variance.
    assert abs(d.train_images.mean().item()) < 0.05
    assert abs(d.train_images.std().item() - 1.0) < 0.05


def test_custom_normalisation() -> None:
    d = load_mnist(MNIST, train_count=10, holdout_count=0, mean=0.0, std=1.0)
    raw_x = read_idx(MNIST / "t10k-images-idx3-ubyte.gz")[:10].reshape(10, -1).to(torch.float32) / 255
    assert torch.allclose(d.train_images, raw_x)
    assert d.holdout_images.shape == (0, 784)


def test_seeded_split_is_deterministic_and_disjoint() -> None:
    a = load_mnist(MNIST, train_count=6000, holdout_count=3000, split_seed=7)
    b = load_mnist(MNIST, train_count=6000, holdout_count=3000, split_seed=7)
    c = load_mnist(MNIST, train_count=6000, holdout_count=3000, split_seed=8)
    assert torch.equal(a.train_images, b.train_images) and torch.equal(a.holdout_labels, b.holdout_labels)
    assert not torch.equal(a.train_labels, c.train_labels)
    # The split cuts one permutation: train and held-out are disjoint index sets of the file order.
    order = split_order(10000, 7)
    assert torch.equal(order.sort().values, torch.arange(10000))
    full = load_mnist(MNIST, train_count=10000, holdout_count=0)
    assert torch.equal(a.train_images, full.train_images[order[:6000]])
    assert torch.equal(a.holdout_labels, full.train_labels[order[6000:9000]])


def test_counts_above_the_file_are_refused() -> None:
    with pytest.raises(DataError, match="holds 10000 examples, fewer than train_count"):
        load_mnist(MNIST, train_count=9000, holdout_count=2000)


def test_discovery_prefers_training_files_and_explains_absence(tmp_path: Path) -> None:
    assert find_mnist_files(MNIST)[0].name == "t10k-images-idx3-ubyte.gz"
    with pytest.raises(DataError, match="no MNIST file pair found"):
        find_mnist_files(tmp_path)
    with pytest.raises(DataError, match="not a directory"):
        find_mnist_files(tmp_path / "missing")
    shutil.copy(MNIST / "t10k-images-idx3-ubyte.gz", tmp_path / "train-images-idx3-ubyte.gz")
    shutil.copy(MNIST / "t10k-labels-idx1-ubyte.gz", tmp_path / "train-labels-idx1-ubyte.gz")
    shutil.copy(MNIST / "t10k-images-idx3-ubyte.gz", tmp_path / "t10k-images-idx3-ubyte.gz")
    shutil.copy(MNIST / "t10k-labels-idx1-ubyte.gz", tmp_path / "t10k-labels-idx1-ubyte.gz")
    assert find_mnist_files(tmp_path)[0].name == "train-images-idx3-ubyte.gz"


def test_mismatched_and_swapped_files(tmp_path: Path) -> None:
    labels = tmp_path / "labels.gz"
    labels.write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + bytes(5)))
    with pytest.raises(DataError, match=r"10000 images but .* holds 5 labels"):
        read_mnist_info(MNIST / "t10k-images-idx3-ubyte.gz", labels)
    with pytest.raises(DataError, match="expected 2051"):
        read_mnist_info(MNIST / "t10k-labels-idx1-ubyte.gz", MNIST / "t10k-images-idx3-ubyte.gz")
    bad = tmp_path / "badlabels"
    bad.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10000) + bytes([3]) * 9999 + bytes([12]))
    with pytest.raises(DataError, match=r"label 12 outside 0..9"):
        load_mnist(MNIST, train_count=5, holdout_count=5, images=MNIST / "t10k-images-idx3-ubyte.gz", labels=bad)
