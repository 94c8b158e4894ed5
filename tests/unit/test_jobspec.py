"""Job specs: the examples validate, each bad-spec case names its field, all problems are reported at once."""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arceusd.jobs.spec.parsed import MnistDataSpec, TextDataSpec
from arceusd.jobs.spec.schema import (
    JobSpecError,
    canonical_json,
    job_id,
    load_spec,
    parse_spec,
    spec_from_dict,
    spec_hash,
    to_dict,
)
from arceusd.models.config import GPTConfig, MLPConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = (ROOT / "data").resolve()
SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"


def mnist_doc() -> dict[str, Any]:
    return {
        "name": "m",
        "model": {"type": "mlp", "layer_sizes": [784, 32, 10]},
        "data": {"kind": "mnist", "dir": str(DATA / "mnist"), "train_count": 8000, "holdout_count": 2000},
        "training": {"epochs": 2, "batch_size": 100, "micro_batches": 4, "optimizer": "sgd", "lr": 0.1},
    }


def gpt_doc(text: Path = SHAKESPEARE) -> dict[str, Any]:
    return {
        "name": "g",
        "seed": 3,
        "model": {
            "type": "gpt",
            "n_layer": 2,
            "n_head": 2,
            "n_embd": 32,
            "block_size": 16,
            "vocab_size": "auto",
        },
        "data": {"kind": "text", "path": str(text), "val_fraction": 0.1},
        "training": {"steps": 50, "batch_size": 8, "optimizer": "adamw", "lr": 1e-3, "warmup_steps": 5},
    }


def parse(doc: dict[str, Any], base: Path = ROOT) -> Any:
    return parse_spec(doc, base_dir=base, source="test.toml")


def test_examples_validate() -> None:
    mnist = load_spec(EXAMPLES / "mnist-mlp.toml")
    assert mnist.model == MLPConfig((784, 128, 64, 10))
    assert isinstance(mnist.data, MnistDataSpec)
    assert (mnist.data.train_count, mnist.data.holdout_count) == (8000, 2000)
    assert (mnist.data.mean, mnist.data.std) == (0.1307, 0.3081)
    assert mnist.training.batch_size == 256 and mnist.training.optimizer == "sgd" and mnist.training.lr == 0.1
    assert mnist.training.epochs == 10 and mnist.training.steps == 10 * (8000 // 256)
    assert mnist.data_path().resolve() == (DATA / "mnist").resolve()
    gpt = load_spec(EXAMPLES / "shakespeare-gpt.toml")
    assert isinstance(gpt.model, GPTConfig) and gpt.model.vocab_size == 65
    assert isinstance(gpt.data, TextDataSpec)
    # the recorded digest is the file's sha256 (as published in the data set's README)
    assert gpt.data.sha256 == "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    assert gpt.training.optimizer == "adamw" and gpt.training.lr_decay == "cosine"


def test_round_trip_and_hash_are_stable(tmp_path: Path) -> None:
    for name in ("mnist-mlp.toml", "shakespeare-gpt.toml"):
        spec = load_spec(EXAMPLES / name)
        wire = json.loads(json.dumps(to_dict(spec)))
        back = spec_from_dict(wire)
        assert back == spec and spec_hash(back) == spec_hash(spec)
        assert canonical_json(spec) == canonical_json(load_spec(EXAMPLES / name))
    # JSON spec files are accepted; base_dir does not change the hash
    spec = parse(mnist_doc())
    js = tmp_path / "spec.json"
    js.write_text(json.dumps(mnist_doc()))
    from_json = load_spec(js)
    assert from_json == spec and spec_hash(from_json) == spec_hash(spec)
    assert from_json.base_dir != spec.base_dir


def test_hash_covers_training_settings() -> None:
    base = spec_hash(parse(mnist_doc()))
    for path, value in [
        (("training", "lr"), 0.2),
        (("seed",), 1),
        (("model", "layer_sizes"), [784, 33, 10]),
        (("data", "mean"), 0.2),
        (("training", "micro_batches"), 2),
    ]:
        doc = mnist_doc()
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert spec_hash(parse(doc)) != base, path
    assert json.loads(canonical_json(parse(mnist_doc())))["data"]["sha256"]  # data content is part of it


def test_job_id() -> None:
    h = spec_hash(parse(mnist_doc()))
    owner = "ab" * 16
    a = job_id(h, owner, b"\x01" * 16)
    assert len(a) == 32 and int(a, 16) >= 0
    assert a == job_id(h, owner, b"\x01" * 16)
    assert a != job_id(h, owner, b"\x02" * 16) and a != job_id(h, "cd" * 16, b"\x01" * 16)
    for bad in [("zz", owner, b"\x00" * 16), (h, "ab", b"\x00" * 16), (h, owner, b"short")]:
        with pytest.raises(ValueError):
            job_id(*bad)


Mutation = Callable[[dict[str, Any]], None]


def _set(section: str | None, key: str, value: object) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        (doc if section is None else doc[section])[key] = value

    return apply


def _drop(section: str | None, key: str) -> Mutation:
    def apply(doc: dict[str, Any]) -> None:
        del (doc if section is None else doc[section])[key]

    return apply


# (case id, base doc, mutation, expected field path, expected text in that problem's message)
BAD_MNIST: list[tuple[str, Mutation, str, str]] = [
    ("unknown top key", _set(None, "trainig", {}), "trainig", "did you mean 'training'"),
    ("unknown model key", _set("model", "layer_size", [1]), "model.layer_size", "did you mean 'layer_sizes'"),
    ("unknown model type", _set("model", "type", "cnn"), "model.type", "allowed: 'mlp', 'gpt'"),
    ("mlp input mismatch", _set("model", "layer_sizes", [100, 10]), "model.layer_sizes", "784 pixels"),
    ("mlp output mismatch", _set("model", "layer_sizes", [784, 5]), "model.layer_sizes", "10 classes"),
    (
        "mlp sizes not ints",
        _set("model", "layer_sizes", [784, "x", 10]),
        "model.layer_sizes",
        "list of integers",
    ),
    ("missing data dir", _set("data", "dir", "/nonexistent/mnist"), "data.dir", "not a directory"),
    (
        "counts above file",
        _set("data", "train_count", 9000),
        "data.train_count",
        "exceeds the 10000 examples",
    ),
    ("std zero", _set("data", "std", 0.0), "data.std", "> 0.0"),
    ("batch size 0", _set("training", "batch_size", 0), "training.batch_size", ">= 1"),
    ("batch size bool", _set("training", "batch_size", True), "training.batch_size", "must be an integer"),
    (
        "batch above train",
        _set("training", "batch_size", 9000),
        "training.batch_size",
        "exceeds data.train_count",
    ),
    ("micro > batch", _set("training", "micro_batches", 101), "training.micro_batches", "exceed"),
    ("micro not dividing", _set("training", "micro_batches", 3), "training.micro_batches", "not divisible"),
    ("negative lr", _set("training", "lr", -0.1), "training.lr", "must be > 0.0"),
    ("nan lr", _set("training", "lr", math.nan), "training.lr", "finite"),
    ("unknown optimizer", _set("training", "optimizer", "lion"), "training.optimizer", "'sgd', 'adamw'"),
    (
        "betas with sgd",
        _set("training", "betas", [0.9, 0.99]),
        "training.betas",
        "only with optimizer = 'adamw'",
    ),
    ("momentum 1", _set("training", "momentum", 1.0), "training.momentum", "< 1.0"),
    ("precision", _set("training", "precision", "fp8"), "training.precision", "'fp32', 'bf16'"),
    ("compression", _set("training", "compression", "zip"), "training.compression", "'int8', 'topk'"),
    ("topk fraction w/o topk", _set("training", "topk_fraction", 0.1), "training.topk_fraction", "'topk'"),
    ("schedule", _set("training", "schedule", "zb"), "training.schedule", "'gpipe', '1f1b'"),
    (
        "steps contradict epochs",
        _set("training", "steps", 7),
        "training.steps",
        "contradicts training.epochs",
    ),
    (
        "no steps or epochs",
        _drop("training", "epochs"),
        "training.steps",
        "give training.steps or training.epochs",
    ),
    (
        "warmup > steps",
        _set("training", "warmup_steps", 1000),
        "training.warmup_steps",
        "exceeds the run's 160",
    ),
    ("min_lr > lr", _set("training", "min_lr", 1.0), "training.min_lr", "above training.lr"),
    ("negative grad clip", _set("training", "grad_clip", -1), "training.grad_clip", ">= 0.0"),
    ("keep 0", _set(None, "checkpoint", {"keep": 0}), "checkpoint.keep", ">= 1"),
    ("checkpoint unknown", _set(None, "checkpoint", {"every": 5}), "checkpoint.every", "allowed here"),
    ("allowlist empty", _set(None, "admission", {"mode": "allowlist"}), "admission.peers", "non-empty list"),
    (
        "bad peer id",
        _set(None, "admission", {"mode": "allowlist", "peers": ["nothex"]}),
        "admission.peers",
        "32 lowercase hex",
    ),
    ("admission mode", _set(None, "admission", {"mode": "closed"}), "admission.mode", "'open', 'allowlist'"),
    ("bad name", _set(None, "name", "my job!"), "name", "A-Z a-z 0-9"),
    ("negative seed", _set(None, "seed", -1), "seed", ">= 0"),
    ("missing model", _drop(None, "model"), "model", "add a [model] section"),
    ("model not a table", _set(None, "model", "mlp"), "model", "must be a table"),
    ("sha256 mismatch", _set("data", "sha256", "0" * 64), "data.sha256", "digest is"),
    ("sha256 malformed", _set("data", "sha256", "xyz"), "data.sha256", "64 lowercase hex"),
    (
        "images without labels",
        _set("data", "images", "a.gz"),
        "data.images",
        "both data.images and data.labels",
    ),
    ("spec version", _set(None, "spec_version", 2), "spec_version", "unsupported version 2"),
]


@pytest.mark.parametrize(("case", "mutate", "path", "text"), BAD_MNIST, ids=[c[0] for c in BAD_MNIST])
def test_bad_mnist_specs_name_their_field(case: str, mutate: Mutation, path: str, text: str) -> None:
    doc = mnist_doc()
    mutate(doc)
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    err = info.value
    assert err.paths() == [path], str(err)  # exactly this problem, no cascade
    assert text in str(err.problems[0]), str(err)
    assert f"  - {path}: " in str(err)


def _short_text(tmp_path: Path) -> Path:
    p = tmp_path / "short.txt"
    p.write_text("abcdefghij" * 2)  # 20 chars: 18 train, 2 validate
    return p


BAD_GPT: list[tuple[str, Mutation, str, str]] = [
    ("n_embd not divisible", _set("model", "n_head", 3), "model.n_embd", "not divisible by model.n_head = 3"),
    ("vocab too small", _set("model", "vocab_size", 10), "model.vocab_size", "smaller than the text's 65"),
    ("vocab string", _set("model", "vocab_size", "big"), "model.vocab_size", "integer or 'auto'"),
    ("dropout 1", _set("model", "dropout", 1.0), "model.dropout", "< 1.0"),
    ("bias not bool", _set("model", "bias", "yes"), "model.bias", "true or false"),
    ("n_layer 0", _set("model", "n_layer", 0), "model.n_layer", ">= 1"),
    ("missing text", _set("data", "path", "/nonexistent.txt"), "data.path", "no such file"),
    ("val_fraction 1", _set("data", "val_fraction", 1.0), "data.val_fraction", "< 1.0"),
    ("unknown data kind", _set("data", "kind", "csv"), "data.kind", "allowed: 'mnist', 'text'"),
    (
        "momentum with adamw",
        _set("training", "momentum", 0.9),
        "training.momentum",
        "only with optimizer = 'sgd'",
    ),
    (
        "gpt on mnist",
        lambda d: d.__setitem__("data", mnist_doc()["data"]),
        "model.type",
        "needs data.kind = 'text'",
    ),
    ("betas out of range", _set("training", "betas", [0.9, 1.5]), "training.betas", "< 1.0"),
]


@pytest.mark.parametrize(("case", "mutate", "path", "text"), BAD_GPT, ids=[c[0] for c in BAD_GPT])
def test_bad_gpt_specs_name_their_field(case: str, mutate: Mutation, path: str, text: str) -> None:
    doc = gpt_doc()
    mutate(doc)
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    assert info.value.paths() == [path], str(info.value)
    assert text in str(info.value.problems[0]), str(info.value)


def test_text_too_short_for_the_context(tmp_path: Path) -> None:
    p = tmp_path / "tiny.txt"
    p.write_text("abcdefghij")  # 10 chars: 9 train, 1 validates
    doc = gpt_doc(p)
    doc["training"]["eval_iters"] = 0
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    assert info.value.paths() == ["data.path"]
    assert "training split has 9 characters, fewer than model.block_size + 1 = 17" in str(info.value)


def test_text_split_too_short(tmp_path: Path) -> None:
    doc = gpt_doc(_short_text(tmp_path))
    doc["model"]["block_size"] = 30
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    assert info.value.paths() == ["data.path", "data.val_fraction"]
    assert "training split has 18 characters, fewer than model.block_size + 1 = 31" in str(info.value)
    doc["model"]["block_size"] = 8
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    assert info.value.paths() == ["data.val_fraction"]
    assert "validation split has 2 characters" in str(info.value)
    doc["training"]["eval_iters"] = 0
    model = parse(doc).model
    assert isinstance(model, GPTConfig) and model.block_size == 8


def test_without_files_auto_and_text_epochs_need_the_file() -> None:
    doc = gpt_doc()
    doc["training"] = {"epochs": 1, "batch_size": 8, "optimizer": "adamw", "lr": 1e-3}
    with pytest.raises(JobSpecError) as info:
        spec_from_dict(doc)
    assert info.value.paths() == ["training.epochs", "model.vocab_size"]
    # with files, epochs resolve from the text's length: nominal epoch = train chars // (batch * block)
    spec = parse(doc)
    train_chars = int(len(SHAKESPEARE.read_text(encoding="utf-8")) * 0.9)
    assert spec.training.steps == train_chars // (8 * 16)


def test_all_problems_reported_together() -> None:
    doc = mnist_doc()
    doc["model"]["layer_sizes"] = [100, 10]
    doc["data"]["dir"] = "/nonexistent"
    doc["training"]["batch_size"] = 0
    doc["training"]["lr"] = -1
    doc["training"]["optimiser"] = "sgd"
    doc["admission"] = {"mode": "allowlist", "peers": []}
    with pytest.raises(JobSpecError) as info:
        parse(doc)
    paths = set(info.value.paths())
    assert paths == {
        "model.layer_sizes",
        "data.dir",
        "training.batch_size",
        "training.lr",
        "training.optimiser",
        "admission.peers",
    }
    message = str(info.value)
    assert message.startswith("test.toml: 6 problems:")
    assert len(message.splitlines()) == 7


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(JobSpecError, match="not valid TOML") as info:
        load_spec(bad)
    assert info.value.paths() == ["(file)"]
    with pytest.raises(JobSpecError, match="cannot read the spec"):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(JobSpecError, match="must be a table/object"):
        spec_from_dict([1, 2])


def test_relative_paths_resolve_from_the_spec_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = copy.deepcopy(mnist_doc())
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    (tmp_path / "data").symlink_to(DATA / "mnist")
    doc["data"]["dir"] = "../data"
    p = spec_dir / "job.json"
    p.write_text(json.dumps(doc))
    monkeypatch.chdir(ROOT)  # the shell's folder does not matter
    spec = load_spec(p)
    assert spec.data_path() == spec_dir / ".." / "data"


def test_lr_schedule() -> None:
    spec = parse(gpt_doc())
    t = spec.training
    assert t.lr_at(0) == pytest.approx(t.lr / 5) and t.lr_at(4) == pytest.approx(t.lr)
    assert t.lr_at(20) == t.lr  # constant after warmup without decay
    doc = gpt_doc()
    doc["training"].update(lr_decay="cosine", min_lr=1e-4)
    c = parse(doc).training
    lrs = [c.lr_at(s) for s in range(5, 51)]
    assert lrs[0] == pytest.approx(c.lr) and c.lr_at(50) == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs))
    mid = c.lr_at(5 + 45 // 2)
    assert 1e-4 < mid < c.lr


def test_wire_garbage_is_reported_not_crashed() -> None:
    doc: dict[Any, Any] = to_dict(parse(mnist_doc()))
    doc[7] = "int key"
    doc["training"] = {"steps": "ten", 1.5: None}
    doc["data"] = None
    with pytest.raises(JobSpecError) as info:
        spec_from_dict(doc)
    paths = info.value.paths()
    assert "7" in paths and "data" in paths and "training.steps" in paths and "training.1.5" in paths
