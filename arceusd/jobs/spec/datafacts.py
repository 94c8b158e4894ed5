"""What a job spec needs to know about its data files, read cheaply at validation time.

Owns: inspecting the data a spec names (MNIST: the IDX headers and file digests; text: vocabulary size,
length, split sizes and digest) without building training tensors. Raises ``DataError`` naming the file.

Content digest (``sha256`` in the spec): for text, sha256 of the file's bytes; for MNIST,
``sha256(hex(sha256(images)) + hex(sha256(labels)))`` so both files count.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from arceusd.data.mnist_files import find_mnist_files, read_mnist_info
from arceusd.data.text_files import file_sha256, read_text, split_point


@dataclass(frozen=True)
class MnistFacts:
    count: int
    features: int
    images: str
    labels: str
    sha256: str


@dataclass(frozen=True)
class TextFacts:
    length: int
    vocab_size: int
    train_tokens: int
    val_tokens: int
    sha256: str


def mnist_facts(directory: Path, images: str | None, labels: str | None) -> MnistFacts:
    """Headers and digests of the MNIST pair in ``directory`` (named, or found by ``find_mnist_files``)."""
    if images is None or labels is None:
        ip, lp = find_mnist_files(directory)
    else:
        ip, lp = directory / images, directory / labels
    info = read_mnist_info(ip, lp)
    combined = hashlib.sha256((file_sha256(ip) + file_sha256(lp)).encode()).hexdigest()
    return MnistFacts(count=info.count, features=info.features, images=ip.name, labels=lp.name, sha256=combined)


def text_facts(path: Path, val_fraction: float) -> TextFacts:
    """Length, vocabulary size, split sizes and digest of a UTF-8 text file."""
    text = read_text(path)
    cut = split_point(len(text), val_fraction)
    return TextFacts(
        length=len(text),
        vocab_size=len(set(text)),
        train_tokens=cut,
        val_tokens=len(text) - cut,
        sha256=file_sha256(path),
    )
