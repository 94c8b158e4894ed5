"""Checking an initial-weights file against the config without reading its tensors (torch-free).

Owns: :func:`read_header` and :func:`header_of` (a safetensors file's JSON header, bounded) and
:func:`weights_problems` (one line per problem: a missing key, an unknown key, a wrong shape or dtype, naming the
key and what the config expects). The job's owner runs it when the spec is read; workers read only their blocks'
tensors (:mod:`arceusd.models.hf.weights`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import expected_tensors, untied_head_source

MAX_HEADER_BYTES = 100 << 20
FLOAT_DTYPES = ("F32", "F16", "BF16")


def header_of(f: BinaryIO, where: str) -> tuple[dict[str, Any], int]:
    """The safetensors header of the open file ``f`` at its start (``__metadata__`` dropped, its size bounded by
    :data:`MAX_HEADER_BYTES`) and where its data starts; ``ValueError`` naming ``where`` when it is not one."""
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError(f"{where} is not a safetensors file (shorter than its 8-byte header length)")
    (size,) = struct.unpack("<Q", raw)
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"{where}: header of {size} bytes; at most {MAX_HEADER_BYTES}")
    try:
        header = json.loads(f.read(size))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where} is not a safetensors file: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where} is not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    return header, 8 + size


def read_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file (``__metadata__`` dropped); ``ValueError`` when it is not one."""
    with path.open("rb") as f:
        return header_of(f, str(path))[0]


def weights_problems(path: Path, config: HFModelConfig) -> list[str]:
    """Everything wrong between ``path``'s tensors and ``config``'s, or []."""
    try:
        header = read_header(path)
    except (OSError, ValueError) as e:
        return [str(e)]
    expected = expected_tensors(config)
    problems: list[str] = []
    missing = sorted(k for k in set(expected) - set(header) if untied_head_source(config, k) not in header)
    tied_copy = {"lm_head.weight"} if config.tied else set()  # a tied checkpoint may also store the head
    extra = sorted(set(header) - set(expected) - tied_copy)
    if missing:
        problems.append(f"{len(missing)} tensor(s) the config needs are missing, e.g. {missing[0]}")
    if extra:
        problems.append(
            f"{len(extra)} tensor(s) the config does not have, e.g. {extra[0]} (another architecture or size?)"
        )
    for key, (_, _, shape) in expected.items():
        entry = header.get(key, header.get(untied_head_source(config, key) or ""))
        if not isinstance(entry, dict):
            continue
        if tuple(entry.get("shape", ())) != shape:
            problems.append(f"{key} has shape {entry.get('shape')}, the config says {list(shape)}")
        if entry.get("dtype") not in FLOAT_DTYPES:
            problems.append(f"{key} is {entry.get('dtype')}; allowed: {', '.join(FLOAT_DTYPES)}")
    return problems[:8]


__all__ = ["MAX_HEADER_BYTES", "header_of", "read_header", "weights_problems"]
