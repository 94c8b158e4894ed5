"""The daemon's side of warm interpreters (:mod:`arceusd.jobs.warm`): start torch children before they are needed.

Owns :class:`WarmPool`: up to ``size`` idle ``python -m arceusd.jobs.warm`` processes. :meth:`WarmPool.spawn`
hands the oldest one its program (a stage worker, a filework task) and starts replacements some seconds later
(:data:`REFILL_DELAY_S`, so they do not compete with the program and the plan's first checkpoint for the cores).
Two are kept: a recovery starts two programs back to back (the re-slicing of the checkpoint, then the worker).
Starting a process is a fork and an exec (milliseconds); the import runs in the child, beside the daemon's event
loop. A warm child that died, or whose hand-over fails, is replaced by a cold start of the same program: the pool
only ever makes a start faster, never fails one. The pool starts empty and fills on first use, so a daemon that
never trains holds no torch processes; idle children exit when the daemon does (their stdin closes).

This is the only place besides the programs' own callers that starts them; the callers get a ``trio.Process``
with the pipes they asked for, as from ``trio.lowlevel.open_process``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

import trio

log = logging.getLogger(__name__)

DEFAULT_SIZE = 2
REFILL_DELAY_S = 15.0


class WarmPool:
    """Idle warm interpreters, oldest first (see the module docstring)."""

    def __init__(self, size: int = DEFAULT_SIZE, refill_delay: float = REFILL_DELAY_S) -> None:
        self.size = size
        self.refill_delay = refill_delay
        self._idle: deque[trio.Process] = deque()
        self.handed = 0  # programs started in a warm interpreter
        self.cold = 0  # programs started cold (pool empty, or the hand-over failed)
        self._refilling = False

    async def fill(self) -> None:
        """Start warm interpreters until ``size`` are idle (dead ones are dropped first)."""
        live = [p for p in self._idle if p.returncode is None]
        self._idle = deque(live)
        while len(self._idle) < self.size:
            try:
                proc = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "arceusd.jobs.warm"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            except OSError as exc:  # out of processes or descriptors: cold starts still work
                log.warning("could not start a warm interpreter: %s", exc)
                return
            self._idle.append(proc)

    async def spawn(self, module: str, argv: list[str], stderr: Path) -> trio.Process:
        """``python -m module *argv`` with piped stdin/stdout and stderr appended to ``stderr``: in a warm
        interpreter when one is idle and alive, else cold; then refill the pool."""
        proc = await self._hand_over(module, argv, stderr)
        self._refill_soon()
        if proc is not None:
            self.handed += 1
            return proc
        self.cold += 1
        with stderr.open("ab") as err:
            return await trio.lowlevel.open_process(
                [sys.executable, "-m", module, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )

    def _refill_soon(self) -> None:
        """Fill the pool ``REFILL_DELAY_S`` from now, once: the program just started gets the cores for its own
        start, and a new plan for its first checkpoint, first (on two cores three torch imports at once slowed a
        job's first start threefold, and a plan's first commit waited on its shapes child)."""
        if self._refilling:
            return
        self._refilling = True

        async def later() -> None:
            try:
                await trio.sleep(self.refill_delay)
                await self.fill()
            except Exception as exc:  # a system task must not raise: the pool only ever makes starts faster
                log.warning("refilling the warm interpreters failed: %s", exc)
            finally:
                self._refilling = False

        trio.lowlevel.spawn_system_task(later)

    async def run(self, module: str, argv: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        """Run ``python -m module *argv`` to its end with ``stdin`` as input: (exit code, stdout, stderr), like
        ``trio.run_process(..., capture_stdout=True, capture_stderr=True, check=False)``."""
        with tempfile.TemporaryDirectory(prefix="arceus-child-") as folder:
            err_path = Path(folder) / "stderr"
            proc = await self.spawn(module, argv, err_path)
            assert proc.stdin is not None and proc.stdout is not None
            out = bytearray()
            try:
                async with trio.open_nursery() as nursery:

                    async def feed() -> None:
                        assert proc.stdin is not None
                        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                            await proc.stdin.send_all(stdin)
                        await proc.stdin.aclose()

                    nursery.start_soon(feed)
                    while chunk := await proc.stdout.receive_some(1 << 16):
                        out += chunk
                code = await proc.wait()
            finally:
                await _reap(proc)
            err = err_path.read_bytes() if err_path.exists() else b""
        return code, bytes(out), err

    async def _hand_over(self, module: str, argv: list[str], stderr: Path) -> trio.Process | None:
        order = json.dumps({"module": module, "argv": argv, "stderr": str(stderr)}).encode() + b"\n"
        while self._idle:
            proc = self._idle.popleft()
            if proc.returncode is not None or proc.stdin is None:
                continue
            try:
                await proc.stdin.send_all(order)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await _reap(proc)
                continue
            return proc
        return None

    async def close(self) -> None:
        """Stop the idle interpreters (they would exit with the daemon anyway)."""
        while self._idle:
            await _reap(self._idle.popleft())


async def _reap(proc: trio.Process) -> None:
    if proc.returncode is None:
        proc.kill()
    with trio.CancelScope(shield=True):
        await proc.wait()


_POOL = WarmPool()


def pool() -> WarmPool:
    """This daemon's pool (one per process: the children it holds are the process's own)."""
    return _POOL
