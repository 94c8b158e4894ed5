"""Job specs from Python: a spec file's path or a dict in the spec's schema, validated by the code
``arceusd submit`` uses (:mod:`arceusd.jobs.spec.schema`) before anything is sent.

The daemon reads a spec from a file (the control channel carries its path, never code or pickles), so a dict is
written as JSON into a folder first (:func:`spec_file`), its relative paths made absolute against ``base_dir``
(the notebook's working folder unless given): ``model.config``, ``model.weights``, ``data.dir``, ``data.path``
and ``data.tokenizer``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arceus.errors import SpecError
from arceusd.jobs.spec.fields import SpecProblem
from arceusd.jobs.spec.parsed import resolve_path
from arceusd.jobs.spec.schema import JobSpec, JobSpecError, load_spec, parse_spec

SpecInput = str | os.PathLike[str] | Mapping[str, Any]
"""A spec file's path (TOML, or JSON by its ``.json`` suffix), or the spec as a dict."""

PATH_FIELDS = (("model", "config"), ("model", "weights"), ("data", "dir"), ("data", "path"), ("data", "tokenizer"))
"""The fields that name files, resolved from the spec's folder."""

SPEC_FILE = "job.json"


def _plain(v: Any) -> Any:
    """``v`` as JSON data: mappings as dicts, tuples as lists, paths as strings."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return os.fspath(v) if isinstance(v, os.PathLike) else v


def absolute_doc(doc: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """A plain copy of ``doc`` whose file fields are absolute paths (relative ones joined to ``base_dir``)."""
    out: dict[str, Any] = _plain(doc)
    for table, key in PATH_FIELDS:
        section = out.get(table)
        if isinstance(section, dict) and isinstance(section.get(key), str):
            section[key] = str(resolve_path(section[key], base_dir))
    return out


def _base(base_dir: str | os.PathLike[str] | None) -> Path:
    return Path(base_dir).expanduser().absolute() if base_dir is not None else Path.cwd()


def validate(spec: SpecInput, base_dir: str | os.PathLike[str] | None = None) -> JobSpec:
    """The validated spec, its data files read and digested as the owner's daemon will.

    Error handling: :class:`SpecError`, one line per problem naming the field and the fix.
    """
    try:
        if isinstance(spec, Mapping):
            base = _base(base_dir)
            return parse_spec(absolute_doc(spec, base), base_dir=base, source="job spec (dict)")
        return load_spec(Path(spec).expanduser())
    except JobSpecError as exc:
        raise SpecError(str(exc), exc.problems) from None


def spec_file(spec: SpecInput, folder: Path, base_dir: str | os.PathLike[str] | None = None) -> Path:
    """The file the daemon reads for ``spec``: the path itself, or the dict written as ``folder/job.json``."""
    if not isinstance(spec, Mapping):
        return Path(spec).expanduser().absolute()
    try:
        text = json.dumps(absolute_doc(spec, _base(base_dir)), indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problem = SpecProblem("(top)", f"the spec is not JSON data ({exc}); use strings, numbers, lists and dicts")
        raise SpecError(f"job spec (dict): 1 problem:\n  - {problem}", (problem,)) from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SPEC_FILE
    path.write_text(text + "\n", encoding="utf-8")
    return path


__all__ = ["PATH_FIELDS", "SPEC_FILE", "SpecInput", "absolute_doc", "spec_file", "validate"]
