"""The DiLoCo witness: the sha256 of a replica's outer anchor and outer momentum at one place and checkpoint
step, computed alike by a worker from its tensors and, without torch, by the leader from the first replica's
checkpoint shard of that place (issue #29 item 6: a witness dispute at a place the leader does not hold).

The witness is the digest of one safetensors image (:func:`arceusd.files.safetensors_image.layout`): the state
tensors whose names end in ``.outer_anchor`` or ``.outer_momentum``, with the metadata ``step``, ``stage`` and
``rank`` (in that order). A checkpoint shard holds those tensors among the rest of its stage's state, so the
leader rebuilds the witness image from the shard's own bytes (:func:`from_shard`); a first-replica device whose
witness is not what its own shard holds contradicts itself.
"""

from __future__ import annotations

import hashlib

from arceusd.files.safetensors_image import ImageError, Part, entries, layout

OUTER_ANCHOR = "outer_anchor"
OUTER_MOMENTUM = "outer_momentum"
SUFFIXES = (f".{OUTER_ANCHOR}", f".{OUTER_MOMENTUM}")
"""The names of the state tensors the witness covers end so."""


def is_outer(name: str) -> bool:
    """Whether the state tensor ``name`` is one the DiLoCo witness covers."""
    return name.endswith(SUFFIXES)


def metadata(step: int, stage: int, rank: int) -> dict[str, str]:
    """The witness image's metadata at ``step``, place (``stage``, ``rank``)."""
    return {"step": str(step), "stage": str(stage), "rank": str(rank)}


def digest_of(image: bytes) -> str:
    """The witness of a witness image (its sha256, hex)."""
    return hashlib.sha256(image).hexdigest()


def from_shard(shard: bytes, step: int, stage: int, rank: int) -> str:
    """The witness the writer of ``shard`` (a checkpoint shard's bytes, untrusted) would have sent for
    ``step`` at (``stage``, ``rank``): the digest of the image of its outer tensors. Raises
    :class:`arceusd.files.safetensors_image.ImageError` when the shard is malformed or holds no outer tensor."""
    found, body = entries(shard)
    view = memoryview(shard)
    parts = [
        Part(name, e.dtype, e.shape, view[body + e.begin : body + e.end]) for name, e in found.items() if is_outer(name)
    ]
    if not parts:
        raise ImageError("the shard holds no outer anchor or momentum")
    return digest_of(layout(parts, metadata(step, stage, rank)))


__all__ = ["OUTER_ANCHOR", "OUTER_MOMENTUM", "SUFFIXES", "digest_of", "from_shard", "is_outer", "metadata"]
