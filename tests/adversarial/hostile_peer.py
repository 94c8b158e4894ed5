"""A hostile peer: its own process and identity key, speaking the real protocol (the project's transport,
peer service, envelopes and stream handshake) to attack a target daemon on loopback.

``python -m tests.adversarial.hostile_peer ATTACK --target HOST:PORT [options]`` runs one attack and prints one
JSON line of what it observed (answers by kind, refusal codes). Attacks (issue #19's items):

* ``silent-streams`` (item 8): keep ``--count`` raw gRPC ``Stream`` calls open that never send a byte; a call
  the server ends is reopened at once, until ``--seconds`` pass;
* ``big-calls`` (item 9): ``--count`` concurrent unauthenticated unary calls of ``--mib`` MiB each;
* ``announce-flood`` (item 6): say hello with ``--identities`` keys and send ``--count`` signed JobAnnounce
  messages in all (a valid spec padded to ``--spec-kib`` KiB, fresh job ids; every tenth id is ``../`` or
  a terminal escape);
* ``device`` (item 10): run a real peer service whose hello carries ``--device`` (terminal escapes) and
  stay in the membership for ``--seconds``;
* ``dense-maps`` (issue 29): say hello with one key and send ``--count`` signed envelopes of the three 4 MiB
  message types whose payload is ``--mib`` MiB of densely packed empty msgpack maps, ``--batch`` at a time
  (the former decoder built 4 million maps per frame before any check);
* ``frame-fuzz``: ``--hellos`` mutated stream handshakes, then ``--frames`` mutated frames (deterministic from
  ``--seed``) on authenticated streams, ``--batch`` per stream: most are sealed by us (a member holds the
  session keys, so they pass the MAC and reach the receiver's decoder), one in ``--raw-every`` is a sealed
  frame with flipped bytes (fails the MAC or the length checks; the receiver cuts that stream).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import trio  # noqa: E402

from arceusd.base.identity import Identity  # noqa: E402
from arceusd.membership.config import local  # noqa: E402
from arceusd.network.peers import PeerService  # noqa: E402
from arceusd.transport import CALL_METHOD, STREAM_METHOD, Stream, TransportError, open_transport  # noqa: E402
from protocol import stream_auth as sa  # noqa: E402
from protocol.errors import LocalProtocolError, RemoteProtocolError  # noqa: E402
from protocol.job_wire import JobAck  # noqa: E402
from protocol.messages import JobAnnounce  # noqa: E402

HOSTILE_DEVICE = "linux\x1b]0;owned\x07\x1b[2J\x1b[31mRED\x9b0m\u202eevil\r\nfake line"


def _code(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    code = getattr(exc, "code", None)
    if callable(code):
        return str(code().name)
    return type(exc).__name__


# ----------------------------------------------------------------------------------------------- raw gRPC


def silent_streams(target: str, count: int, seconds: float) -> dict[str, Any]:
    def silence(ended: threading.Event) -> Iterator[bytes]:
        # grpc's client reads a request iterator in a thread of its own per call: this one ends with its call, or
        # the attacker piles up a blocked thread per refused stream (1,500 within 5 s) and slows the machine that
        # the victim shares with it, which a stranger on another machine would not do to us
        ended.wait(seconds + 10)  # every call still open when the attack ends is cancelled, which sets it
        yield from ()

    channels = [grpc.insecure_channel(target) for _ in range(8)]
    codes: Counter[str] = Counter()
    lifetimes: list[float] = []
    calls: list[tuple[Any, float]] = []
    opened = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            while len(calls) < count:
                stub = channels[opened % len(channels)].stream_stream(STREAM_METHOD)
                ended = threading.Event()
                call = stub(silence(ended), timeout=seconds + 10)
                call.add_done_callback(lambda _call, ended=ended: ended.set())
                calls.append((call, time.monotonic()))
                opened += 1
            still = []
            for call, began in calls:
                if call.done():
                    codes[str(call.code().name)] += 1
                    lifetimes.append(time.monotonic() - began)
                else:
                    still.append((call, began))
            calls = still
            time.sleep(0.02)
    finally:
        for call, _ in calls:
            call.cancel()
        for channel in channels:
            channel.close()
    return {"opened": opened, "ended": dict(codes), "longest_s": round(max(lifetimes, default=0.0), 3)}


def big_calls(target: str, count: int, mib: int) -> dict[str, Any]:
    payload = b"E" + os.urandom(1024) * (mib * 1024)
    opts = [("grpc.max_send_message_length", len(payload) + 1024)]
    channels = [grpc.insecure_channel(target, options=opts) for _ in range(count)]
    try:
        futures = [c.unary_unary(CALL_METHOD).future(payload, timeout=30) for c in channels]
        codes = Counter(_code(f.exception()) for f in futures)
    finally:
        for channel in channels:
            channel.close()
    return {"codes": dict(codes)}


# ---------------------------------------------------------------------------------------- real protocol


async def _refuse(_request: bytes) -> bytes:
    return b""


async def _refuse_stream(_stream: Stream) -> None:
    return None


def _padded_spec(kib: int) -> tuple[bytes, bytes]:
    """A valid announced spec (the MNIST example's), padded with JSON whitespace to ``kib`` KiB, and its
    hash: the daemon parses it, so it is stored unless something bounds it."""
    from arceusd.jobs.spec.schema import load_spec, spec_hash, to_dict

    spec = load_spec(ROOT / "examples" / "mnist-mlp.toml")
    text = json.dumps(to_dict(spec), sort_keys=True).encode()
    return text + b" " * max(0, kib * 1024 - len(text)), bytes.fromhex(spec_hash(spec))


async def announce_flood(target: str, count: int, identities: int, spec_kib: int) -> dict[str, Any]:
    spec, digest = _padded_spec(spec_kib)
    rng = random.Random(7)
    answers: Counter[str] = Counter()
    services = []
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(_serve_transport, Identity.generate())  # calls out; serves nothing
        for _ in range(identities):
            identity = Identity.generate()
            service = PeerService(identity, transport, local(), transport.address, rng.getrandbits(62))
            if await service.hello(target) is None:
                answers["no_hello"] += 1
                continue
            services.append(service)
        if not services:
            nursery.cancel_scope.cancel()
            return {"answers": dict(answers)}
        target_id = services[0]._hello_addresses[target]

        async def one(i: int) -> None:
            service = services[i % len(services)]
            job_id = f"{rng.getrandbits(128):032x}"
            if i % 10 == 9:
                job_id = ["../../../../tmp/pwned-by-announce", "\x1b[2J\x1b]0;owned\x07" + "a" * 20][i % 20 // 10]
            msg = JobAnnounce(job_id, service.identity.peer_id, digest, spec)
            reply = await service.request(target, target_id, msg, timeout=10.0)
            if not isinstance(reply, JobAck):
                answers["no_answer"] += 1
            else:
                answers["accepted" if reply.ok else f"refused:{reply.reason[:40]}"] += 1

        for start in range(0, count, 32):
            async with trio.open_nursery() as batch:
                for i in range(start, min(count, start + 32)):
                    batch.start_soon(one, i)
        nursery.cancel_scope.cancel()
    return {"answers": dict(answers), "identities": len(services)}


def dense_empty_maps(size: int) -> bytes:
    """About ``size`` bytes of msgpack: a one-field map holding arrays of 65,535 empty maps each."""
    inner = b"\xdc\xff\xff" + b"\x80" * 65_535
    n = max(1, (size - 16) // len(inner))
    return b"\x81\xa6states\xdc" + n.to_bytes(2, "big") + inner * n


async def dense_maps(target: str, count: int, mib: int, batch: int) -> dict[str, Any]:
    from arceusd.network.peers import wall_ms
    from protocol.envelope import seal
    from protocol.messages import schema_for_id

    big_types = (56, 71, 78)  # SwimPushPull, JobStart, ShardData: max_size 4 MiB each
    size = min(mib * 1024 * 1024, *(s.max_size for t in big_types if (s := schema_for_id(t)) is not None))
    payload = dense_empty_maps(size)
    answers: Counter[str] = Counter()
    slowest = 0.0
    async with trio.open_nursery() as nursery:
        transport = await nursery.start(_serve_transport, Identity.generate())
        service = PeerService(Identity.generate(), transport, local(), transport.address, random.getrandbits(62))
        if await service.hello(target) is None:
            nursery.cancel_scope.cancel()
            return {"answers": {"no_hello": 1}}
        target_id = service._hello_addresses[target]

        async def one(i: int) -> None:
            nonlocal slowest
            frame = seal(
                service.identity,
                msg_type=big_types[i % len(big_types)],
                payload=payload,
                boot_id=service.boot_id,
                seq=i + 1,
                timestamp_ms=wall_ms(),
                recipient=target_id,
            )
            began = trio.current_time()
            try:
                answer = await transport.call(target, b"E" + frame, 20.0)
                answers["empty" if answer == b"" else f"answer:{answer[:1]!r}"] += 1
            except TransportError as exc:
                answers[f"error:{exc.code}"] += 1
            slowest = max(slowest, trio.current_time() - began)

        for start in range(0, count, batch):
            async with trio.open_nursery() as group:
                for i in range(start, min(count, start + batch)):
                    group.start_soon(one, i)
        nursery.cancel_scope.cancel()
    return {"answers": dict(answers), "payload_bytes": len(payload), "slowest_s": round(slowest, 3)}


async def _serve_transport(identity: Identity, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with open_transport(
        identity, "127.0.0.1", 0, unary_handler=_refuse, stream_handler=_refuse_stream
    ) as transport:
        task_status.started(transport)
        await trio.sleep_forever()


async def device(target: str, text: str, seconds: float) -> dict[str, Any]:
    identity = Identity.generate()
    holder: dict[str, PeerService] = {}

    async def on_call(request: bytes) -> bytes:
        return await holder["s"].handle_call(request) if "s" in holder else b""

    async with open_transport(
        identity, "127.0.0.1", 0, unary_handler=on_call, stream_handler=_refuse_stream
    ) as transport:
        service = PeerService(identity, transport, local(), transport.address, 12345, text)
        holder["s"] = service
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run, (target,))
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()
    return {"peer_id": identity.peer_id, "alive_seen": len(service.alive_peers())}


# ------------------------------------------------------------------------------------------- frame fuzz


def _tensor_frame(rng: random.Random) -> tuple[bytes, bytes]:
    """A well-formed worker pipe frame (header: phase/step/micro-batch + tensor header; payload: its bytes)."""
    import struct

    import torch

    from protocol.tensors import encode_tensor_parts

    shape = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
    parts = encode_tensor_parts(torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape))
    return struct.pack(">BQI", 0, rng.randint(0, 99), rng.randint(0, 7)) + bytes(parts[0]), b"".join(
        bytes(p) for p in parts[1:]
    )


def _mutate(rng: random.Random, data: bytes, max_len: int) -> bytes:
    choice = rng.randrange(7)
    b = bytearray(data)
    if choice == 0 and b:  # flip bits
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate
        del b[rng.randint(0, len(b)) :]
    elif choice == 2:  # extend with junk
        b += os.urandom(rng.randint(1, 64))
    elif choice == 3 and b:  # overwrite a 4-byte field with an extreme value
        at = rng.randrange(len(b))
        b[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
    elif choice == 4:  # random bytes
        b = bytearray(rng.randbytes(rng.randint(0, 96)))
    elif choice == 5:  # empty
        b = bytearray()
    else:  # duplicate a slice
        if b:
            i = rng.randrange(len(b))
            b[i:i] = b[i : i + rng.randint(1, 32)]
    return bytes(b[:max_len])


def _hello_fuzz(target: str, count: int, rng: random.Random) -> Counter[str]:
    codes: Counter[str] = Counter()
    identity = Identity.generate()
    channel = grpc.insecure_channel(target)
    try:
        for _ in range(count):
            hs = sa.ClientHandshake(
                identity, purpose=b"fuzz", expect_peer_id=None, now_ms=int(time.time() * 1000), random_bytes=os.urandom
            )
            hello = _mutate(rng, hs.hello, 4096)
            call = channel.stream_stream(STREAM_METHOD)(iter([hello]), timeout=5)
            try:
                for _ in call:
                    pass
                codes["ok"] += 1
            except grpc.RpcError as exc:
                codes[_code(exc)] += 1
            time.sleep(1 / 40)  # under the per-source stream rate (50/s): the fuzz is meant to reach the parser
    finally:
        channel.close()
    return codes


async def frame_fuzz(target: str, frames: int, hellos: int, batch: int, raw_every: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    hello_codes = await trio.to_thread.run_sync(_hello_fuzz, target, hellos, rng)
    identity = Identity.generate()
    outcomes: Counter[str] = Counter()
    sent = streams = 0
    deadline = trio.current_time() + 120
    async with open_transport(
        identity, "127.0.0.1", 0, unary_handler=_refuse, stream_handler=_refuse_stream
    ) as transport:
        while sent < frames:
            try:
                stream = await transport.connect_stream(target, b"fuzz/0/act")
            except (TransportError, RemoteProtocolError) as exc:
                outcomes[f"connect:{getattr(exc, 'code', getattr(exc, 'reason', '?'))}"] += 1
                await trio.sleep(0.05)
                continue
            streams += 1
            # A receiver that stops reading (a daemon refuses every stream after its handshake) leaves our
            # sends waiting on flow control: each batch gets a few seconds, then the next stream.
            with trio.move_on_after(5) as scope:
                await _fuzz_batch(stream, rng, batch, raw_every, outcomes)
            sent = outcomes["sealed"] + outcomes["raw"]
            if scope.cancelled_caught:
                outcomes["batch_timeout"] += 1
            with trio.move_on_after(2):
                await stream.aclose()
            if trio.current_time() > deadline:
                outcomes["deadline"] += 1
                break
    return {"frames": sent, "streams": streams, "hellos": dict(hello_codes), "outcomes": dict(outcomes)}


async def _fuzz_batch(stream: Stream, rng: random.Random, batch: int, raw_every: int, outcomes: Counter[str]) -> None:
    """Send up to ``batch`` mutated frames on ``stream``, counting each queued one in ``outcomes``."""
    try:
        for _ in range(batch):
            header, payload = _tensor_frame(rng)
            if rng.random() < 0.8:
                header = _mutate(rng, header, sa.DEFAULT_MAX_HEADER)
            if rng.random() < 0.3:
                payload = _mutate(rng, payload, 1 << 20)
            if raw_every and rng.randrange(raw_every) == 0:
                wire = _mutate(rng, stream._session.sealer.seal(header, payload), 1 << 20)
                await stream._conduit.wait_space()
                stream._conduit.put_nowait(wire)
                outcomes["raw"] += 1
                return
            await stream.send(header, payload)
            outcomes["sealed"] += 1
    except (TransportError, RemoteProtocolError, LocalProtocolError, trio.ClosedResourceError) as exc:
        outcomes[f"cut:{type(exc).__name__}"] += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "attack", choices=["silent-streams", "big-calls", "announce-flood", "device", "frame-fuzz", "dense-maps"]
    )
    p.add_argument("--target", required=True)
    p.add_argument("--count", type=int, default=48)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--mib", type=int, default=60)
    p.add_argument("--identities", type=int, default=1)
    p.add_argument("--spec-kib", type=int, default=900)
    p.add_argument("--device", default=HOSTILE_DEVICE)
    p.add_argument("--frames", type=int, default=10_000)
    p.add_argument("--hellos", type=int, default=100)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--raw-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.attack == "silent-streams":
        result = silent_streams(a.target, a.count, a.seconds)
    elif a.attack == "big-calls":
        result = big_calls(a.target, a.count, a.mib)
    elif a.attack == "announce-flood":
        result = trio.run(announce_flood, a.target, a.count, a.identities, a.spec_kib)
    elif a.attack == "device":
        result = trio.run(device, a.target, a.device, a.seconds)
    elif a.attack == "dense-maps":
        result = trio.run(dense_maps, a.target, a.count, a.mib, a.batch)
    else:
        result = trio.run(frame_fuzz, a.target, a.frames, a.hellos, a.batch, a.raw_every, a.seed)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
