"""The peer port's gate (arceusd/transport/gate.py) over real sockets: calls and streams pass through it, gRPC's
handlers see the connection's real source, a source over its share is refused at once, and a connection that
completes no call is closed at its hello deadline (issue 29)."""

from __future__ import annotations

import socket
import sys
import time

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.transport import open_transport
from arceusd.transport.gate_core import GateLimits
from tests.integration.test_transport import echo_call, echo_stream, trio_test

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs all of 127/8 on lo (Linux)"),
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _silent(port: int, source: str) -> socket.socket | None:
    """A connection from ``source`` that sends the HTTP/2 preface and goes quiet; None when the gate reset it
    before that (a refusal "at once" can beat the preface, or the end of ``connect`` itself: seen in a full run)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    except ConnectionResetError:
        return None
    try:
        sock.sendall(PREFACE)
    except (ConnectionResetError, BrokenPipeError):
        sock.close()
        return None
    return sock


def _closed_at(sock: socket.socket, began: float, limit: float = 8.0) -> float:
    """Read (and drop) until the server closes ``sock``; when, in seconds since ``began``."""
    sock.settimeout(0.2)
    while time.monotonic() - began < limit:
        try:
            if not sock.recv(65536):
                break
        except TimeoutError:
            continue
        except OSError:
            break
    sock.close()
    return time.monotonic() - began


@trio_test
async def test_gate_relays_and_bounds_connections() -> None:
    limits = GateLimits(max_connections=8, max_per_source=2, hello_timeout=1.0, idle_timeout=30.0)
    async with (
        open_transport(
            Identity.generate(), "127.0.0.1", 0, unary_handler=echo_call, stream_handler=echo_stream, gate=limits
        ) as server,
        open_transport(
            Identity.generate(), "127.0.0.1", 0, unary_handler=echo_call, stream_handler=echo_stream
        ) as client,
    ):
        sources: list[str] = []
        lookup = server._source

        def recorded(peer: str) -> str:
            sources.append(lookup(peer))
            return sources[-1]

        setattr(server, "_source", recorded)  # noqa: B010 (mypy refuses assigning to a method)
        assert await client.call(server.address, b"hi", 5.0) == b"echo:hi"
        async with client.open_stream(server.address, b"purpose") as stream:
            await stream.send(b"head", b"body")
            header, payload = await stream.receive()
            assert header.endswith(b"|head") and bytes(payload) == b"body"
        assert sources and set(sources) == {"127.0.0.1"}, sources  # not the relay's unix address

        # a stranger at 127.0.0.5: two connections kept until their hello deadline, the third refused at once
        began = time.monotonic()
        socks = [await trio.to_thread.run_sync(_silent, server.port, "127.0.0.5") for _ in range(3)]
        took: list[float] = [0.0] * 3

        async def watch(i: int) -> None:
            sock = socks[i]
            took[i] = await trio.to_thread.run_sync(_closed_at, sock, began) if sock is not None else 0.0

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(watch, i)
        assert took[2] < 0.5, took  # the refused one
        assert all(0.8 < t < 4.0 for t in took[:2]), took
        gate = server.counters()["gate"]
        assert gate["source_full"] == 1 and gate["hello_timeout"] == 2, gate
        # the real peer's connection was never touched, and calls still pass
        assert await client.call(server.address, b"again", 5.0) == b"echo:again"
        assert server.counters()["gate"]["accepted"] == 3, server.counters()
