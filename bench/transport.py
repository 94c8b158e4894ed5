"""Transport benchmark: authenticated gRPC stream vs raw grpcio vs raw TCP, two processes on loopback.

Usage: ``python bench/transport.py [--quick]``

Each measurement starts a receiver child process (this script with ``--serve MODE``), which prints its port,
and sends from this process. Bulk: N frames of 4 MiB, timed from the first send until the receiver's reply
that it got every byte. Figures are ratios against the baselines measured in the same run:

* ``auth/grpc`` - our authenticated stream (handshake + Poly1305 per frame + trio bridge) / raw grpcio bytes
  stream with the same channel options (target >= 0.7);
* ``auth/tcp`` - / a plain TCP socket.

Small messages: sequential round trips per second over the unary ``Call``, and one-way 64-byte authenticated
frames per second over a stream (target >= 5,000/s). Then, if ``bench/wire_codecs.py`` exists, its ``codec_rows``.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import trio  # noqa: E402

from arceusd.identity import Identity  # noqa: E402
from arceusd.transport import Stream, TransportConfig, open_transport  # noqa: E402

FRAME = 4 * 1024 * 1024
CONFIG = TransportConfig()
OPTIONS = [
    ("grpc.max_receive_message_length", CONFIG.max_message),
    ("grpc.max_send_message_length", CONFIG.max_message),
    ("grpc.so_reuseport", 0),
]


# ------------------------------------------------------------------------------------------ receivers


async def _serve_auth() -> None:
    async def on_call(request: bytes) -> bytes:
        return request

    async def on_stream(stream: Stream) -> None:
        total = 0
        while True:
            try:
                _, payload = await stream.receive()
            except trio.EndOfChannel:
                break
            total += payload.nbytes
        await stream.send(b"total", struct.pack(">Q", total))

    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
    ) as transport:
        print(transport.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin


def _serve_grpc() -> None:
    def sink(requests: Iterator[bytes], context: object) -> Iterator[bytes]:
        total = 0
        for message in requests:
            total += len(message)
        yield struct.pack(">Q", total)

    server = grpc.server(ThreadPoolExecutor(4), options=OPTIONS)
    handler = grpc.stream_stream_rpc_method_handler(sink)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", {"Sink": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(None)


def _serve_tcp() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        print(listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
        with conn:
            buf = bytearray(1 << 20)
            total = 0
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                total += n
            conn.sendall(struct.pack(">Q", total))
        sys.stdin.read()


# ------------------------------------------------------------------------------------------ senders


class _Child:
    def __init__(self, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def bench_auth(frames: int, small: int) -> tuple[float, float, float, float]:
    child = _Child("auth")
    results: list[float] = []

    async def run() -> None:
        async def on_call(request: bytes) -> bytes:
            return request

        async def on_stream(stream: Stream) -> None:
            return

        async with open_transport(
            Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
        ) as transport:
            address = f"127.0.0.1:{child.port}"
            payload = bytes(FRAME)
            async with transport.open_stream(address, b"bench") as stream:
                start, cpu = time.perf_counter(), time.process_time()
                for _ in range(frames):
                    await stream.send(b"t", payload)
                await stream.send_eof()
                _, reply = await stream.receive()
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                if struct.unpack(">Q", reply)[0] != frames * FRAME:
                    raise RuntimeError("the receiver did not get every byte")
                results.append(frames * FRAME / elapsed / 1e6)
                results.append(cpu / (frames * FRAME / 2**30))
            await transport.call(address, b"warm", 5)
            start = time.perf_counter()
            for _ in range(small):
                await transport.call(address, b"x" * 64, 5)
            results.append(small / (time.perf_counter() - start))
            async with transport.open_stream(address, b"bench-small") as stream:
                message = b"y" * 64
                start = time.perf_counter()
                for _ in range(small):
                    await stream.send(b"s", message)
                await stream.send_eof()
                _, reply = await stream.receive()
                results.append(small / (time.perf_counter() - start))
                if struct.unpack(">Q", reply)[0] != small * 64:
                    raise RuntimeError("the receiver did not get every small message")

    try:
        trio.run(run)
    finally:
        child.close()
    return results[0], results[2], results[3], results[1]  # MB/s, unary /s, stream /s, CPU s/GiB


def bench_grpc(frames: int) -> tuple[float, float]:
    child = _Child("grpc")
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{child.port}", options=OPTIONS)
        sink = channel.stream_stream("/bench.Raw/Sink")
        payload = bytes(FRAME)
        start, cpu = time.perf_counter(), time.process_time()
        (reply,) = list(sink(iter([payload] * frames)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if struct.unpack(">Q", reply)[0] != frames * FRAME:
            raise RuntimeError("the raw grpc receiver did not get every byte")
        channel.close()
    finally:
        child.close()
    return frames * FRAME / elapsed / 1e6, cpu / (frames * FRAME / 2**30)


def bench_tcp(frames: int) -> tuple[float, float]:
    child = _Child("tcp")
    try:
        payload = bytes(FRAME)
        with socket.create_connection(("127.0.0.1", child.port)) as conn:
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(frames):
                conn.sendall(payload)
            conn.shutdown(socket.SHUT_WR)
            reply = conn.recv(8)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if struct.unpack(">Q", reply)[0] != frames * FRAME:
            raise RuntimeError("the TCP receiver did not get every byte")
    finally:
        child.close()
    return frames * FRAME / elapsed / 1e6, cpu / (frames * FRAME / 2**30)


def codec_rows(quick: bool) -> None:
    path = ROOT / "bench" / "wire_codecs.py"
    if not path.exists():
        print("codecs: bench/wire_codecs.py not present, skipped")
        return
    spec = importlib.util.spec_from_file_location("bench_codecs", path)
    if spec is None or spec.loader is None:
        print("codecs: cannot load bench/wire_codecs.py, skipped")
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = getattr(module, "codec_rows", None)
    if rows is None:
        print("codecs: bench/wire_codecs.py has no codec_rows(quick), skipped")
        return
    for row in rows(quick):
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="short run (2 rounds of 256 MiB and 2,000 small messages)"
    )
    parser.add_argument("--serve", choices=["auth", "grpc", "tcp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "auth":
        trio.run(_serve_auth)
        return
    if args.serve == "grpc":
        _serve_grpc()
        return
    if args.serve == "tcp":
        _serve_tcp()
        return
    frames, small, rounds = (64, 2000, 2) if args.quick else (256, 10000, 3)
    # Rounds interleave the three modes and each keeps its best, so a burst of load from other processes on
    # the machine does not land on one mode only. Sender CPU seconds per GiB are less sensitive to load.
    grpc_runs, tcp_runs, auth_runs = [], [], []
    for _ in range(rounds):
        grpc_runs.append(bench_grpc(frames))
        tcp_runs.append(bench_tcp(frames))
        auth_runs.append(bench_auth(frames, small))
    raw_grpc, grpc_cpu = max(grpc_runs)
    raw_tcp, tcp_cpu = max(tcp_runs)
    auth = max(run[0] for run in auth_runs)
    auth_cpu = min(run[3] for run in auth_runs)
    unary_rate = max(run[1] for run in auth_runs)
    stream_rate = max(run[2] for run in auth_runs)
    print(f"bulk, {frames} x 4 MiB frames, two processes on 127.0.0.1, best of {rounds} interleaved rounds:")
    print(f"  raw TCP socket            {raw_tcp:9.0f} MB/s   sender CPU {tcp_cpu:5.2f} s/GiB")
    print(f"  raw grpcio bytes stream   {raw_grpc:9.0f} MB/s   sender CPU {grpc_cpu:5.2f} s/GiB")
    print(f"  authenticated stream      {auth:9.0f} MB/s   sender CPU {auth_cpu:5.2f} s/GiB")
    print(f"  ratio auth/grpc           {auth / raw_grpc:9.2f}   (target >= 0.70)")
    print(f"  ratio auth/tcp            {auth / raw_tcp:9.2f}")
    print(f"  sender CPU auth/grpc      {auth_cpu / grpc_cpu:9.2f}")
    print(f"small messages ({small}, 64 bytes), best of {rounds}:")
    print(f"  unary Call round trips    {unary_rate:9.0f} /s")
    print(f"  authenticated stream      {stream_rate:9.0f} /s   (target >= 5,000)")
    codec_rows(args.quick)


if __name__ == "__main__":
    main()
