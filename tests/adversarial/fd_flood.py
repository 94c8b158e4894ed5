"""A keyless stranger holding TCP connections open to a daemon's peer port (issue 29): each sends the HTTP/2
client preface (and an empty SETTINGS frame) and goes quiet.

``python -m tests.adversarial.fd_flood --target 127.0.0.1:PORT --count 1100 --sources 127.0.0.2 --seconds 8``
opens ``--count`` connections spread over the ``--sources`` loopback addresses (Linux routes all of 127/8 to
``lo``, so each address is a host of its own to the victim), notices the ones the victim closes and opens them
again (at most ``--reopen`` per half-second round), until ``--seconds`` pass. Its own open-files limit is raised
to fit. Loopback only; every loop is bounded in rounds and time. Prints one JSON line: connections opened,
connects that failed (by error), closes seen, the most held at once.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + SETTINGS, empty
ROUND_S = 0.5


def _raise_limit(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard) if hard != resource.RLIM_INFINITY else want, hard))


def _open(host: str, port: int, source: str, failures: Counter[str]) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.bind((source, 0))
        sock.connect((host, port))
        sock.sendall(PREFACE)
    except OSError as exc:
        failures[errno.errorcode.get(exc.errno or 0, type(exc).__name__)] += 1
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bool:
    """The victim closed (or reset) it: what it sent back is read and dropped."""
    try:
        for _ in range(16):  # bounded: the victim's SETTINGS and the like, then EOF or nothing
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    return False


def flood(target: str, count: int, sources: list[str], seconds: float, reopen: int) -> dict[str, Any]:
    host, port_text = target.rsplit(":", 1)
    port = int(port_text)
    if host != "127.0.0.1" or not all(s.startswith("127.") for s in sources):
        raise SystemExit("fd_flood sends only to and from loopback addresses")
    _raise_limit(count)
    failures: Counter[str] = Counter()
    slots: list[socket.socket | None] = [None] * count
    opened = closes = most = 0
    deadline = time.monotonic() + seconds
    rounds = 0
    while time.monotonic() < deadline and rounds < int(seconds / ROUND_S) + 2:
        rounds += 1
        began = time.monotonic()
        budget = reopen if opened else count  # the first round opens them all
        for i in range(count):
            if slots[i] is None and budget > 0 and time.monotonic() < deadline:
                budget -= 1
                slots[i] = _open(host, port, sources[i % len(sources)], failures)
                opened += slots[i] is not None
        held = [s for s in slots if s is not None]
        most = max(most, len(held))
        poller = select.poll()
        by_fd = {s.fileno(): i for i, s in enumerate(slots) if s is not None}
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fd, _ in poller.poll(0):
            i = by_fd[fd]
            sock = slots[i]
            if sock is not None and _closed(sock):
                sock.close()
                slots[i] = None
                closes += 1
        time.sleep(max(0.0, ROUND_S - (time.monotonic() - began)))
    held_at_end = sum(s is not None for s in slots)
    for sock in slots:
        if sock is not None:
            sock.close()
    return {
        "opened": opened,
        "connect_failed": dict(failures),
        "closed_by_victim": closes,
        "most_held": most,
        "held_at_end": held_at_end,
        "rounds": rounds,
    }


def launch(target: str, count: int, sources: list[str], seconds: float) -> subprocess.Popen[str]:
    """Run :func:`flood` in a process of its own (read its result with :func:`result`)."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.adversarial.fd_flood",
            "--target",
            target,
            "--count",
            str(count),
            "--sources",
            ",".join(sources),
            "--seconds",
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def result(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"fd_flood failed ({proc.returncode}):\n{err[-4000:]}")
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, default=1100)
    p.add_argument("--sources", default="127.0.0.2", help="comma-separated loopback addresses to connect from")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--reopen", type=int, default=200, help="connections reopened per half-second round at most")
    args = p.parse_args(argv)
    result = flood(args.target, args.count, args.sources.split(","), args.seconds, args.reopen)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
