"""Supervising one stage-worker child process: start it, learn its port, send it commands, read its events.

The worker is ``python -m arceusd.worker --config <file>`` (forked from the daemon's fork server when it runs,
:mod:`arceusd.jobs.procs.warm_starts`) with JSON lines on stdin/stdout
(:mod:`arceusd.worker.protocol`); its stderr goes to a log file next to the config. The daemon never runs torch
itself: everything heavy happens in this child, which we can kill cleanly.

Error handling: a worker that exits before saying ``listening``, or says something that is not a valid event,
raises :class:`WorkerFailed` with the tail of its log.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from arceusd.jobs.procs.warm_starts import ChildProcess, warm_starts
from arceusd.worker.protocol import WorkerProtocolError, parse_event

log = logging.getLogger(__name__)


class WorkerFailed(Exception):
    """The worker could not start or stopped with an error; the message carries its last log lines."""


class WorkerProcess:
    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.process: ChildProcess | None = None
        self.port: int | None = None
        self._buffer = bytearray()
        self._stopped = False  # stop() or kill() was called: a start still spawning must not bring it up

    @property
    def os_pid(self) -> int | None:
        """The worker's process id once started, alive or not: safe to read from any thread (``pid`` asks trio
        whether it still runs, which only the event loop's thread may)."""
        return None if self.process is None else int(self.process.pid)

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        if self.process is None or self.process.returncode is not None:
            return None
        return int(self.process.pid)

    async def start(self, timeout: float = 180.0) -> int:
        """Spawn the worker and wait for its ``listening`` event; return its transport port. A stop asked for
        while it starts (before its process exists too: the spawn waits on the fork server, seconds under load)
        ends the start with :class:`WorkerFailed` and leaves no process behind, nor does a cancelled start."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # forked from the fork server when it runs (torch already imported: off a recovery's critical path)
        argv = ["--config", str(self.config_path)]
        if self._stopped:
            raise WorkerFailed("the worker was stopped before it started")
        self.process = await warm_starts().spawn("arceusd.worker", argv, self.log_path)
        try:
            if self._stopped:
                raise WorkerFailed("the worker was stopped while it started")
            with trio.move_on_after(timeout):
                async for event in self.events():
                    if event.get("event") == "listening":
                        self.port = int(event["port"])
                        return self.port
                    if event.get("event") == "error":
                        raise WorkerFailed(f"worker failed at start: {event.get('message')}")
                if self._stopped:  # (it read the stop, or was killed, before it listened)
                    raise WorkerFailed("the worker was stopped while it started")
                raise WorkerFailed(f"worker exited before listening:\n{self.log_tail()}")
            raise WorkerFailed(f"worker did not start listening within {timeout:.0f} s:\n{self.log_tail()}")
        except BaseException:  # failed, stopped or cancelled before listening: no worker outlives its start
            await self.kill()
            raise

    async def send(self, command: dict[str, Any]) -> None:
        if self.process is None or self.process.stdin is None:
            raise WorkerFailed("the worker is not running")
        try:
            await self.process.stdin.send_all(json.dumps(command).encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise WorkerFailed(f"the worker is gone: {exc}") from None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Worker events, one dict per stdout line, until the worker closes stdout."""
        assert self.process is not None and self.process.stdout is not None
        while True:
            while b"\n" not in self._buffer:
                chunk = await self.process.stdout.receive_some(65536)
                if not chunk:
                    return
                self._buffer += chunk
                if len(self._buffer) > 1 << 20:
                    raise WorkerFailed("the worker wrote a line over 1 MiB")
            line, _, rest = bytes(self._buffer).partition(b"\n")
            self._buffer = bytearray(rest)
            text = line.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                parse_event(text)
            except WorkerProtocolError as exc:
                log.warning("ignoring a bad worker line: %s", exc)
                continue
            yield json.loads(text)

    async def stop(self, grace: float = 10.0) -> int | None:
        """Ask the worker to stop, then kill it if it does not exit within ``grace`` seconds (one still being
        spawned is killed as soon as it exists: :meth:`start`)."""
        self._stopped = True
        if self.process is None:
            return None
        if self.process.returncode is None:
            with contextlib.suppress(WorkerFailed):
                await self.send({"cmd": "stop"})
            with trio.move_on_after(grace):
                await self.process.wait()
        return await self.kill()

    async def kill(self) -> int | None:
        self._stopped = True
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.process.kill()
            with trio.CancelScope(shield=True):
                await self.process.wait()
        return self.process.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no worker log)"
