"""Escaping remote strings before they reach a user's terminal: one helper for every human-readable view.

Peers choose their device description, job names, addresses, refusal reasons and every other string a view
may show; a raw ESC, CSI or OSC sequence in one of them would drive the user's terminal (move the cursor,
rewrite the screen, set the window title, or worse on some terminals). :func:`safe_text` replaces every C0
and C1 control character, DEL, and the invisible and bidirectional formatting characters (which can make a
line read differently from what it holds) with a visible ``\\xNN`` / ``\\uNNNN`` escape, and bounds the
length. :func:`safe_tree` does that to every string (keys included) of a JSON-like value; the CLI passes
each daemon answer through it before rendering a human view (``--json`` output is escaped by ``json.dumps``,
which writes every non-ASCII and control character as ``\\uNNNN``).
"""

from __future__ import annotations

import re
from typing import Any

#: C0 controls but tab, DEL, C1 controls, zero-width and bidi controls, line/paragraph separators, BOM.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")
#: Longest string a view shows (remote strings are bounded on the wire, but a view line should stay a line).
MAX_SHOWN = 512


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: str, max_len: int | None = MAX_SHOWN) -> str:
    """``text`` with every control/formatting character escaped, cut to ``max_len`` characters (``...``
    marks a cut)."""
    out = _UNSAFE.sub(_escape, text)
    if max_len is not None and len(out) > max_len:
        out = out[: max(0, max_len - 3)] + "..."
    return out


def safe_tree(value: Any, max_len: int | None = MAX_SHOWN) -> Any:
    """A copy of a JSON-like value (dicts, lists, tuples, scalars) with every string passed through
    :func:`safe_text`."""
    if isinstance(value, str):
        return safe_text(value, max_len)
    if isinstance(value, dict):
        return {safe_tree(k, max_len): safe_tree(v, max_len) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [safe_tree(v, max_len) for v in value]
    return value
