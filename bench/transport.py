"""Transport benchmark: authenticated gRPC stream vs raw grpcio vs raw TCP, two processes on loopback.

Usage: ``python bench/transport.py [--quick] [--rounds N] [--frames N] [--no-codecs]``

Three receiver child processes (this script with ``--serve MODE``) start once and serve every round; the
sender is this process. A round measures each mode once, in an order that rotates from round to round, so a
burst of load from other processes on the machine lands on baseline and candidate alike. Figures are medians
over rounds, and each ratio is the median of the per-round ratios (auth and its baseline measured seconds
apart, in the same round).

Bulk: N frames of 4 MiB (bytes of a float32 tensor, sent as a memoryview as the workers do), timed from the
first send until the receiver's reply that it got every byte; the reply also carries the receiver's CPU
seconds (all threads) spent on the stream, so ``CPU s/GiB`` is sender + receiver process CPU per GiB moved,
which is less sensitive to load than wall time.

* ``auth/grpc`` - our authenticated stream (handshake + AES-GMAC per frame + trio bridge) / a raw grpcio bytes
  stream with the same channel options; target >= 0.70 (issue #3);
* ``auth/tcp`` - / a plain TCP socket (for scale: gRPC itself costs a lot).

Small messages: sequential unary round trips per second over our ``Call`` against raw grpcio unary round
trips, and one-way 64-byte authenticated frames per second over a stream (target >= 5,000/s). Then, unless
``--no-codecs``, the signed control-message rows of ``bench/wire_codecs.py`` (their own target: >= 5,000
signed seal+open per second).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import trio  # noqa: E402

from arceusd.base.identity import Identity  # noqa: E402
from arceusd.transport import Stream, TransportConfig, open_transport  # noqa: E402

FRAME = 4 * 1024 * 1024
SMALL = 64
CONFIG = TransportConfig()
OPTIONS = [
    ("grpc.max_receive_message_length", CONFIG.max_message),
    ("grpc.max_send_message_length", CONFIG.max_message),
    ("grpc.so_reuseport", 0),
    ("grpc.enable_http_proxy", 0),
]
REPLY = struct.Struct(">Qd")  # bytes received, receiver CPU seconds
BULK_TARGET = 0.70
SMALL_TARGET = 5000


def _cpu() -> float:
    return time.process_time()


# ------------------------------------------------------------------------------------------ receivers


async def _serve_auth() -> None:
    async def on_call(request: bytes) -> bytes:
        return request

    async def on_stream(stream: Stream) -> None:
        total, cpu = 0, _cpu()
        while True:
            try:
                _, payload = await stream.receive()
            except trio.EndOfChannel:
                break
            total += payload.nbytes
        await stream.send(b"total", REPLY.pack(total, _cpu() - cpu))

    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
    ) as transport:
        print(transport.port, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin


def _serve_grpc() -> None:
    def sink(requests: Iterator[bytes], context: object) -> Iterator[bytes]:
        total, cpu = 0, _cpu()
        for message in requests:
            total += len(message)
        yield REPLY.pack(total, _cpu() - cpu)

    def echo(request: bytes, context: object) -> bytes:
        return request

    server = grpc.server(ThreadPoolExecutor(8), options=OPTIONS)
    handlers = {
        "Sink": grpc.stream_stream_rpc_method_handler(sink),
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(None)


def _serve_tcp() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.5)
        print(listener.getsockname()[1], flush=True)
        buf = bytearray(1 << 20)
        while not _stdin_closed():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(None)
                total, cpu = 0, _cpu()
                while True:
                    n = conn.recv_into(buf)
                    if n == 0:
                        break
                    total += n
                conn.sendall(REPLY.pack(total, _cpu() - cpu))


def _stdin_closed() -> bool:
    import select

    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and sys.stdin.read(1) == ""


# ------------------------------------------------------------------------------------------ senders


class _Child:
    def __init__(self, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        if self.proc.stdout is None:
            raise RuntimeError("no pipe to the receiver child")
        self.port = int(self.proc.stdout.readline())
        self.address = f"127.0.0.1:{self.port}"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


@dataclass(frozen=True)
class Bulk:
    mb_s: float
    cpu_s_per_gib: float  # sender + receiver process CPU


def _bulk(frames: int, elapsed: float, sender_cpu: float, reply: bytes, what: str) -> Bulk:
    total, receiver_cpu = REPLY.unpack(reply)
    if total != frames * FRAME:
        raise RuntimeError(f"the {what} receiver got {total} bytes, not {frames * FRAME}")
    gib = frames * FRAME / 2**30
    return Bulk(frames * FRAME / elapsed / 1e6, (sender_cpu + receiver_cpu) / gib)


def _tensor_payload() -> memoryview:
    """4 MiB of float32 tensor memory as the workers send it: a memoryview over the tensor's storage."""
    import torch

    t = torch.randn(FRAME // 4, generator=torch.Generator().manual_seed(0))
    storage = t.untyped_storage()
    view = memoryview((ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())).cast("B")
    _KEEP.append(t)
    return view


_KEEP: list[object] = []


def bench_auth_bulk(child: _Child, payload: memoryview, frames: int) -> Bulk:
    out: list[Bulk] = []

    async def run() -> None:
        async def on_stream(stream: Stream) -> None:
            return

        async def on_call(request: bytes) -> bytes:
            return request

        async with (
            open_transport(
                Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
            ) as transport,
            transport.open_stream(child.address, b"bench") as stream,
        ):
            start, cpu = time.perf_counter(), _cpu()
            for _ in range(frames):
                await stream.send(b"t", payload)
            await stream.send_eof()
            _, reply = await stream.receive()
            elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
            out.append(_bulk(frames, elapsed, cpu, bytes(reply), "authenticated"))

    trio.run(run)
    return out[0]


def bench_grpc_bulk(channel: grpc.Channel, payload: memoryview, frames: int) -> Bulk:
    # grpcio sends only bytes; the copy a caller holding tensor memory must make is inside the timing, as it
    # is for the authenticated stream (which copies the payload into its frame).
    sink = channel.stream_stream("/bench.Raw/Sink")

    def requests() -> Iterator[bytes]:
        for _ in range(frames):
            yield bytes(payload)

    start, cpu = time.perf_counter(), _cpu()
    (reply,) = list(sink(requests()))
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
    return _bulk(frames, elapsed, cpu, reply, "raw grpc")


def bench_tcp_bulk(child: _Child, payload: memoryview, frames: int) -> Bulk:
    with socket.create_connection(("127.0.0.1", child.port)) as conn:
        start, cpu = time.perf_counter(), _cpu()
        for _ in range(frames):
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        reply = b""
        while len(reply) < REPLY.size:
            chunk = conn.recv(REPLY.size - len(reply))
            if not chunk:
                break
            reply += chunk
        elapsed, cpu = time.perf_counter() - start, _cpu() - cpu
    return _bulk(frames, elapsed, cpu, reply, "TCP")


def bench_auth_small(child: _Child, count: int) -> tuple[float, float]:
    """(unary round trips /s, one-way small stream frames /s) over our transport."""
    out: list[float] = []

    async def run() -> None:
        async def on_call(request: bytes) -> bytes:
            return request

        async def on_stream(stream: Stream) -> None:
            return

        async with open_transport(
            Identity.generate(), "127.0.0.1", 0, unary_handler=on_call, stream_handler=on_stream
        ) as transport:
            await transport.call(child.address, b"warm", 5)
            message = b"x" * SMALL
            start = time.perf_counter()
            for _ in range(count):
                await transport.call(child.address, message, 5)
            out.append(count / (time.perf_counter() - start))
            async with transport.open_stream(child.address, b"bench-small") as stream:
                start = time.perf_counter()
                for _ in range(count):
                    await stream.send(b"s", message)
                await stream.send_eof()
                _, reply = await stream.receive()
                out.append(count / (time.perf_counter() - start))
                if REPLY.unpack(reply)[0] != count * SMALL:
                    raise RuntimeError("the receiver did not get every small message")

    trio.run(run)
    return out[0], out[1]


def bench_grpc_unary(channel: grpc.Channel, count: int) -> float:
    echo = channel.unary_unary("/bench.Raw/Echo")
    echo(b"warm", timeout=5)
    message = b"x" * SMALL
    start = time.perf_counter()
    for _ in range(count):
        echo(message, timeout=5)
    return count / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------------ report


def _spread(values: list[float], fmt: str) -> str:
    return f"(min {format(min(values), fmt)}, max {format(max(values), fmt)})"


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def load_wire_codecs() -> ModuleType | None:
    path = ROOT / "bench" / "wire_codecs.py"
    spec = importlib.util.spec_from_file_location("bench_wire_codecs", path)
    if not path.exists() or spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(module)
    return module


def run_bulk(frames: int, rounds: int) -> None:
    children = {mode: _Child(mode) for mode in ("auth", "grpc", "tcp")}
    channel = grpc.insecure_channel(children["grpc"].address, options=OPTIONS)
    payload = _tensor_payload()
    try:
        modes: dict[str, Callable[[], Bulk]] = {
            "grpc": lambda: bench_grpc_bulk(channel, payload, frames),
            "tcp": lambda: bench_tcp_bulk(children["tcp"], payload, frames),
            "auth": lambda: bench_auth_bulk(children["auth"], payload, frames),
        }
        for fn in modes.values():  # warm-up: connections, allocator, first-call costs
            fn()
        runs: dict[str, list[Bulk]] = {mode: [] for mode in modes}
        order = list(modes)
        for r in range(rounds):
            for mode in order[r % 3 :] + order[: r % 3]:
                runs[mode].append(modes[mode]())
        ratio_grpc = [a.mb_s / g.mb_s for a, g in zip(runs["auth"], runs["grpc"], strict=True)]
        ratio_tcp = [a.mb_s / t.mb_s for a, t in zip(runs["auth"], runs["tcp"], strict=True)]
        cpu_grpc = [a.cpu_s_per_gib / g.cpu_s_per_gib for a, g in zip(runs["auth"], runs["grpc"], strict=True)]
        print(
            f"bulk: {frames} x 4 MiB float32 frames, two processes on 127.0.0.1, median of {rounds} interleaved rounds:"
        )
        names = {"tcp": "raw TCP socket", "grpc": "raw grpcio bytes stream", "auth": "authenticated stream"}
        for mode in ("tcp", "grpc", "auth"):
            mb = [b.mb_s for b in runs[mode]]
            cpu = [b.cpu_s_per_gib for b in runs[mode]]
            print(
                f"  {names[mode]:26s}{statistics.median(mb):7.0f} MB/s {_spread(mb, '.0f'):24s}"
                f"CPU (both ends) {statistics.median(cpu):5.2f} s/GiB"
            )
        median_ratio = statistics.median(ratio_grpc)
        print(
            f"  ratio auth/grpc          {median_ratio:7.2f}      {_spread(ratio_grpc, '.2f'):24s}"
            f"target >= {BULK_TARGET:.2f}: {_met(median_ratio >= BULK_TARGET)}"
        )
        print(f"  ratio auth/tcp           {statistics.median(ratio_tcp):7.2f}      {_spread(ratio_tcp, '.2f')}")
        print(f"  CPU ratio auth/grpc      {statistics.median(cpu_grpc):7.2f}      {_spread(cpu_grpc, '.2f')}")
    finally:
        channel.close()
        for child in children.values():
            child.close()


def run_small(count: int, rounds: int) -> None:
    children = {mode: _Child(mode) for mode in ("auth", "grpc")}
    channel = grpc.insecure_channel(children["grpc"].address, options=OPTIONS)
    try:
        unary, stream, raw_unary = [], [], []
        for r in range(rounds):
            if r % 2:
                raw_unary.append(bench_grpc_unary(channel, count))
            u, s = bench_auth_small(children["auth"], count)
            unary.append(u)
            stream.append(s)
            if not r % 2:
                raw_unary.append(bench_grpc_unary(channel, count))
        ratio = [u / g for u, g in zip(unary, raw_unary, strict=True)]
        rate = statistics.median(stream)
        print(f"small messages: {count} x {SMALL} bytes, median of {rounds} interleaved rounds:")
        print(f"  raw grpcio unary round trips   {statistics.median(raw_unary):7.0f} /s  {_spread(raw_unary, '.0f')}")
        print(f"  our unary Call round trips     {statistics.median(unary):7.0f} /s  {_spread(unary, '.0f')}")
        print(f"  ratio ours/raw unary           {statistics.median(ratio):7.2f}     {_spread(ratio, '.2f')}")
        print(
            f"  authenticated stream, one-way  {rate:7.0f} /s  {_spread(stream, '.0f')}  "
            f"target >= {SMALL_TARGET:,}: {_met(rate >= SMALL_TARGET)}"
        )
    finally:
        channel.close()
        for child in children.values():
            child.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short run (5 rounds of 128 MiB, 2,000 small)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5 quick, 9 full)")
    parser.add_argument("--frames", type=int, help="4 MiB frames per bulk measurement (default 32 / 128)")
    parser.add_argument("--no-codecs", action="store_true", help="skip the signed control-message rows")
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
    frames = args.frames or (32 if args.quick else 128)
    rounds = args.rounds or (5 if args.quick else 9)
    if frames < 1 or rounds < 1:
        parser.error("--frames and --rounds must be at least 1")
    run_bulk(frames, rounds)
    run_small(2000 if args.quick else 10000, rounds)
    if not args.no_codecs:
        module = load_wire_codecs()
        if module is None:
            print("signed control messages: bench/wire_codecs.py not loadable, skipped")
        else:
            print("signed control messages (bench/wire_codecs.py):")
            print(module.control_table(args.quick))


if __name__ == "__main__":
    main()
