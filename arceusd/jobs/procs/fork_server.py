"""The fork server: one child process per training daemon that has imported torch and the torch-side modules, and
forks each of the daemon's torch programs (a stage worker, a filework task, a speed challenge) from that state.

Why: every recovery starts new children (re-slicing the checkpoint, then the stage worker), and each used to pay
the interpreter's start and torch's import (2.5 s of CPU here, more under load) on the critical path from a lost
member to the first step after it (issue 33). A pool of pre-started interpreters (the first answer) paid a whole
import for every program it ever started, ready or not, and kept two idle ones per daemon: in a 3-daemon job test
35 % more CPU than cold starts. A fork costs milliseconds and copies nothing until written: the import is paid once
per daemon, and every program after it starts warm. A speed challenge's child started cold paid the import
inside the leader's ready wait (over 30 s at a load of 8-10 on two cores: an honest member was judged to refuse).

Protocol (``python -m arceusd.jobs.procs.fork_server``; its stdin is one end of a ``SOCK_SEQPACKET`` socket pair whose
other end only the daemon that started it holds; one message per datagram):

- the daemon sends an order, JSON ``{"module": M, "argv": [...]}`` with :data:`PROGRAMS` naming every ``M`` this
  server runs (a stage worker, a filework task, a speed challenge), and three file descriptors in ``SCM_RIGHTS``:
  the program's stdin, stdout and stderr;
- the server forks; it answers ``{"pid": N}`` (or ``{"error": why}``, with nothing started), and later
  ``{"exit": N, "code": C}`` when it reaped that program (``C`` as ``Popen.returncode``: negative for a signal);
- or the daemon sends ``{"preload": [modules]}`` (no descriptors, no answer), each one of :data:`PRELOADS`: the
  server imports them, so every program forked after it has them too (the daemon asks when it first trains a
  stock ``transformers`` model: importing transformers costs seconds of CPU, which a daemon that never trains one
  should not pay, and which every worker, re-slicing and export of one would pay again).

The child points fds 0-2 at the three it was given, takes back the daemon's CPU priority (the server imports at
nice 19, :data:`PRELOAD_NICENESS`, where it may), sets ``sys.argv`` and runs ``M`` as ``__main__``: from then on it
is that program exactly as ``python -m M ...`` would be, exit code included. The end of the socket (the daemon
exited) ends the server; the programs it started live on until their own stdin closes, as cold ones do.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
import warnings
from typing import NoReturn

PROGRAMS = {
    "arceusd.worker": "arceus-worker",
    "arceusd.jobs.procs.filework": "arceus-filework",
    "arceusd.worker.speed_challenge": "arceus-speed",
}
"""The programs this server forks (the daemon's own torch children, never anything else), each with the name its
process takes (``ps``, ``top``, ``/proc/PID/comm``: at most 15 bytes): its command line is still the server's."""
PRELOADS = ("arceusd.models.hf.blocks", "arceusd.models.hf.lora", "arceusd.models.hf.lora_export")
"""What the daemon may ask the server to import beforehand (transformers and peft come with them)."""
MAX_ORDER = 64 * 1024
MAX_ARGS = 64
FDS_PER_ORDER = 3
PRELOAD_NICENESS = 19
"""The server imports at the lowest CPU priority: its import runs beside training and the daemons' membership
timers, which a burst of torch imports on two cores starved into false deaths. An order that comes while it still
imports gives the import the daemon's priority back (the order waits on it)."""


def _preload() -> None:
    """Import what the programs import at start (torch: most of the cost). Not transformers: it costs seconds of
    CPU beside training in every training daemon; a stock-model worker imports it itself."""
    import torch  # torch: the server preloads it for its forks
    from torch import nn  # torch

    import arceusd.jobs.plans.planning  # preloads (this group): the forks' modules
    import arceusd.jobs.plans.recovery
    import arceusd.jobs.procs.filework
    import arceusd.jobs.procs.reslice
    import arceusd.jobs.spec.schema
    import arceusd.worker.process  # noqa: F401
    from arceusd.models.init import materialize  # torch

    # what torch imports on first use: a meta module's materializing imports sympy (through torch's shape
    # reasoning), 0.6 s quiet and 2-3 s under load in every worker and re-slicing child built after a recovery.
    # Tiny and single-threaded: no thread of torch's may exist across a fork.
    with torch.no_grad():
        materialize(lambda: nn.Linear(2, 2))


def parse_preload(data: bytes) -> list[str] | None:
    """The modules of a preload order (None: the order is not one); ValueError when one is not in :data:`PRELOADS`."""
    if len(data) > MAX_ORDER:
        raise ValueError(f"the order is {len(data)} bytes, over {MAX_ORDER}")
    order = json.loads(data)
    if not isinstance(order, dict) or "preload" not in order:
        return None
    modules = order["preload"]
    if not isinstance(modules, list) or not all(m in PRELOADS for m in modules):
        raise ValueError(f"a preload names only modules of {', '.join(PRELOADS)}")
    return [str(m) for m in modules]


def parse_order(data: bytes) -> tuple[str, list[str]]:
    """The program and its arguments from an order; ValueError when it is not one this server runs."""
    if len(data) > MAX_ORDER:
        raise ValueError(f"the order is {len(data)} bytes, over {MAX_ORDER}")
    order = json.loads(data)
    if not isinstance(order, dict):
        raise ValueError("the order is not a JSON object")
    module, argv = order.get("module"), order.get("argv")
    if module not in PROGRAMS:
        raise ValueError(f"{module!r} is not a program the fork server runs (one of {', '.join(PROGRAMS)})")
    if not isinstance(argv, list) or len(argv) > MAX_ARGS or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a list of at most {MAX_ARGS} strings")
    return str(module), [str(a) for a in argv]


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def _run_program(module: str, argv: list[str]) -> int:
    """Run ``module`` as ``python -m`` would: its exit code (a traceback and 1 for an uncaught exception)."""
    sys.argv = [module, *argv]
    # runpy warns that a module the server preloaded is in sys.modules before it runs as __main__ (as it should:
    # a fresh copy runs, as under python -m); the warning opened every forked filework's stderr, and so every
    # failure's message in the daemon's log, where it read like the cause
    warnings.filterwarnings(
        "ignore", message=r".* found in sys\.modules after import of package", category=RuntimeWarning
    )
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = int(exc.code or 0)
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    return code


def _name_process(module: str) -> None:
    """Give the forked process its program's name (:data:`PROGRAMS`), where the kernel lets it."""
    with contextlib.suppress(OSError), open("/proc/self/comm", "w") as comm:
        comm.write(PROGRAMS[module])


def _become(program: tuple[str, list[str]], fds: list[int], priority: int, keep_closed: list[int]) -> NoReturn:
    """In the forked child: become the program on ``fds`` (stdin, stdout, stderr) and exit with its code."""
    code = 1
    try:
        _name_process(program[0])
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep_closed:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        # the program runs at the daemon's priority again where this user may raise it back (root,
        # CAP_SYS_NICE, a generous RLIMIT_NICE); elsewhere it stays niced, like any background work of a lent device
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, priority)
        code = _run_program(*program)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    finally:
        os._exit(code)


def _send(sock: socket.socket, message: dict[str, object]) -> None:
    with contextlib.suppress(OSError):  # the daemon went away: the loop sees the end of the socket next
        sock.send(json.dumps(message).encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _order(sock: socket.socket, wake: tuple[int, int], priority: int) -> bool:
    """Take one order from the daemon and fork it; False at the end of the socket."""
    data, ancillary, _, _ = sock.recvmsg(MAX_ORDER + 1, socket.CMSG_SPACE(FDS_PER_ORDER * 4 + 16))
    fds = _received_fds(ancillary)
    if not data:
        for fd in fds:
            os.close(fd)
        return False
    try:
        preload = parse_preload(data) if not fds else None
    except ValueError:
        preload = []  # refused: nothing to answer (a preload has no answer)
    if preload is not None:
        for module in preload:
            with contextlib.suppress(Exception):  # a program that needs it imports it itself, and fails there
                importlib.import_module(module)
        return True
    try:
        if len(fds) != FDS_PER_ORDER:
            raise ValueError(f"an order carries {FDS_PER_ORDER} file descriptors, this one {len(fds)}")
        program = parse_order(data)
        pid = os.fork()
        if pid == 0:
            _become(program, fds, priority, [sock.fileno(), *wake])
        _send(sock, {"pid": pid})
    except (ValueError, OSError) as exc:
        _send(sock, {"error": str(exc)[:500]})
    finally:
        for fd in fds:
            os.close(fd)
    return True


def _give_priority_back_on_order(sock: socket.socket, main_tid: int, priority: int, done: threading.Event) -> None:
    """While the main thread imports at nice 19: the first order gives it the daemon's priority back (on Linux a
    thread's niceness is its own, so this thread names the main thread's id)."""
    while not done.is_set():
        ready, _, _ = select.select([sock], [], [], 0.1)
        if ready:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, main_tid, priority)
            return


def serve(sock: socket.socket) -> None:
    """Import, then fork the daemon's orders until it closes its end."""
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, PRELOAD_NICENESS)
    done = threading.Event()
    watcher = threading.Thread(
        target=_give_priority_back_on_order, args=(sock, threading.get_native_id(), priority, done), daemon=True
    )
    watcher.start()
    _preload()
    done.set()
    watcher.join()  # no thread of ours may live across a fork
    # serving runs at the daemon's priority again: at nice 19 beside busy workers each fork waited its turn for
    # up to seconds (1.5 s of a 1.7 s re-slice on a recovery's critical path, with 0.24 s of it the child's work)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    while True:
        ready, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 4096):
                    pass
            _reap(sock)
        if sock.fileno() in ready and not _order(sock, (wake_r, wake_w), priority):
            return


def main() -> None:
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # nothing reads the socket as stdin by mistake
    os.close(devnull)
    serve(sock)


if __name__ == "__main__":
    main()
