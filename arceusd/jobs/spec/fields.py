"""A problem-collecting reader for nested spec tables (TOML or JSON already parsed into dicts).

Owns: type and range checks of single fields, each failure recorded as a :class:`SpecProblem` (field path,
what was wrong, what is allowed) instead of raised, so one pass reports every problem in a spec. Readers
return ``None`` for a missing-but-required or invalid field; callers skip cross-field checks that depend on
it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class SpecProblem:
    """One problem: ``path`` is the dotted field path (``training.batch_size``); ``message`` what and what's
    allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class _Missing:
    def __repr__(self) -> str:
        return "REQUIRED"


#: Marks a field without a default: absent means a problem.
REQUIRED: Final = _Missing()


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class FieldReader:
    """Reads fields and collects problems; see the module docstring."""

    def __init__(self) -> None:
        self.problems: list[SpecProblem] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(SpecProblem(path, message))

    def join(self, prefix: str, key: str) -> str:
        return f"{prefix}.{key}" if prefix else key

    def table(self, parent: Mapping[str, Any], key: str, prefix: str, *, required: bool) -> dict[str, Any] | None:
        path = self.join(prefix, key)
        if key not in parent:
            if required:
                self.problem(path, f"missing table; add a [{path}] section")
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.problem(path, f"must be a table (a [{path}] section), got {_show(value)}")
            return None
        return value

    def unknown_keys(self, tbl: Mapping[str, Any], allowed: Iterable[str], prefix: str) -> None:
        allowed_sorted = sorted(allowed)
        for key in sorted((k for k in tbl if k not in allowed_sorted), key=str):
            hint = difflib.get_close_matches(str(key), allowed_sorted, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.problem(
                self.join(prefix, str(key)),
                f"unknown key{did_you_mean}; allowed here: {', '.join(allowed_sorted)}",
            )

    def _get(self, tbl: Mapping[str, Any], key: str, prefix: str, default: object) -> tuple[Any, bool]:
        """(value, present); records a problem for a missing required field."""
        if key in tbl:
            return tbl[key], True
        if default is REQUIRED:
            self.problem(self.join(prefix, key), "missing required field")
        return default, False

    def integer(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        default: int | _Missing | None = REQUIRED,
        *,
        lo: int | None = None,
        hi: int | None = None,
    ) -> int | None:
        value, present = self._get(tbl, key, prefix, default)
        if not present:
            return None if isinstance(value, _Missing) else value
        path = self.join(prefix, key)
        if not _is_int(value):
            self.problem(path, f"must be an integer, got {_show(value)}")
            return None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            self.problem(path, f"must be {_range(lo, hi)}, got {value}")
            return None
        return int(value)

    def number(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        default: float | _Missing | None = REQUIRED,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
        hi_open: bool = False,
    ) -> float | None:
        value, present = self._get(tbl, key, prefix, default)
        if not present:
            return None if isinstance(value, _Missing) else value
        path = self.join(prefix, key)
        if not (_is_int(value) or isinstance(value, float)):
            self.problem(path, f"must be a number, got {_show(value)}")
            return None
        f = float(value)
        if not math.isfinite(f):
            self.problem(path, f"must be a finite number, got {value}")
            return None
        below = lo is not None and (f <= lo if lo_open else f < lo)
        above = hi is not None and (f >= hi if hi_open else f > hi)
        if below or above:
            self.problem(path, f"must be {_range(lo, hi, lo_open, hi_open)}, got {value}")
            return None
        return f

    def choice(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        choices: Iterable[str],
        default: str | _Missing | None = REQUIRED,
    ) -> str | None:
        value, present = self._get(tbl, key, prefix, default)
        if not present:
            return None if isinstance(value, _Missing) else value
        allowed = list(choices)
        if not isinstance(value, str) or value not in allowed:
            self.problem(self.join(prefix, key), f"got {_show(value)}; allowed: {', '.join(repr(c) for c in allowed)}")
            return None
        return value

    def string(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        default: str | _Missing | None = REQUIRED,
        *,
        max_len: int = 4096,
    ) -> str | None:
        value, present = self._get(tbl, key, prefix, default)
        if not present:
            return None if isinstance(value, _Missing) else value
        path = self.join(prefix, key)
        if not isinstance(value, str) or not value:
            self.problem(path, f"must be a non-empty string, got {_show(value)}")
            return None
        if len(value) > max_len or "\x00" in value:
            self.problem(path, f"must be at most {max_len} characters, no NUL; got {len(value)} characters")
            return None
        return value

    def boolean(self, tbl: Mapping[str, Any], key: str, prefix: str, default: bool) -> bool | None:
        value, present = self._get(tbl, key, prefix, default)
        if present and not isinstance(value, bool):
            self.problem(self.join(prefix, key), f"must be true or false, got {_show(value)}")
            return None
        return bool(value)

    def int_list(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        *,
        min_len: int,
        max_len: int,
        lo: int,
        hi: int,
    ) -> tuple[int, ...] | None:
        value, present = self._get(tbl, key, prefix, REQUIRED)
        if not present:
            return None
        path = self.join(prefix, key)
        if not isinstance(value, list) or not all(_is_int(v) for v in value):
            self.problem(path, f"must be a list of integers, got {_show(value)}")
            return None
        if not min_len <= len(value) <= max_len:
            self.problem(path, f"must have {min_len} to {max_len} entries, got {len(value)}")
            return None
        bad = [v for v in value if not lo <= v <= hi]
        if bad:
            self.problem(path, f"every entry must be {_range(lo, hi)}, got {bad[0]}")
            return None
        return tuple(value)

    def number_pair(
        self,
        tbl: Mapping[str, Any],
        key: str,
        prefix: str,
        default: tuple[float, float],
        *,
        lo: float,
        hi: float,
    ) -> tuple[float, float] | None:
        value, present = self._get(tbl, key, prefix, default)
        if not present:
            return default
        path = self.join(prefix, key)
        ok = isinstance(value, list | tuple) and len(value) == 2
        ok = ok and all((_is_int(v) or isinstance(v, float)) and math.isfinite(v) for v in value)

        if not ok:
            self.problem(path, f"must be a list of two numbers, got {_show(value)}")
            return None
        a, b = (float(v) for v in value)
        if not (lo <= a < hi and lo <= b < hi):
            self.problem(path, f"both entries must be {_range(lo, hi, hi_open=True)}, got {[a, b]}")
            return None
        return (a, b)


def _range(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    left = "> " if lo_open else ">= "
    right = "< " if hi_open else "<= "
    if lo is not None and hi is not None:
        return f"{left}{lo} and {right}{hi}"
    if lo is not None:
        return f"{left}{lo}"
    if hi is not None:
        return f"{right}{hi}"
    return "any value"
