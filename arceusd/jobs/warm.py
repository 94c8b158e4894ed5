"""A warm interpreter: a child process that has already imported torch and the torch-side modules, waiting to
become one of the daemon's child programs (a stage worker, a filework task) the moment one is needed.

Why: every recovery starts new children (re-slicing the checkpoint, then the stage worker), and each used to pay
the interpreter's start and torch's import (1-2 s each on a laptop's cores, more under load) on the critical
path from a lost member to the first step after it (issue 33). The daemon keeps a couple of these ready
(:mod:`arceusd.jobs.warm_pool`) and hands one its program.

Protocol (``python -m arceusd.jobs.warm``; only the daemon that started it talks to it, over its stdin pipe):
one JSON line ``{"module": M, "argv": [...], "stderr": PATH | null}`` where ``M`` is one of :data:`PROGRAMS`.
The child points its stderr at ``PATH`` (appending), sets ``sys.argv`` and runs ``M`` as ``__main__``; from
then on its stdin, stdout and exit code are that program's, exactly as if it had been started as
``python -m M ...``. The hand-over line is read from the file descriptor one byte at a time, so nothing meant
for the program is buffered away from it. End of input before a line (the daemon exited) ends the child. It
imports at nice 19 (:data:`PRELOAD_NICENESS`) and hands the program the daemon's priority back where it may.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys

# The programs a warm interpreter may become: the daemon's own torch children, never anything else.
PROGRAMS = ("arceusd.worker", "arceusd.jobs.filework")
MAX_LINE = 64 * 1024


def _preload() -> None:
    """Import what the programs import at start (torch: most of the cost). Not transformers: importing it in
    every warm interpreter of every daemon cost seconds of CPU beside training and delayed a plan's first commit
    (its shapes child waited in a half-warm interpreter); a stock-model worker imports it itself."""
    import torch  # noqa: F401

    import arceusd.jobs.filework
    import arceusd.jobs.recovery
    import arceusd.jobs.reslice
    import arceusd.worker.process  # noqa: F401


def _read_line(fd: int) -> bytes | None:
    line = bytearray()
    while len(line) < MAX_LINE:
        byte = os.read(fd, 1)
        if not byte:
            return None
        if byte == b"\n":
            return bytes(line)
        line += byte
    return None


def parse_handover(line: bytes) -> tuple[str, list[str], str | None]:
    """The program, its arguments and its stderr path from a hand-over line; ValueError when it is not one."""
    order = json.loads(line)
    if not isinstance(order, dict):
        raise ValueError("the hand-over line is not a JSON object")
    module, argv, stderr = order.get("module"), order.get("argv"), order.get("stderr")
    if module not in PROGRAMS:
        raise ValueError(f"{module!r} is not a program a warm interpreter runs (one of {', '.join(PROGRAMS)})")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a list of strings")
    if stderr is not None and not isinstance(stderr, str):
        raise ValueError("stderr must be a path or null")
    return str(module), [str(a) for a in argv], stderr


PRELOAD_NICENESS = 19
"""The warm interpreter imports at the lowest CPU priority: its imports run beside training and the daemons'
membership timers, which a burst of torch imports on two cores starved into false deaths."""


def main() -> None:
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PRELOAD_NICENESS)
    _preload()
    line = _read_line(0)
    if line is None:
        os._exit(0)  # the daemon went away before it needed us
    try:
        module, argv, stderr = parse_handover(line)
    except ValueError as exc:
        print(f"warm interpreter: {exc}", file=sys.stderr)
        os._exit(2)
    if stderr is not None:
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    # the program runs at the daemon's priority again where this user may raise it back (root, CAP_SYS_NICE, a
    # generous RLIMIT_NICE); elsewhere it stays niced, like any background work of a lent device
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
