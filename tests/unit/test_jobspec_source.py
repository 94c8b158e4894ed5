"""From a validated spec to the owner's batch source: shapes, determinism, and refusing changed data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from arceusd.data.batches import MnistBatches, TextBatches
from arceusd.data.errors import DataError
from arceusd.jobs.procs.source import open_batch_source
from arceusd.jobs.spec.schema import load_spec, spec_from_dict, to_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = (ROOT / "data").resolve()


def test_mnist_example_source() -> None:
    spec = load_spec(EXAMPLES / "mnist-mlp.toml")
    src = open_batch_source(spec)
    assert isinstance(src, MnistBatches)
    assert spec.training.epochs == 10 and src.steps_per_epoch * 10 == spec.training.steps
    x, y = src.batch(0)
    assert x.shape == (256, 784) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert sum(len(yy) for _, yy in src.eval_batches()) == 2000
    again = open_batch_source(load_spec(EXAMPLES / "mnist-mlp.toml"))
    assert torch.equal(again.batch(123)[0], src.batch(123)[0])


def test_text_example_source() -> None:
    spec = load_spec(EXAMPLES / "shakespeare-gpt.toml")
    src = open_batch_source(spec)
    assert isinstance(src, TextBatches)
    x, y = src.batch(7)
    assert x.shape == y.shape == (32, 64) and torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < 65
    assert len(list(src.eval_batches())) == spec.training.eval_iters


def test_changed_data_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "input.txt"
    shutil.copy(DATA / "tinyshakespeare" / "input.txt", text)
    doc = to_dict(load_spec(EXAMPLES / "shakespeare-gpt.toml"))
    doc["data"]["path"] = "input.txt"
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(doc))
    spec = load_spec(spec_file)
    open_batch_source(spec)  # unchanged: fine
    with text.open("a") as f:
        f.write("one more line\n")
    with pytest.raises(DataError, match="the data changed since the job was submitted"):
        open_batch_source(spec)
    # a spec from the wire has no base_dir: the owner is the one that opens the data
    assert spec_from_dict(doc).base_dir is None
