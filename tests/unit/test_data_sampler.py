"""Samplers and batch sources: determinism, epoch coverage, and exact resume from a serialised cursor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.data.batches import MnistBatches, TextBatches
from arceusd.data.errors import DataError
from arceusd.data.mnist import MnistData
from arceusd.data.sampler import (
    Cursor,
    EpochSampler,
    Sampler,
    WindowSampler,
    cursor_at,
    derive_seed,
    global_step,
    iterate,
)
from arceusd.data.text import CharVocab, TextData, load_text

DATA = Path(__file__).resolve().parents[2] / "data"


def _uninterrupted(sampler: Sampler, total: int) -> list[list[int]]:
    return [idx.tolist() for _, idx in iterate(sampler, limit=total)]


def _interrupted(make_sampler: Callable[[], Sampler], total: int, cut: int) -> list[list[int]]:
    """Run ``cut`` steps, save the cursor as JSON, build a fresh sampler, resume for the rest."""
    first = make_sampler()
    out = [idx.tolist() for _, idx in iterate(first, limit=cut)]
    saved = json.dumps(cursor_at(first, cut).to_dict())
    second = make_sampler()
    resumed = Cursor.from_dict(json.loads(saved))
    out += [idx.tolist() for _, idx in iterate(second, resumed, limit=total - cut)]
    return out


def test_epoch_sampler_covers_each_epoch_once_and_reshuffles() -> None:
    s = EpochSampler(size=100, batch_size=10, seed=3)
    assert s.steps_per_epoch == 10
    epochs = [torch.cat([s.indices(e * 10 + k) for k in range(10)]) for e in range(3)]
    for perm in epochs:
        assert torch.equal(perm.sort().values, torch.arange(100))
    assert not torch.equal(epochs[0], epochs[1]) and not torch.equal(epochs[1], epochs[2])
    assert cursor_at(s, 23) == Cursor(epoch=2, step=3)
    assert global_step(s, Cursor(epoch=2, step=3)) == 23


def test_epoch_sampler_drop_last() -> None:
    dropped = EpochSampler(size=25, batch_size=10, seed=0)
    assert dropped.steps_per_epoch == 2
    assert all(dropped.indices(k).numel() == 10 for k in range(6))
    kept = EpochSampler(size=25, batch_size=10, seed=0, drop_last=False)
    assert kept.steps_per_epoch == 3
    assert [kept.indices(k).numel() for k in range(3)] == [10, 10, 5]
    assert torch.equal(torch.cat([kept.indices(k) for k in range(3)]).sort().values, torch.arange(25))
    with pytest.raises(DataError, match="batch_size 30 is larger than the 25 examples"):
        EpochSampler(size=25, batch_size=30, seed=0)


def test_samplers_are_pure_functions_of_config_and_step() -> None:
    a, b = EpochSampler(1000, 32, seed=5), EpochSampler(1000, 32, seed=5)
    # Asking in a different order (and skipping around epochs) never changes an answer.
    forward = [a.indices(k).tolist() for k in range(0, 200, 7)]
    backward = [b.indices(k).tolist() for k in reversed(range(0, 200, 7))][::-1]
    assert forward == backward
    assert EpochSampler(1000, 32, seed=6).indices(0).tolist() != a.indices(0).tolist()
    w1, w2 = WindowSampler(5000, 16, 8, seed=1), WindowSampler(5000, 16, 8, seed=1)
    assert w1.indices(42).tolist() == w2.indices(42).tolist()
    assert w1.indices(42).tolist() != w1.indices(43).tolist()
    offsets = torch.cat([w1.indices(k) for k in range(200)])
    assert int(offsets.min()) >= 0 and int(offsets.max()) <= 5000 - 16 - 1
    assert derive_seed(1, "epoch", 0) == derive_seed(1, "epoch", 0) != derive_seed(1, "epoch", 1)
    assert 0 <= derive_seed(-5, "x") < 2**63


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 60),
    batch=st.integers(1, 16),
    seed=st.integers(-(2**40), 2**40),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_epoch_sampler_resume_equals_uninterrupted(
    size: int, batch: int, seed: int, drop_last: bool, data: st.DataObject
) -> None:
    if drop_last and batch > size:
        batch = size
    total = data.draw(st.integers(1, 40), label="total")
    cut = data.draw(st.integers(0, total), label="cut")
    ref = _uninterrupted(EpochSampler(size, batch, seed, drop_last=drop_last), total)
    assert _interrupted(lambda: EpochSampler(size, batch, seed, drop_last=drop_last), total, cut) == ref


@settings(max_examples=40, deadline=None)
@given(
    n_tokens=st.integers(2, 500),
    block=st.integers(1, 32),
    batch=st.integers(1, 8),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_window_sampler_resume_equals_uninterrupted(
    n_tokens: int, block: int, batch: int, seed: int, data: st.DataObject
) -> None:
    block = min(block, n_tokens - 1)
    total = data.draw(st.integers(1, 30), label="total")
    cut = data.draw(st.integers(0, total), label="cut")
    ref = _uninterrupted(WindowSampler(n_tokens, block, batch, seed), total)
    assert _interrupted(lambda: WindowSampler(n_tokens, block, batch, seed), total, cut) == ref


def test_cursor_validation() -> None:
    assert Cursor.from_dict({"epoch": 2, "step": 5}) == Cursor(2, 5)
    assert Cursor(2, 5).to_dict() == {"epoch": 2, "step": 5}
    for bad in [
        {"epoch": 1},
        {"epoch": -1, "step": 0},
        {"epoch": 1, "step": 1.5},
        [1, 2],
        {"epoch": True, "step": 0},
    ]:
        with pytest.raises(DataError, match="sampler cursor"):
            Cursor.from_dict(bad)
    with pytest.raises(DataError, match="outside an epoch of 3 steps"):
        global_step(EpochSampler(30, 10, 0), Cursor(0, 3))


def _tiny_mnist() -> MnistData:
    g = torch.Generator().manual_seed(0)
    return MnistData(
        train_images=torch.randn(50, 784, generator=g),
        train_labels=torch.randint(0, 10, (50,), generator=g),
        holdout_images=torch.randn(23, 784, generator=g),
        holdout_labels=torch.randint(0, 10, (23,), generator=g),
    )


def test_mnist_batches_follow_the_sampler_and_resume() -> None:
    d = _tiny_mnist()
    src = MnistBatches(d, batch_size=8, seed=11, eval_batch_size=10)
    assert src.steps_per_epoch == 6
    ref_sampler = EpochSampler(50, 8, 11)
    for step in (0, 5, 6, 17):
        x, y = src.batch(step)
        idx = ref_sampler.indices(step)
        assert torch.equal(x, d.train_images[idx]) and torch.equal(y, d.train_labels[idx])
    resumed = MnistBatches(d, batch_size=8, seed=11)
    start = resumed.step_of(Cursor.from_dict(src.cursor(9).to_dict()))
    assert start == 9
    for k in range(9, 20):
        assert torch.equal(resumed.batch(k)[0], src.batch(k)[0])
    ev = list(src.eval_batches())
    assert [len(y) for _, y in ev] == [10, 10, 3]
    assert torch.equal(torch.cat([x for x, _ in ev]), d.holdout_images)


def test_text_batches_windows_eval_and_resume() -> None:
    text = "the quick brown fox jumps over the lazy dog. " * 20
    vocab = CharVocab.from_text(text)
    ids = vocab.encode(text)
    d = TextData(vocab=vocab, train=ids[:800], val=ids[800:])
    src = TextBatches(d, block_size=12, batch_size=4, seed=2, eval_iters=3)
    x, y = src.batch(5)
    assert x.shape == y.shape == (4, 12)
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in range(4):
        o = text.index(vocab.decode(x[row]))  # every window is a real slice of the training text
        assert vocab.decode(y[row]) == text[o + 1 : o + 13]
    ev1, ev2 = list(src.eval_batches()), list(src.eval_batches())
    assert len(ev1) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(ev1, ev2, strict=True))
    again = TextBatches(d, block_size=12, batch_size=4, seed=2)
    k = again.step_of(Cursor.from_dict(src.cursor(37).to_dict()))
    assert k == 37 and torch.equal(again.batch(k)[0], src.batch(37)[0])
    with pytest.raises(DataError, match="validation split has 5 tokens"):
        TextBatches(TextData(vocab, ids[:800], ids[800:805]), block_size=12, batch_size=4, seed=0)


def test_text_batches_on_tiny_shakespeare() -> None:
    d = load_text(DATA / "tinyshakespeare" / "input.txt")
    src = TextBatches(d, block_size=64, batch_size=12, seed=0)
    assert src.steps_per_epoch == d.train.numel() // (12 * 64)
    x, y = src.batch(0)
    assert x.shape == (12, 64) and int(x.max()) < 65 and torch.equal(x[:, 1:], y[:, :-1])
