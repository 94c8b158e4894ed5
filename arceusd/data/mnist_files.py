"""MNIST files without torch: where they are in a folder and what their headers say.

Owns: the file names looked for (the first pair present of ``train-*`` then ``t10k-*``, gzipped or plain), the
data set's constants (magics, class count, normalisation), and the cheap header check of a pair
(:func:`read_mnist_info`). :mod:`arceusd.data.mnist` loads the tensors; the daemon, which never imports torch,
checks a job's data with this module only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from arceusd.data.errors import DataError
from arceusd.data.idx_header import IdxHeader, read_idx_header

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049
NUM_CLASSES = 10
DEFAULT_MEAN = 0.1307
DEFAULT_STD = 0.3081

#: Candidate (images, labels) file names, in order of preference.
MNIST_FILE_PAIRS: tuple[tuple[str, str], ...] = (
    ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)


def find_mnist_files(directory: str | Path) -> tuple[Path, Path]:
    """Return the (images, labels) paths of the first MNIST file pair present in ``directory``."""
    d = Path(directory)
    if not d.is_dir():
        raise DataError(f"{d}: not a directory (expected a folder holding MNIST IDX files)")
    for images, labels in MNIST_FILE_PAIRS:
        if (d / images).is_file() and (d / labels).is_file():
            return d / images, d / labels
    names = ", ".join(f"{i} + {lab}" for i, lab in MNIST_FILE_PAIRS)
    raise DataError(f"{d}: no MNIST file pair found; expected one of: {names}")


@dataclass(frozen=True)
class MnistInfo:
    """What the headers say, without reading the payloads: example count and image size."""

    count: int
    rows: int
    cols: int

    @property
    def features(self) -> int:
        return self.rows * self.cols


def _check_headers(images: Path, labels: Path, img: IdxHeader, lab: IdxHeader) -> MnistInfo:
    if img.magic != IMAGES_MAGIC:
        raise DataError(f"{images}: IDX magic {img.magic}, expected {IMAGES_MAGIC} (uint8 images, 3 dims)")
    if lab.magic != LABELS_MAGIC:
        raise DataError(f"{labels}: IDX magic {lab.magic}, expected {LABELS_MAGIC} (uint8 labels, 1 dim)")
    if img.shape[0] != lab.shape[0]:
        raise DataError(f"{images} holds {img.shape[0]} images but {labels} holds {lab.shape[0]} labels")
    return MnistInfo(count=img.shape[0], rows=img.shape[1], cols=img.shape[2])


def read_mnist_info(images: str | Path, labels: str | Path) -> MnistInfo:
    """Validate the two headers against each other (cheap) and report count and image size."""
    ip, lp = Path(images), Path(labels)
    return _check_headers(ip, lp, read_idx_header(ip), read_idx_header(lp))


__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "IMAGES_MAGIC",
    "LABELS_MAGIC",
    "MNIST_FILE_PAIRS",
    "NUM_CLASSES",
    "MnistInfo",
    "find_mnist_files",
    "read_mnist_info",
]
