"""Failpoints: named places where a test makes this process fail on purpose (fault injection, as etcd's gofail
or FreeBSD's fail(9) do), so crash-recovery tests can crash at an exact point instead of racing a timer.

Off unless the environment sets ``ARCEUSD_FAILPOINTS``, a ``;``-separated list of ``name=action``:

- ``kill-once:<marker path>``: SIGKILL this process the first time ``name`` is reached (the marker file, created
  atomically, makes it once across every process and restart that shares the path);
- ``sleep:<seconds>``: pause there.

Places: ``checkpoint.before-rename`` (a checkpoint shard is fully written to its temporary file, not yet
renamed); ``worker.step`` (a stage worker is about to run a training step: tests slow training down with
``sleep`` without changing what it computes).
"""

from __future__ import annotations

import os
import signal
import time

ENV = "ARCEUSD_FAILPOINTS"


def _table() -> dict[str, str]:
    raw = os.environ.get(ENV, "")
    table = {}
    for item in raw.split(";"):
        name, sep, action = item.strip().partition("=")
        if sep and name:
            table[name] = action
    return table


def hit(name: str) -> None:
    """Run the action configured for ``name`` (nothing when none is)."""
    action = _table().get(name)
    if not action:
        return
    kind, _, arg = action.partition(":")
    if kind == "kill-once":
        try:
            os.close(os.open(arg, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "sleep":
        time.sleep(float(arg))
    else:
        raise ValueError(f"{ENV}: unknown action {action!r} for {name!r} (use kill-once:<path> or sleep:<s>)")


__all__ = ["ENV", "hit"]
