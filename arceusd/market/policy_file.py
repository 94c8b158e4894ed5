"""The ``[policy]`` table of ``<state_dir>/config.toml``: read it into a :class:`~arceusd.market.policy.Policy`
and write it back (``arceusd policy --set`` and the dashboard's form, both through :func:`change_policy`).

Unknown keys and wrong types are errors naming the key and what is allowed, as for the rest of the config.
Writing replaces only the ``[policy]`` table (its lines up to the next table header) and keeps every other
line of the file as it was; the file is replaced atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from arceusd.market.policy import Policy, PolicyError

TABLE = "policy"
_TUPLE_KEYS = ("hours", "owners")


def _expected(key: str) -> str:
    default = getattr(Policy(), key)
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", tuple: "a list"}[type(default)]


def policy_from_table(table: object, source: str) -> Policy:
    """A policy from a parsed TOML table; :class:`PolicyError` names what is wrong."""
    if not isinstance(table, dict):
        raise PolicyError(f"{source}: [{TABLE}] must be a table")
    known = {f.name for f in fields(Policy)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise PolicyError(f"{source}: unknown key policy.{key}; allowed: {', '.join(sorted(known))}")
        default = getattr(Policy(), key)
        if isinstance(default, bool) != isinstance(value, bool):
            raise PolicyError(f"{source}: policy.{key} must be {_expected(key)}, got {value!r}")
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        if isinstance(default, tuple):
            if not isinstance(value, list):
                raise PolicyError(f"{source}: policy.{key} must be a list, got {value!r}")
            value = tuple(value)
        elif not isinstance(value, type(default)):
            raise PolicyError(f"{source}: policy.{key} must be {_expected(key)}, got {value!r}")
        values[key] = value
    try:
        return replace(Policy(), **values)
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None


def load_policy(config_path: Path) -> Policy:
    """The policy in ``config_path`` (defaults when the file or its table is absent)."""
    if not config_path.exists():
        return Policy()
    try:
        with config_path.open("rb") as fh:
            doc = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{config_path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise PolicyError(f"cannot read {config_path}: {exc.strerror}") from None
    return policy_from_table(doc.get(TABLE, {}), str(config_path))


def parse_assignment(text: str) -> tuple[str, object]:
    """``key=value`` with a TOML value (``idle_minutes=10``, ``hours=[22, 7]``, ``require_ac=false``);
    a bare word is a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise PolicyError(f"{text!r} is not key=value (for example idle_minutes=10)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def policy_table_text(policy: Policy) -> str:
    """The ``[policy]`` table, keys that differ from the defaults only."""
    default = asdict(Policy())
    lines = [f"[{TABLE}]"]
    for key, value in asdict(policy).items():
        if value != default[key]:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def save_policy(config_path: Path, policy: Policy) -> None:
    """Replace the ``[policy]`` table of ``config_path`` (created if absent), keeping the rest of the file."""
    try:
        old = config_path.read_text() if config_path.exists() else ""
    except OSError as exc:
        raise PolicyError(f"cannot read {config_path}: {exc.strerror}") from None
    kept: list[str] = []
    inside = False
    for line in old.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            inside = stripped.replace(" ", "") == f"[{TABLE}]"
        if not inside:
            kept.append(line)
    text = "\n".join(kept).rstrip("\n")
    text = (text + "\n\n" if text else "") + policy_table_text(policy)
    tmp = config_path.with_name(config_path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, config_path)
    load_policy(config_path)  # what was written reads back


def set_values(policy: Policy, assignments: list[str], source: str = "arceusd policy --set") -> Policy:
    """``policy`` with each ``key=value`` applied, checked as a file's table would be."""
    table: dict[str, object] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(policy).items()}
    for text in assignments:
        key, value = parse_assignment(text)
        table[key] = value
    return policy_from_table(table, source)


def change_policy(config_path: Path, assignments: list[str], source: str = "arceusd policy --set") -> Policy:
    """Apply ``key=value`` assignments to the ``[policy]`` of ``config_path`` and save it: what ``arceusd policy
    --set`` and the dashboard's form both do. A bad value raises :class:`PolicyError` (naming the key and what
    is allowed) and leaves the file as it was."""
    policy = set_values(load_policy(config_path), assignments, source)
    save_policy(config_path, policy)
    return policy
