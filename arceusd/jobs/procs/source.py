"""From a validated job spec to the batch source the job owner serves.

Owns: loading a spec's data set with the spec's settings and wrapping it in the matching ``BatchSource``
(``MnistBatches`` or ``TextBatches``), seeded with the spec's seed. When the spec recorded the data's digest
(``data.sha256``), the files are checked against it first, so a job never silently trains on changed data.
"""

from __future__ import annotations

from arceusd.data.batches import BatchSource, MnistBatches, TextBatches
from arceusd.data.errors import DataError
from arceusd.data.mnist import load_mnist
from arceusd.data.text import file_sha256, load_text
from arceusd.jobs.spec.datafacts import mnist_facts, text_facts
from arceusd.jobs.spec.parsed import JobSpec, MnistDataSpec, TokensDataSpec, resolve_path
from arceusd.models.config import GPTConfig
from arceusd.models.hf.config import HFModelConfig


def open_batch_source(spec: JobSpec, *, eval_batch_size: int = 1000) -> BatchSource:
    """Load the spec's data (paths relative to ``spec.base_dir``) and return its batch source.

    Error handling: ``DataError`` if the files are missing, malformed, or no longer match ``data.sha256``.
    """
    path = spec.data_path()
    t = spec.training
    if isinstance(spec.data, MnistDataSpec):
        d = spec.data
        if d.sha256 is not None:
            _same(d.sha256, mnist_facts(path, d.images, d.labels).sha256, str(path))
        data = load_mnist(
            path,
            train_count=d.train_count,
            holdout_count=d.holdout_count,
            mean=d.mean,
            std=d.std,
            split_seed=d.split_seed,
            images=d.images,
            labels=d.labels,
        )
        return MnistBatches(data, t.batch_size, spec.seed, eval_batch_size=eval_batch_size)
    if isinstance(spec.data, TokensDataSpec):
        return _tokens(spec)
    if not isinstance(spec.model, GPTConfig):
        raise DataError(f"a text data set needs a gpt model, got {type(spec.model).__name__}")
    if spec.data.sha256 is not None:
        _same(spec.data.sha256, text_facts(path, spec.data.val_fraction).sha256, str(path))
    text = load_text(path, val_fraction=spec.data.val_fraction)
    if text.vocab.size > spec.model.vocab_size:
        size = spec.model.vocab_size
        raise DataError(f"{path}: {text.vocab.size} distinct characters exceed the model's vocab_size {size}")
    return TextBatches(text, spec.model.block_size, t.batch_size, spec.seed, eval_iters=t.eval_iters)


def _tokens(spec: JobSpec) -> BatchSource:
    """A stock LM's tokenized data (``arceusd/data/tokenized.py``), its files checked against the spec's digests."""
    from arceusd.data.tokenized import TokenBatches, load_tokens  # local: tokenizers, for a stock LM's data only

    d, t = spec.data, spec.training
    assert isinstance(d, TokensDataSpec)
    if not isinstance(spec.model, HFModelConfig):
        kind = type(spec.model).__name__
        raise DataError(f"a tokens data set needs a stock causal LM (model.type = 'hf'), got {kind}")
    path, tokenizer = spec.data_path(), resolve_path(d.tokenizer, spec.base_dir)
    if d.sha256 is not None:
        _same(d.sha256, file_sha256(path), str(path))
    if d.tokenizer_sha256 is not None:
        _same(d.tokenizer_sha256, file_sha256(tokenizer), str(tokenizer))
    data = load_tokens(path, tokenizer, fmt=d.format, text_field=d.text_field, val_fraction=d.val_fraction)
    if data.vocab_size > spec.model.vocab_size:
        raise DataError(f"{tokenizer}: {data.vocab_size} tokens exceed the model's vocab_size {spec.model.vocab_size}")
    return TokenBatches(data, spec.model.block_size, t.batch_size, spec.seed, eval_iters=t.eval_iters)


def _same(expected: str, actual: str, where: str) -> None:
    if expected != actual:
        raise DataError(
            f"{where}: data digest is {actual} but the job spec recorded {expected}; "
            "the data changed since the job was submitted"
        )
