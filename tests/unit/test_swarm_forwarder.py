"""bench/swarm_netns.py's delaying forwarder (our stand-in for netem): it relays bytes intact and in order,
adds its one-way delay in each direction, and paces to its rate when given one."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_swarm_netns", ROOT / "bench" / "swarm_netns.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _echo_server() -> socket.socket:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve() -> None:
        conn, _ = srv.accept()
        while chunk := conn.recv(1 << 16):
            conn.sendall(chunk)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _forwarder(target: socket.socket, delay_s: float, rate: float) -> int:
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    host, port = target.getsockname()
    threading.Thread(target=_bench()._accept, args=(lst, (host, port), delay_s, rate), daemon=True).start()
    return int(lst.getsockname()[1])


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        began = time.monotonic()
        c.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = c.recv(1 << 16)
            assert chunk, "the forwarder closed early"
            got += chunk
        return got, time.monotonic() - began


def test_the_forwarder_delays_each_direction() -> None:
    port = _forwarder(_echo_server(), delay_s=0.05, rate=0.0)
    got, took = _round_trip(port, b"hello")
    assert got == b"hello"
    assert 0.1 <= took < 2.0  # two one-way delays


def test_the_forwarder_paces_to_its_rate_and_keeps_the_bytes() -> None:
    port = _forwarder(_echo_server(), delay_s=0.0, rate=200_000.0)  # 200 kB/s each way
    payload = bytes(range(256)) * 200  # 51.2 kB: >= 0.25 s each way
    got, took = _round_trip(port, payload)
    assert got == payload
    assert took >= 0.25
