"""Integration tests of arceusd.transport over real gRPC on 127.0.0.1 (and the in-memory twin's parity)."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from arceusd.base.identity import Identity
from arceusd.transport import MemoryNetwork, Stream, TransportConfig, TransportError, open_transport
from protocol import stream_auth as sa
from protocol.errors import LocalProtocolError, RemoteProtocolError

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


async def echo_call(request: bytes) -> bytes:
    if request == b"bad":
        raise RemoteProtocolError("bad_request", "the test asked for a refusal")
    return b"echo:" + request


async def echo_stream(stream: Stream) -> None:
    """Echo each frame with the purpose and peer id prefixed to the header, until the client's EOF."""
    while True:
        try:
            header, payload = await stream.receive()
        except trio.EndOfChannel:
            return
        await stream.send(stream.purpose + b"|" + stream.peer_id.encode() + b"|" + header, payload)


Opener = Callable[..., AbstractAsyncContextManager[Any]]


def trio_test(fn: Callable[..., Any]) -> Callable[..., None]:
    """Run an async test function under trio.run (no pytest-trio here)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        trio.run(functools.partial(fn, *args, **kwargs))

    return wrapper


@asynccontextmanager
async def grpc_pair(
    config: TransportConfig | None = None, stream_handler: Any = echo_stream
) -> AsyncIterator[tuple[Any, Any, Identity]]:
    server_id, client_id = Identity.generate(), Identity.generate()
    async with (
        open_transport(
            server_id, "127.0.0.1", 0, unary_handler=echo_call, stream_handler=stream_handler, config=config
        ) as server,
        open_transport(
            client_id, "127.0.0.1", 0, unary_handler=echo_call, stream_handler=stream_handler, config=config
        ) as client,
    ):
        yield server, client, server_id


@asynccontextmanager
async def memory_pair(
    config: TransportConfig | None = None, stream_handler: Any = echo_stream
) -> AsyncIterator[tuple[Any, Any, Identity]]:
    net = MemoryNetwork()
    server_id, client_id = Identity.generate(), Identity.generate()
    async with (
        net.open_transport(
            server_id, "127.0.0.1", 0, unary_handler=echo_call, stream_handler=stream_handler, config=config
        ) as server,
        net.open_transport(
            client_id, "127.0.0.1", 0, unary_handler=echo_call, stream_handler=stream_handler, config=config
        ) as client,
    ):
        yield server, client, server_id


PAIRS = pytest.mark.parametrize("pair", [grpc_pair, memory_pair], ids=["grpc", "memory"])


@PAIRS
@trio_test
async def test_unary_round_trip_and_refusal(pair: Opener) -> None:
    async with pair() as (server, client, _):
        assert server.port > 0
        assert await client.call(server.address, b"hello", 5) == b"echo:hello"
        # A unary call carries one control message: up to max_message (4 MiB + 64 KiB) it passes, beyond
        # that it is refused (a stream's frame limit does not apply to calls).
        big = bytes(range(256)) * (server.config.max_message // 256 - 1)
        assert await client.call(server.address, big, 20) == b"echo:" + big
        with pytest.raises(TransportError) as err:
            await client.call(server.address, bytes(server.config.max_message + 1), 20)
        assert err.value.code == "resource_exhausted"
        with pytest.raises(TransportError) as err:
            await client.call(server.address, b"bad", 5)
        assert err.value.code == "invalid_argument"
        assert server.rejected["bad_request"] == 1


@PAIRS
@trio_test
async def test_stream_round_trip(pair: Opener) -> None:
    async with pair() as (server, client, server_id):
        async with client.open_stream(server.address, b"job-1/stage-0", expect_peer_id=server_id.peer_id) as s:
            assert s.peer_id == server_id.peer_id
            payloads = [bytes([i]) * (i * 1000 + 1) for i in range(20)]
            big = memoryview(bytearray(range(256)) * (13 * 1024 * 1024 // 256))  # 4 wire messages

            async def sender() -> None:
                # Sending and receiving concurrently: with bounded queues a peer that echoes while we only
                # send would otherwise (correctly) stall both sides.
                for i, payload in enumerate(payloads):
                    await s.send(b"h%d" % i, payload)
                await s.send(b"big", big)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender)
                prefix = b"job-1/stage-0|" + client.identity.peer_id.encode() + b"|"
                for i, payload in enumerate(payloads):
                    header, got = await s.receive()
                    assert header == prefix + b"h%d" % i and bytes(got) == payload
                header, got = await s.receive()
                assert header == prefix + b"big"
                assert hashlib.sha256(got).digest() == hashlib.sha256(big).digest()
            await s.send_eof()
            with pytest.raises(trio.EndOfChannel):
                await s.receive()
        assert sum(client.rejected.values()) == 0 and sum(server.rejected.values()) == 0


@PAIRS
@trio_test
async def test_unexpected_peer_is_refused(pair: Opener) -> None:
    async with pair() as (server, client, _):
        other = Identity.generate()
        with pytest.raises((TransportError, RemoteProtocolError)):
            async with client.open_stream(server.address, b"p", expect_peer_id=other.peer_id):
                pass
        # The server saw a Hello meant for someone else and counted it.
        with trio.fail_after(5):
            while server.rejected["wrong_recipient"] != 1:
                await trio.sleep(0.01)


@PAIRS
@trio_test
async def test_frames_over_the_limit_are_refused(pair: Opener) -> None:
    config = TransportConfig(limits=sa.Limits(max_header=64, max_payload=1024))
    async with pair(config) as (server, client, _), client.open_stream(server.address, b"p") as s:
        with pytest.raises(LocalProtocolError):
            await s.send(b"", bytes(1025))
        await s.send(b"ok", bytes(1024))
        header, payload = await s.receive()
        assert header.endswith(b"|ok") and payload.nbytes == 1024


@trio_test
async def test_tampered_frames_are_dropped_and_counted_memory() -> None:
    net = MemoryNetwork()
    seen: list[bytes] = []

    async def recorder(stream: Stream) -> None:
        while True:
            _, payload = await stream.receive()
            seen.append(bytes(payload))

    server_id, client_id = Identity.generate(), Identity.generate()
    async with (
        net.open_transport(server_id, "h", 0, unary_handler=echo_call, stream_handler=recorder) as server,
        net.open_transport(client_id, "h", 0, unary_handler=echo_call, stream_handler=recorder) as client,
    ):
        s = await client.connect_stream(server.address, b"p")
        await s.send(b"", b"good")
        net.tamper = lambda m: m[:-1] + bytes([m[-1] ^ 1])
        await s.send(b"", b"evil")
        with trio.fail_after(5):
            while server.rejected["bad_mac"] != 1:
                await trio.sleep(0.01)
        assert seen == [b"good"]
        await s.aclose()


@trio_test
async def test_bad_peer_hello_is_rejected_grpc() -> None:
    """A client whose Hello is signed by a key that does not match the id it claims never gets a stream."""
    async with grpc_pair() as (server, client, _):
        real: Identity = client.identity

        class Impostor:
            public_key_raw = Identity.generate().public_key_raw
            peer_id = real.peer_id

            def sign(self, data: bytes) -> bytes:
                return real.sign(data)

        client.identity = Impostor()
        with pytest.raises(TransportError):
            await client.connect_stream(server.address, b"p")
        with trio.fail_after(5):
            while server.rejected["bad_signature"] != 1:
                await trio.sleep(0.01)


@trio_test
async def test_cancellation_does_not_hang_grpc() -> None:
    gate = trio.Event()

    async def slow_call(request: bytes) -> bytes:
        await gate.wait()
        return request

    server_id, client_id = Identity.generate(), Identity.generate()
    async with (
        open_transport(server_id, "127.0.0.1", 0, unary_handler=slow_call, stream_handler=echo_stream) as server,
        open_transport(client_id, "127.0.0.1", 0, unary_handler=slow_call, stream_handler=echo_stream) as client,
    ):
        start = time.monotonic()
        with trio.move_on_after(0.3):
            await client.call(server.address, b"x", 30)
        with trio.move_on_after(0.3):
            async with client.open_stream(server.address, b"p") as s:
                await s.receive()  # the echo server never sends first: blocks until cancelled
        assert time.monotonic() - start < 5
        # A call against a port nobody listens on fails fast instead of hanging.
        with pytest.raises(TransportError):
            await client.call("127.0.0.1:1", b"x", 5)
        # Deadline expiry is reported as such.
        with pytest.raises(TransportError) as err:
            await client.call(server.address, b"x", 0.2)
        assert err.value.code == "deadline_exceeded"
        gate.set()
        assert await client.call(server.address, b"after", 5) == b"after"
    # Leaving the transports cut everything: we get here well inside the test timeout.


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_processes_stream_one_gib_with_matching_sha256(tmp_path: Path) -> None:
    script = ROOT / "tests" / "integration" / "transport_peer.py"
    receiver = subprocess.Popen(
        [sys.executable, str(script), "receive"], stdout=subprocess.PIPE, stdin=subprocess.PIPE, cwd=ROOT
    )
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        sender = subprocess.run(
            [sys.executable, str(script), "send", str(port), str(256)],
            capture_output=True,
            cwd=ROOT,
            timeout=150,
        )
        assert sender.returncode == 0, sender.stderr.decode()
        sent_digest, received_digest = sender.stdout.decode().split()
        assert sent_digest == received_digest
    finally:
        receiver.kill()
        receiver.wait(timeout=10)


@trio_test
async def test_silent_streams_cannot_take_call_slots_grpc() -> None:
    """48 raw gRPC streams that never send a byte (more than every server slot) leave unary calls working;
    the server cuts each within accept_timeout and gives its slot back, counting why."""
    import grpc

    from arceusd.transport import STREAM_METHOD

    config = TransportConfig(accept_timeout=1.0)
    async with grpc_pair(config) as (server, client, _):
        channels = [grpc.insecure_channel(server.address) for _ in range(6)]
        calls = []
        stop = threading.Event()
        try:
            for i in range(48):
                stub = channels[i % len(channels)].stream_stream(STREAM_METHOD)
                calls.append(stub(_silent(stop), timeout=30))
            await trio.sleep(0.5)
            for _ in range(20):  # every call answers while the streams sit there
                with trio.fail_after(1):
                    assert await client.call(server.address, b"x", 5) == b"echo:x"
            counters = server.counters()
            assert counters["streams"] <= server.config.admission.max_pending_per_host
            assert counters["rejected"].get("host_handshakes_full", 0) >= 48 - 8
            with trio.fail_after(5):
                while server.counters()["streams"] > 0:
                    await trio.sleep(0.05)
            assert server.rejected["handshake_timeout"] >= 1
            # A real stream works again once the silent ones are gone.
            async with client.open_stream(server.address, b"p") as s:
                await s.send(b"h", b"after")
                _, payload = await s.receive()
                assert bytes(payload) == b"after"
        finally:
            stop.set()
            for call in calls:
                call.cancel()
            for channel in channels:
                channel.close()


def _silent(stop: threading.Event) -> Iterator[bytes]:
    """A request iterator that sends nothing until ``stop`` is set."""
    stop.wait(30)
    yield from ()


@trio_test
async def test_a_peer_that_starts_listening_is_reached_within_moments_grpc() -> None:
    """A daemon that dialled a peer before it listened (peers start together, or one restarts) reaches it as
    soon as it listens: the channel's reconnect backoff is short (``RECONNECT_BACKOFF_MS``). With gRPC's
    default (1 s, growing) every call in that second failed at once: probes suspected a healthy peer and a
    leave on SIGTERM never went out (CI: test_restarted_daemon_is_alive_everywhere_within_the_join_time)."""
    from arceusd.cli.swarm import free_ports

    port = free_ports(1)[0]
    address = f"127.0.0.1:{port}"
    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=echo_call, stream_handler=echo_stream
    ) as client:
        with pytest.raises(TransportError) as err:
            await client.call(address, b"early", 2)  # nobody listens there yet: refused
        assert err.value.code == "unavailable"
        async with open_transport(
            Identity.generate(), "127.0.0.1", port, unary_handler=echo_call, stream_handler=echo_stream
        ):
            await trio.sleep(0.3)  # past the 100 ms first backoff, well inside gRPC's default 1 s
            began = time.monotonic()
            assert await client.call(address, b"late", 2) == b"echo:late"
            assert time.monotonic() - began < 1.0


@trio_test
async def test_a_call_right_after_a_refused_one_dials_afresh_grpc() -> None:
    """A call that failed ``unavailable`` retires its channel: the next call dials a fresh one at once instead of
    failing fast for the old channel's reconnect backoff (gRPC shares one subchannel, and its backoff, among the
    channels to an address unless each keeps its own). Daemons started together dial each other's seeds before
    they listen; a peer's first probe right after it listened failed this way, and the peer was suspected."""
    from arceusd.cli.swarm import free_ports

    port = free_ports(1)[0]
    address = f"127.0.0.1:{port}"
    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=echo_call, stream_handler=echo_stream
    ) as client:
        for _ in range(3):  # refused a few times: the old channel's backoff grows
            with pytest.raises(TransportError) as err:
                await client.call(address, b"early", 2)
            assert err.value.code == "unavailable"
        async with open_transport(
            Identity.generate(), "127.0.0.1", port, unary_handler=echo_call, stream_handler=echo_stream
        ):
            assert await client.call(address, b"now", 2) == b"echo:now"  # no wait: a fresh channel dials
        assert not client._retired, "retired channels are closed once their calls ended"
