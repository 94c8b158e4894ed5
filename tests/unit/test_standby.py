"""The standby's file side: which files make a data set, the checked copy's entry, refusing names and copies
that do not match the spec, and the offers rebuilt from verified plan inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.plans.standby import (
    StandbyError,
    check_copy,
    check_names,
    copy_entry,
    data_files,
    offers_from_wire,
    offers_to_wire,
)
from arceusd.jobs.spec.datafacts import mnist_facts, text_facts

SHARED = Path(__file__).resolve().parents[2] / "data"
TEXT = SHARED / "tinyshakespeare" / "input.txt"


def test_names_must_be_plain_and_fit_the_kind() -> None:
    check_names("text", ["input.txt"])
    check_names("mnist", ["images.gz", "labels.gz"])
    for kind, names in [
        ("text", ["../etc/passwd"]),
        ("text", [".hidden"]),
        ("text", ["a/b"]),
        ("text", []),
        ("mnist", ["one"]),
        ("mnist", ["same", "same"]),
        ("text", ["x" * 200]),
    ]:
        with pytest.raises(StandbyError):
            check_names(kind, names)


def test_a_text_copy_is_checked_against_the_spec_digest(tmp_path: Path) -> None:
    if not TEXT.is_file():
        pytest.skip("the bundled Tiny Shakespeare is not there")
    digest = text_facts(TEXT, 0.1).sha256
    entry = {"kind": "text", "path": str(TEXT), "val_fraction": 0.1, "sha256": digest}
    assert data_files(entry) == [TEXT]
    copy = copy_entry(tmp_path, entry, ["input.txt"])
    assert Path(copy["path"]) == tmp_path / "data" / "input.txt" and copy["val_fraction"] == 0.1
    (tmp_path / "data").mkdir()
    shutil.copy(TEXT, copy["path"])
    check_copy(copy, digest)
    with Path(copy["path"]).open("r+b") as fh:  # one flipped byte
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    with pytest.raises(StandbyError, match="digest"):
        check_copy(copy, digest)
    with pytest.raises(StandbyError, match="no data digest"):
        check_copy(copy, None)


def test_a_tokens_copy_is_the_text_and_its_tokenizer_each_checked(tmp_path: Path) -> None:
    """A stock LM's data set (issue 30): the text and the tokenizer.json, each against its own digest. Read as
    MNIST before, a tokens copy never checked, so no standby of a Hugging Face job was ever ready to take over."""
    from arceusd.data.text_files import file_sha256

    tokenizer = SHARED / "tokenizers" / "shakespeare-bpe.json"
    if not TEXT.is_file() or not tokenizer.is_file():
        pytest.skip("the bundled Tiny Shakespeare or its tokenizer is not there")
    digest, tokenizer_digest = file_sha256(TEXT), file_sha256(tokenizer)
    entry = {"kind": "tokens", "path": str(TEXT), "tokenizer": str(tokenizer), "val_fraction": 0.1}
    assert data_files(entry) == [TEXT, tokenizer]
    copy = copy_entry(tmp_path, entry, ["input.txt", "tokenizer.json"])
    assert copy["tokenizer"] == str(tmp_path / "data" / "tokenizer.json")
    (tmp_path / "data").mkdir()
    shutil.copy(TEXT, copy["path"])
    shutil.copy(tokenizer, copy["tokenizer"])
    check_copy(copy, digest, tokenizer_digest)
    with pytest.raises(StandbyError, match="tokenizer copy's digest"):
        check_copy(copy, digest, "0" * 64)
    shutil.copy(TEXT, copy["tokenizer"])
    with pytest.raises(StandbyError, match="tokenizer copy's digest"):
        check_copy(copy, digest, tokenizer_digest)


def test_an_mnist_copy_is_both_files_in_order(tmp_path: Path) -> None:
    folder = SHARED / "mnist"
    if not folder.is_dir():
        pytest.skip("the bundled MNIST is not there")
    facts = mnist_facts(folder, None, None)
    entry = {"kind": "mnist", "dir": str(folder), "train_count": 10, "holdout_count": 10, "sha256": facts.sha256}
    files = data_files(entry)
    assert [f.name for f in files] == [facts.images, facts.labels]
    copy = copy_entry(tmp_path, entry, [f.name for f in files])
    (tmp_path / "data").mkdir()
    for f in files:
        shutil.copy(f, tmp_path / "data" / f.name)
    check_copy(copy, facts.sha256)
    assert copy["images"] == facts.images and copy["dir"] == str(tmp_path / "data")
    shutil.copy(files[1], tmp_path / "data" / files[0].name)  # the labels where the images should be
    with pytest.raises(StandbyError):
        check_copy(copy, facts.sha256)


def test_offers_travel_with_their_calibration_and_bad_ones_are_refused() -> None:
    a = Offer("a" * 32, "10.0.0.1:7000", 2e9, 4 << 30, "cpu", 0.7, 2e-4, 2e-9, 5e-10, 1e-3)
    b = Offer("b" * 32, "10.0.0.2:7000", 5e9, 8 << 30, "cuda")
    wire = offers_to_wire([a, b])
    assert offers_from_wire(wire, [a.peer_id, b.peer_id]) == {a.peer_id: a, b.peer_id: b}
    assert offers_from_wire(wire, [a.peer_id]) == {a.peer_id: a}, "a member the standby was not told of: left out"
    good = json.loads(wire)
    for field, value in [
        ("block_efficiency", -1.0),
        ("dispatch_s", float("nan")),
        ("flops_per_s", "fast"),
        ("memory_bytes", 1.5),
        ("peer_id", 7),
        ("adamw_s_per_param", True),
    ]:
        bad = [dict(good[0], **{field: value})]
        with pytest.raises(StandbyError):
            offers_from_wire(json.dumps(bad).encode(), [a.peer_id])
    with pytest.raises(StandbyError, match="exactly the fields"):
        offers_from_wire(json.dumps([dict(good[0], extra=1)]).encode(), [a.peer_id])
    for junk in (b"", b"{}", b"[1]"):
        with pytest.raises(StandbyError):
            offers_from_wire(junk, [a.peer_id])
