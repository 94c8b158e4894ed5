"""Character text data: vocabulary, encode/decode, the 90/10 split, context windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.data.errors import DataError
from arceusd.data.text import CharVocab, context_windows, load_text, read_text, split_point, window_count

DATA = Path(__file__).resolve().parents[2] / "data"
SHAKESPEARE = DATA / "tinyshakespeare" / "input.txt"


def test_tiny_shakespeare_vocabulary_and_split() -> None:
    text = SHAKESPEARE.read_text(encoding="utf-8")
    d = load_text(SHAKESPEARE, val_fraction=0.1)
    assert d.vocab.size == 65 == len(set(text))
    assert list(d.vocab.chars) == sorted(set(text))
    assert d.train.dtype == torch.int64
    cut = int(len(text) * 0.9)
    assert d.train.numel() == cut and d.val.numel() == len(text) - cut
    assert d.vocab.decode(d.train[:200]) == text[:200]
    assert d.vocab.decode(d.val[-200:]) == text[-200:]
    # ids are the rank of the character in the sorted vocabulary
    assert int(d.train[0]) == sorted(set(text)).index(text[0])


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=200))
def test_encode_decode_round_trip(text: str) -> None:
    vocab = CharVocab.from_text(text)
    ids = vocab.encode(text)
    assert ids.shape == (len(text),)
    assert vocab.decode(ids) == text
    assert vocab.decode(ids.tolist()) == text
    assert CharVocab.from_text(text[::-1]) == vocab  # order of appearance does not matter


def test_unknown_character_and_bad_id() -> None:
    vocab = CharVocab.from_text("abc")
    with pytest.raises(DataError, match="'z' at position 2 is not in the vocabulary"):
        vocab.encode("abz")
    with pytest.raises(DataError, match="'\\\\x00' at position 0"):
        vocab.encode("\x00")
    with pytest.raises(DataError, match=r"token id 3 outside the vocabulary 0..2"):
        vocab.decode([0, 3])
    with pytest.raises(DataError):
        CharVocab(("b", "a"))


def test_windows_are_shifted_by_one() -> None:
    text = "hello world, this is a test"
    vocab = CharVocab.from_text(text)
    data = vocab.encode(text)
    offsets = torch.tensor([0, 3, len(text) - 6])
    x, y = context_windows(data, offsets, 5)
    assert x.shape == y.shape == (3, 5)
    for row, o in enumerate(offsets.tolist()):
        assert vocab.decode(x[row]) == text[o : o + 5]
        assert vocab.decode(y[row]) == text[o + 1 : o + 6]
    with pytest.raises(DataError, match="window offsets"):
        context_windows(data, torch.tensor([len(text) - 5]), 5)
    assert window_count(len(text), 5) == len(text) - 5
    assert window_count(4, 5) == 0


def test_split_point_and_bad_files(tmp_path: Path) -> None:
    assert split_point(1000, 0.1) == 900
    assert split_point(1000, 0.0) == 1000
    with pytest.raises(DataError, match=r"val_fraction must be in \[0, 1\)"):
        split_point(10, 1.0)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        read_text(empty)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DataError, match="not valid UTF-8 at byte 3"):
        read_text(latin)
    with pytest.raises(DataError, match="no such file"):
        read_text(tmp_path / "missing.txt")
    big = tmp_path / "big.txt"
    big.write_text("a" * 100)
    with pytest.raises(DataError, match="over the limit"):
        read_text(big, max_bytes=50)
