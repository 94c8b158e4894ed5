"""Tokenized data: the shipped BPE tokenizer, text and JSONL documents, the id cache, splits and windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arceusd.data.errors import DataError
from arceusd.data.tokenized import TokenBatches, load_tokens, open_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "data" / "tokenizers" / "shakespeare-bpe.json"


def test_the_shipped_tokenizer_round_trips_text_and_compresses_shakespeare() -> None:
    tok = open_tokenizer(TOKENIZER)
    text = "ROMEO:\nBut soft, what light through yonder window breaks? — naïve ünïcode"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.get_vocab_size() == 2048 and tok.token_to_id("<|endoftext|>") == 0
    sample = (ROOT / "data" / "tinyshakespeare" / "input.txt").read_text()[:20000]
    assert len(tok.encode(sample).ids) < len(sample) / 2.5


def test_text_and_jsonl_tokenize_once_then_come_from_the_cache(tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text("To be, or not to be, that is the question. " * 40)
    data = load_tokens(text, TOKENIZER, val_fraction=0.2, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 1
    again = load_tokens(text, TOKENIZER, val_fraction=0.2, cache_dir=tmp_path / "cache")
    assert torch.equal(again.train, data.train) and torch.equal(again.val, data.val)
    n = data.train.numel() + data.val.numel()
    assert data.val.numel() == n - int(n * 0.8) or abs(data.val.numel() - 0.2 * n) <= 1

    lines = tmp_path / "b.jsonl"
    lines.write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(["First doc.", "Second."])))
    docs = load_tokens(lines, TOKENIZER, fmt="jsonl", val_fraction=0.0, cache_dir=tmp_path / "cache")
    assert 0 in docs.train.tolist()  # <|endoftext|> between the documents
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="no string field 'text'"):
        load_tokens(bad, TOKENIZER, fmt="jsonl", cache_dir=tmp_path / "cache")


def test_batches_are_shifted_windows_of_the_context_length(tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text((ROOT / "data" / "tinyshakespeare" / "input.txt").read_text()[:30000])
    data = load_tokens(text, TOKENIZER, cache_dir=tmp_path / "cache")
    batches = TokenBatches(data, block_size=16, batch_size=4, seed=3, eval_iters=2)
    x, y = batches.batch(5)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(batches.batch(5)[0], x)
    assert len(list(batches.eval_batches())) == 2
    with pytest.raises(DataError, match="context length"):
        TokenBatches(data, block_size=10**6, batch_size=4, seed=3)
