"""Tokenized text data for stock causal LMs: a ``tokenizers`` tokenizer.json over a UTF-8 text or JSONL file.

Owns: :func:`load_tokens` (tokenize once, cache the ids by content hash, split) and :class:`TokenBatches` (the
``BatchSource`` the job owner serves). Workers only (imports torch and ``tokenizers``).

Documents: a text file is one document; a JSONL file has one JSON object per line whose ``text_field`` string is a
document (blank lines skipped). Documents are joined into one stream of ids, separated by the tokenizer's
end-of-text token when it has one (``<|endoftext|>``, ``</s>`` or ``<eos>``). The split is the text jobs': the
first ``1 - val_fraction`` of the ids train, the rest validate; batches are ``(x, y)`` windows of the context
length (``y`` shifted by one) at seeded random offsets, exactly as :class:`arceusd.data.batches.TextBatches`.

Cache: ``<cache_dir>/<sha256 of (tokenizer bytes, data bytes, format, field)>.u32`` holds the ids as
little-endian uint32; it is written atomically and trusted only under that name, so a changed tokenizer or file
tokenizes again. The default folder is ``$ARCEUS_TOKEN_CACHE`` or ``~/.cache/arceus/tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from tokenizers import Tokenizer

from arceusd.data.batches import TextBatches
from arceusd.data.errors import DataError
from arceusd.data.text_files import DEFAULT_MAX_TEXT_BYTES, split_point

TextFormat = Literal["text", "jsonl"]
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>")
MAX_TOKENIZER_BYTES = 64 << 20


@dataclass(frozen=True)
class TokenData:
    """Token ids (int64, 1-D) of the training and validation splits, and the tokenizer's vocabulary size."""

    train: torch.Tensor
    val: torch.Tensor
    vocab_size: int


def default_cache_dir() -> Path:
    env = os.environ.get("ARCEUS_TOKEN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "arceus" / "tokens"


def _read(path: Path, limit: int, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > limit:
            raise DataError(f"{path}: the {what} is {size} bytes; at most {limit}")
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def open_tokenizer(path: Path) -> Tokenizer:
    """A tokenizer.json (``tokenizers``' own format: declarative, no code); ``DataError`` if it is not one."""
    raw = _read(path, MAX_TOKENIZER_BYTES, "tokenizer")
    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # the library raises its own exception types for a malformed file
        raise DataError(f"{path} is not a tokenizers tokenizer.json: {e}") from None


def eos_id(tok: Tokenizer) -> int | None:
    for name in EOS_NAMES:
        i = tok.token_to_id(name)
        if i is not None:
            return int(i)
    return None


def documents(raw: bytes, fmt: TextFormat, field: str, where: str) -> list[str]:
    """The documents of a data file (see the module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where} is not UTF-8 text: {e}") from None
    if fmt == "text":
        return [text]
    docs: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} line {n} is not JSON: {e}") from None
        value = obj.get(field) if isinstance(obj, dict) else None
        if not isinstance(value, str):
            raise DataError(f"{where} line {n} has no string field {field!r} (data.text_field)")
        docs.append(value)
    if not docs:
        raise DataError(f"{where} has no documents")
    return docs


def tokenize(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """All documents' ids in one int64 stream, end-of-text between documents when the tokenizer has one."""
    sep = eos_id(tok)
    ids: list[int] = []
    for i, enc in enumerate(tok.encode_batch(docs, add_special_tokens=False)):
        if i and sep is not None:
            ids.append(sep)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int64)


def load_tokens(
    path: Path,
    tokenizer: Path,
    *,
    fmt: TextFormat = "text",
    text_field: str = "text",
    val_fraction: float = 0.1,
    cache_dir: Path | None = None,
    max_bytes: int = DEFAULT_MAX_TEXT_BYTES,
) -> TokenData:
    """Tokenize ``path`` with ``tokenizer`` (cached by content hash) and split it."""
    tok_raw = _read(tokenizer, MAX_TOKENIZER_BYTES, "tokenizer")
    data_raw = _read(path, max_bytes, "data file")
    tok = open_tokenizer(tokenizer)
    key = hashlib.sha256()
    for part in (tok_raw, data_raw, fmt.encode(), text_field.encode()):
        key.update(hashlib.sha256(part).digest())
    folder = cache_dir or default_cache_dir()
    cached = folder / f"{key.hexdigest()}.u32"
    ids: torch.Tensor | None = None
    if cached.is_file():
        raw = cached.read_bytes()
        if len(raw) % 4 == 0:
            ids = torch.frombuffer(bytearray(raw), dtype=torch.int32).to(torch.int64)
    if ids is None:
        ids = tokenize(tok, documents(data_raw, fmt, text_field, str(path)))
        _write_cache(cached, ids)
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if ids.numel() and int(ids.max()) >= vocab:
        raise DataError(f"{cached}: a cached id {int(ids.max())} is outside the tokenizer's {vocab} tokens")
    cut = split_point(int(ids.numel()), val_fraction)
    return TokenData(ids[:cut].clone(), ids[cut:].clone(), vocab)


def _write_cache(path: Path, ids: torch.Tensor) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(ids.to(torch.int32).numpy().astype("<u4").tobytes())
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs tokenizing again


class TokenBatches(TextBatches):
    """Random-window batches over the token stream: ``TextBatches``' sampling and evaluation, with the training
    split checked against the context length first."""

    def __init__(self, data: TokenData, block_size: int, batch_size: int, seed: int, *, eval_iters: int = 20) -> None:
        if data.train.numel() < block_size + 1:
            raise DataError(
                f"the training split has {data.train.numel()} tokens, fewer than the context length "
                f"+ 1 = {block_size + 1}; use more text or a smaller model.block_size"
            )
        super().__init__(data, block_size, batch_size, seed, eval_iters=eval_iters)


__all__ = ["TokenBatches", "TokenData", "documents", "load_tokens", "open_tokenizer", "tokenize"]
