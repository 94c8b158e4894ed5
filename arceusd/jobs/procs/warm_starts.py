"""The daemon's side of warm starts: its torch programs are forked from a process that imported torch already
(:mod:`arceusd.jobs.procs.fork_server`), not started cold.

Owns :class:`WarmStarts` (one per daemon: :func:`warm_starts`) and :class:`ForkedProcess`. The server starts when
the daemon submits or joins a job (:meth:`WarmStarts.warm_up`), else at its first program (which waits for the
server's import rather than paying its own), and lives as long as the daemon; a daemon that never trains never
starts one. :meth:`WarmStarts.spawn` sends the server the program and three file
descriptors (the ends of the program's stdin and stdout pipes, and its stderr file) and gets back a process the
callers use as they used ``trio.Process`` (:class:`ChildProcess`): ``pid``, ``returncode``, ``stdin``,
``stdout``, ``wait()``, ``kill()``. The daemon is not the program's parent: it learns of its exit from a pidfd
(pollable, and immune to pid reuse when it signals it) and of its exit code from the server. Anything wrong with
the server (it died, it did not answer within :data:`ORDER_TIMEOUT_S`, this is not Linux) gives a cold start of
the same program instead: a warm start only ever makes a start faster, never fails one; a dead server is started
again at most every :data:`RESTART_AFTER_S`.

This and the programs' own callers are the only places that start them.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Protocol

import trio

from arceusd.models.hf.config import HFModelConfig

log = logging.getLogger(__name__)

SERVER = "arceusd.jobs.procs.fork_server"
ORDER_TIMEOUT_S = 60.0
"""How long a program waits for the server's fork (the server may still be importing) before it starts cold."""
NOTICE_S = 30.0
"""How long after a forked program exited its exit code may take to arrive from the server (a server that stops
tells its programs at once: :meth:`ForkedProcess.server_gone`). At 2 s a loaded machine's server reported a
re-slice's 0 too late, and a recovery failed on 'resume failed: no reason given'."""
LOST_EXIT_CODE = -255
"""The exit code of a forked program whose server died before it reported one."""
RESTART_AFTER_S = 30.0
SUPPORTED = sys.platform == "linux" and hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


class ChildProcess(Protocol):
    """What the daemon uses of a child program, whether ``trio.Process`` (cold) or :class:`ForkedProcess`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin(self) -> trio.abc.SendStream | None: ...

    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class ForkedProcess:
    """A program the fork server started, as the daemon sees it (see the module docstring)."""

    def __init__(self, pid: int, stdin: trio.abc.SendStream, stdout: trio.abc.ReceiveStream) -> None:
        self._pid = pid
        self._stdin = stdin
        self._stdout = stdout
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:  # it exited (and was reaped) already: its code is on its way from the server
            self._pidfd = -1
        self._code: int | None = None
        self._reported: int | None = None
        self._report = trio.Event()
        self._exited = trio.Event()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._code

    @property
    def stdin(self) -> trio.abc.SendStream:
        return self._stdin

    @property
    def stdout(self) -> trio.abc.ReceiveStream:
        return self._stdout

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._code is not None
        return self._code

    def kill(self) -> None:
        if self._code is None and self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def reported(self, code: int) -> None:
        """The server reaped it with ``code``."""
        self._reported = code
        self._report.set()

    def server_gone(self) -> None:
        """The server stopped: no exit code will come (:data:`LOST_EXIT_CODE` once it exits)."""
        self._report.set()

    async def watch(self) -> None:
        """Until it exits: then its code (the server's report, :data:`LOST_EXIT_CODE` if none comes)."""
        try:
            if self._pidfd >= 0:
                await trio.lowlevel.wait_readable(self._pidfd)
            with trio.move_on_after(NOTICE_S):
                await self._report.wait()
            self._code = LOST_EXIT_CODE if self._reported is None else self._reported
        finally:
            if self._pidfd >= 0:
                os.close(self._pidfd)
                self._pidfd = -1
            if self._code is None:
                self._code = LOST_EXIT_CODE
            self._exited.set()


class WarmStarts:
    """This daemon's fork server and the programs it started (see the module docstring)."""

    def __init__(self) -> None:
        self.warm = 0  # programs forked from the server
        self.cold = 0  # programs started cold (no server yet, or it failed)
        self._server: trio.Process | None = None
        self._sock: trio.socket.SocketType | None = None
        self._lock = trio.Lock()
        self._send_reply, self._replies = _reply_channel()
        self._running: dict[int, ForkedProcess] = {}
        self._unregistered: dict[int, int | None] = {}
        """Pids the server answered an order with, not yet in ``_running``, and the exit code of each whose report
        came first (a fast program), else None."""
        self._preloaded: set[str] = set()
        self._failed_at = -math.inf
        self._forked = False  # the running server has answered an order (its import was done)
        self.import_wait_s = 0.0
        """How long the first order to the newest server waited for its answer: the rest of its import of torch,
        which a daemon's first job pays to start (0: none measured). The quote's start counts it
        (``arceusd.market.timings``: a later job does not pay it)."""

    @property
    def server_pid(self) -> int | None:
        return None if self._server is None else int(self._server.pid)

    async def start(self) -> bool:
        """Start the server if it is not running (and not failed within :data:`RESTART_AFTER_S`); whether it runs."""
        if self._server is not None or not SUPPORTED:
            return self._server is not None
        if trio.current_time() - self._failed_at < RESTART_AFTER_S:
            return False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._server = await trio.lowlevel.open_process(
                [sys.executable, "-m", SERVER],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            log.warning("could not start the fork server (programs start cold): %s", exc)
            ours.close()
            self._failed_at = trio.current_time()
            return False
        finally:
            theirs.close()
        self._sock = trio.socket.from_stdlib_socket(ours)
        self._preloaded, self._forked = set(), False
        self._send_reply, self._replies = _reply_channel()  # nothing an earlier server said reaches this one's orders
        trio.lowlevel.spawn_system_task(self._read, self._sock, self._send_reply)
        return True

    async def spawn(self, module: str, argv: list[str], stderr: Path) -> ChildProcess:
        """``python -m module *argv`` with piped stdin/stdout and stderr appended to ``stderr``: forked from the
        server (started now if need be: the order waits for its import, at the daemon's priority, which costs
        what a cold start's own import would, once), else cold."""
        proc = await self._fork(module, argv, stderr) if await self.start() else None
        if proc is not None:
            self.warm += 1
            return proc
        self.cold += 1
        with stderr.open("ab") as err:
            return await trio.lowlevel.open_process(
                [sys.executable, "-m", module, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )

    async def warm_up(self, model: object) -> None:
        """A job with ``model`` is coming to this device (it submitted or joined one): start the server now and
        have it import what that job's programs need, so that its import is done long before the first worker or a
        recovery's re-slicing waits on it (at nice 19 beside training, an import begun at the first program was
        still running at the first recovery: 5 s of a 6 s re-slice)."""
        await self.preload(preloads_for(model))
        await self.start()

    async def preload(self, modules: tuple[str, ...]) -> None:
        """Ask the server (started now if need be) to import ``modules`` (of ``fork_server.PRELOADS``) for the
        programs forked after it; once per server."""
        wanted = tuple(m for m in modules if m not in self._preloaded)
        if not wanted or not await self.start():
            return
        async with self._lock:
            if self._sock is None:
                return
            try:
                await self._sock.send(json.dumps({"preload": list(wanted)}).encode())
            except OSError as exc:
                await self._broken(f"sending it a preload failed: {exc}")
                return
            self._preloaded.update(wanted)

    async def run(self, module: str, argv: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        """Run ``python -m module *argv`` to its end with ``stdin`` as input: (exit code, stdout, stderr), like
        ``trio.run_process(..., capture_stdout=True, capture_stderr=True, check=False)``."""
        with tempfile.TemporaryDirectory(prefix="arceus-child-") as folder:
            err_path = Path(folder) / "stderr"
            began = trio.current_time()
            proc = await self.spawn(module, argv, err_path)
            spawned = trio.current_time()
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
                answered = trio.current_time()
                code = await proc.wait()
                log.info(
                    "ran %s %s (%s): started %.3f s, answered %.3f s, exit code %.3f s later",
                    module,
                    argv,
                    "warm" if isinstance(proc, ForkedProcess) else "cold",
                    spawned - began,
                    answered - spawned,
                    trio.current_time() - answered,
                )
            finally:
                await _stop(proc)
            err = err_path.read_bytes() if err_path.exists() else b""
        return code, bytes(out), err

    async def close(self) -> None:
        """Stop the server (the programs it started live on until their stdin closes, as cold ones do)."""
        await self._broken("closed")

    async def _fork(self, module: str, argv: list[str], stderr: Path) -> ForkedProcess | None:
        order = json.dumps({"module": module, "argv": argv}).encode()
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        stdout_r, stdout_w = os.pipe2(os.O_CLOEXEC)
        err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        ours = [stdin_w, stdout_r]
        reply: Reply = None
        try:
            async with self._lock:
                sock = self._sock
                if sock is None:
                    return None
                fds = array.array("i", [stdin_r, stdout_w, err])
                await sock.sendmsg([order], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
                sent = trio.current_time()
                # once the order is out, its answer is taken here whatever happens to the caller: an answer left
                # unread went to the next order, whose program was then given this one's pid (its exit code;
                # its kill sent to another process)
                with trio.CancelScope(shield=True), trio.move_on_after(ORDER_TIMEOUT_S):
                    reply = await self._replies.receive()
                if reply is not None and not self._forked:
                    self._forked, self.import_wait_s = True, round(trio.current_time() - sent, 3)
                if reply is None:
                    await self._broken(f"it did not fork within {ORDER_TIMEOUT_S:.0f} s")
        except OSError as exc:
            await self._broken(f"sending it an order failed: {exc}")
        finally:
            for fd in (stdin_r, stdout_w, err):
                os.close(fd)
            pid = reply.get("pid") if reply else None
            if not isinstance(pid, int):
                for fd in ours:
                    os.close(fd)
        if reply is None or not isinstance(pid, int):
            if reply is not None:
                log.warning("the fork server refused %s: %s (it starts cold)", module, reply.get("error"))
            return None
        proc = ForkedProcess(pid, trio.lowlevel.FdStream(stdin_w), trio.lowlevel.FdStream(stdout_r))
        self._running[pid] = proc
        early = self._unregistered.pop(pid, None)
        if early is not None:
            proc.reported(early)
        trio.lowlevel.spawn_system_task(self._watch, proc)
        try:
            await trio.lowlevel.checkpoint_if_cancelled()  # a caller cancelled while its answer came: no program
        except BaseException:
            proc.kill()
            raise
        return proc

    async def _watch(self, proc: ForkedProcess) -> None:
        try:
            await proc.watch()
        finally:
            if self._running.get(proc.pid) is proc:  # (a newer program may hold its pid by now)
                del self._running[proc.pid]

    async def _read(self, sock: trio.socket.SocketType, replies: trio.MemorySendChannel[Reply]) -> None:
        """The server's answers (in order of the orders) and exit reports, until it ends."""
        try:
            while data := await sock.recv(4096):
                message = json.loads(data)
                if "exit" in message:
                    self._exit_reported(int(message["exit"]), int(message["code"]))
                else:
                    pid = message.get("pid") if isinstance(message, dict) else None
                    if isinstance(pid, int) and len(self._unregistered) < 4096:
                        self._unregistered[pid] = None
                    await replies.send(message if isinstance(message, dict) else {"error": "not an object"})
        except (OSError, ValueError, TypeError, trio.ClosedResourceError) as exc:
            log.debug("the fork server's socket: %s", exc)
        if self._sock is sock:
            await self._broken("it exited")

    def _exit_reported(self, pid: int, code: int) -> None:
        """The server reaped ``pid`` with ``code``: tell its program, or keep the code for a program the server
        just answered an order with (its report may come before the daemon registered it). A report of any other
        pid is dropped: a program whose code came after :data:`NOTICE_S` (it ended with :data:`LOST_EXIT_CODE`)
        would otherwise leave its code behind, for the next program the kernel gives that pid (after 32,768 on
        a default Linux), which would end at once with that stale code."""
        if pid in self._running:
            self._running[pid].reported(code)
        elif pid in self._unregistered:
            self._unregistered[pid] = code
        else:
            log.debug("the fork server reported pid %d (code %d), which no program of this daemon holds", pid, code)

    async def _broken(self, why: str) -> None:
        server, sock = self._server, self._sock
        self._server, self._sock = None, None
        if sock is None:
            return
        if why != "closed":
            log.warning("the fork server stopped (%s): programs start cold", why)
            self._failed_at = trio.current_time()
        sock.close()
        self._unregistered.clear()
        for proc in list(self._running.values()):
            proc.server_gone()
        if server is not None:
            await _stop(server)
        with contextlib.suppress(trio.WouldBlock):
            self._send_reply.send_nowait(None)  # a program waiting for its fork starts cold


Reply = dict[str, object] | None
"""The server's answer to an order, or None: it stopped."""


def _reply_channel() -> tuple[trio.MemorySendChannel[Reply], trio.MemoryReceiveChannel[Reply]]:
    return trio.open_memory_channel[Reply](1)


async def _stop(proc: ChildProcess) -> None:
    if proc.returncode is None:
        proc.kill()
    with trio.CancelScope(shield=True):
        await proc.wait()


def preloads_for(model: object) -> tuple[str, ...]:
    """What the programs of a job with this model config import beyond torch (``fork_server.PRELOADS``)."""
    if not isinstance(model, HFModelConfig):
        return ()
    lora = ("arceusd.models.hf.lora", "arceusd.models.hf.lora_export") if model.lora is not None else ()
    return ("arceusd.models.hf.blocks", *lora)


_STARTS = WarmStarts()


def warm_starts() -> WarmStarts:
    """This daemon's warm starts (one per process: the server it holds is the process's own)."""
    return _STARTS


__all__ = ["ChildProcess", "ForkedProcess", "WarmStarts", "preloads_for", "warm_starts"]
