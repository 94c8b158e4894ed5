"""Running out of descriptors never ends an accept loop (arceusd/base/fdlimit.py), and the control socket answers
again once descriptors are free (issue 29)."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap

import pytest
import trio

from arceusd.base.fdlimit import AcceptBackoff, accept
from tests.harness import ROOT


class _Listener:
    """Fails ``failures`` accepts with ``code``, then hands out a stream."""

    def __init__(self, failures: int, code: int) -> None:
        self.failures, self.code, self.calls = failures, code, 0

    async def accept(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(self.code, "no")
        return "stream"


def test_capacity_errors_are_waited_out_with_growing_pauses() -> None:
    listener = _Listener(5, errno.EMFILE)
    backoff = AcceptBackoff("test", first=0.001, longest=0.004)

    async def main() -> object:
        return await accept(listener, backoff)  # type: ignore[arg-type]

    assert trio.run(main) == "stream" and listener.calls == 6
    assert backoff.counts == {"EMFILE": 5} and backoff.delay == 0.001  # reset by the accept that worked
    listener = _Listener(1, errno.ENFILE)
    assert trio.run(main) == "stream" and backoff.counts["ENFILE"] == 1


def test_other_accept_errors_propagate() -> None:
    async def main() -> object:
        return await accept(_Listener(1, errno.EBADF), AcceptBackoff("test"))  # type: ignore[arg-type]

    with pytest.raises(OSError) as caught:
        trio.run(main)
    assert caught.value.errno == errno.EBADF


_CONTROL_AT_EMFILE = textwrap.dedent("""
    import os, resource, socket, sys, threading, time
    from pathlib import Path
    import trio
    from arceusd.base.control import call
    from arceusd.base.control_server import serve_control

    async def status(_params):
        return "ok"

    async def main(path):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_control, path, {"status": status})
            fillers = []
            try:
                while True:
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            os.close(fillers.pop())  # one free: the client's socket takes it, so the server's accept fails
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(5)
            client.connect(str(path))
            client.sendall(b'{"method": "status"}\\n')
            await trio.sleep(0.5)  # the accept loop meets EMFILE and waits, and does not end
            for fd in fillers:
                os.close(fd)
            answer = await trio.to_thread.run_sync(client.recv, 4096)
            print(answer.decode().strip())
            print(await trio.to_thread.run_sync(lambda: call(path, "status", timeout=5)))
            nursery.cancel_scope.cancel()

    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    trio.run(main, Path(sys.argv[1]) / "control.sock")
""")


def test_the_control_socket_outlives_emfile(tmp_path: object) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CONTROL_AT_EMFILE, str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ['{"ok": true, "result": "ok"}', "ok"], proc.stdout
    assert "out of file descriptors (EMFILE)" in proc.stderr or proc.stderr == "", proc.stderr
