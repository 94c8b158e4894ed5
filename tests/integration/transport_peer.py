"""Helper process for test_transport.py: stream float32 tensors' bytes over a real authenticated gRPC stream.

``python transport_peer.py receive`` prints its port, hashes every payload it receives and sends the sha256
back.
``python transport_peer.py send PORT FRAMES`` sends FRAMES x 4 MiB of float32 tensor bytes and prints
"<sent sha256> <received sha256>".
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import trio

from arceusd.base.identity import Identity
from arceusd.transport import Stream, open_transport


async def _no_call(request: bytes) -> bytes:
    return request


async def receive() -> None:
    async def on_stream(stream: Stream) -> None:
        digest = hashlib.sha256()
        while True:
            try:
                _, payload = await stream.receive()
            except trio.EndOfChannel:
                break
            digest.update(payload)
        await stream.send(b"sha256", digest.digest())

    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=_no_call, stream_handler=on_stream
    ) as transport:
        print(transport.port, flush=True)
        await trio.sleep(170)


def tensor_view(t: torch.Tensor) -> memoryview:
    storage = t.untyped_storage()
    return memoryview((ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())).cast("B")


async def send(port: int, frames: int) -> None:
    async def on_stream(stream: Stream) -> None:
        return

    generator = torch.Generator().manual_seed(1234)
    async with (
        open_transport(
            Identity.generate(), "127.0.0.1", 0, unary_handler=_no_call, stream_handler=on_stream
        ) as transport,
        transport.open_stream(f"127.0.0.1:{port}", b"tensors") as stream,
    ):
        digest = hashlib.sha256()
        for _ in range(frames):
            t = torch.randn(1024 * 1024, generator=generator, dtype=torch.float32)
            view = tensor_view(t)
            digest.update(view)
            await stream.send(b"f32", view)
        await stream.send_eof()
        _, remote = await stream.receive()
        print(digest.hexdigest(), bytes(remote).hex())


def main() -> None:
    if sys.argv[1] == "receive":
        trio.run(receive)
    else:
        trio.run(send, int(sys.argv[2]), int(sys.argv[3]))


if __name__ == "__main__":
    main()
