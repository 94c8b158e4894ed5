"""Peer-to-peer transport: gRPC bridged to trio, with authenticated streams and an in-memory twin.

This package is the only place that imports grpc (in :mod:`arceusd.transport.grpc_transport`). Public API::

    async with open_transport(identity, "0.0.0.0", port,
                              unary_handler=on_call, stream_handler=on_stream) as transport:
        transport.port, transport.address, transport.rejected, transport.failures
        reply = await transport.call("10.0.0.7:7000", request_bytes, timeout=5.0)
        async with transport.open_stream("10.0.0.7:7000", b"job-1/stage-2", expect_peer_id=pid) as stream:
            await stream.send(header_bytes, payload_buffer)
            header, payload = await stream.receive()        # trio.EndOfChannel when the peer closed

    async def on_call(request: bytes) -> bytes: ...
    async def on_stream(stream: Stream) -> None: ...      # stream.peer_id is proven, stream.purpose as asked

``MemoryNetwork().open_transport(...)`` gives the same interface without sockets, for tests.
"""

from arceusd.transport.grpc_transport import (
    CALL_METHOD,
    SERVICE,
    STREAM_METHOD,
    GrpcTransport,
    StreamHandler,
    UnaryHandler,
    open_transport,
)
from arceusd.transport.memory import MemoryNetwork, MemoryTransport
from arceusd.transport.stream import Stream, TransportConfig, TransportError

__all__ = [
    "CALL_METHOD",
    "SERVICE",
    "STREAM_METHOD",
    "GrpcTransport",
    "MemoryNetwork",
    "MemoryTransport",
    "Stream",
    "StreamHandler",
    "TransportConfig",
    "TransportError",
    "UnaryHandler",
    "open_transport",
]
