"""Codec benchmark: tensor codecs and signed control messages, as ratios against same-run baselines.

Usage: ``python bench/wire_codecs.py [--quick] [--rounds N] [--control-only]``

Tensor codecs: a 4 MiB float32 tensor (1 Mi normal values) is framed with each codec and decoded again.
Per codec: encode+decode throughput in MB/s of float32 input, that throughput as a ratio of a plain memory
copy of the same 4 MiB (``bytearray(blob)``) measured in this run, the wire-size reduction versus raw
float32, and the maximum absolute and relative (``||err|| / ||x||``) error.

Control messages: seal+open (Ed25519 sign, verify, sha256, replay window, msgpack) of a small ``Ping`` per
second (target >= 5,000/s), as a fraction of the bare Ed25519 sign+verify floor measured in the same rounds
(interleaved, medians), and its cost as a ratio of plain msgpack encode+decode of the same message. Seal and
open run here on one thread; in deployment the sender pays the sign and the receiver the verify.

``codec_rows(quick)`` and ``control_rows(quick)`` return the figures as dicts; ``control_table(quick)`` prints
the latter (bench/transport.py shows it after its own figures).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import torch  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey  # noqa: E402

from arceusd.base.identity import Identity  # noqa: E402
from protocol import codec, compression, envelope  # noqa: E402
from protocol.decoding import decode_tensor_frame  # noqa: E402
from protocol.error_feedback import ErrorFeedback  # noqa: E402
from protocol.messages import Ping  # noqa: E402
from protocol.replay import ReplayGuard  # noqa: E402
from protocol.tensors import RAW, TensorCodec, encode_tensor_frame  # noqa: E402

NUMEL = 1 << 20  # 4 MiB of float32
CONTROL_TARGET = 5000  # signed seal+open per second (issue #3)
MB = 1e6


def _best(fn: Callable[[], object], reps: int) -> float:
    """Best wall time of ``reps`` calls (seconds)."""
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def codec_rows(quick: bool) -> list[dict[str, Any]]:
    """One row per codec: enc+dec MB/s, ratio to same-run memcpy, size reduction, max abs / rel error."""
    torch.set_num_threads(1)
    reps = 3 if quick else 10
    x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(0))
    nbytes = x.numel() * x.element_size()
    blob = encode_tensor_frame(x)
    memcpy_s = _best(lambda: bytearray(blob), reps)
    rows: list[dict[str, Any]] = [
        {"codec": "memcpy baseline", "enc_dec_MB_s": round(nbytes / memcpy_s / MB), "vs_memcpy": 1.0}
    ]
    codecs: list[tuple[str, TensorCodec]] = [
        ("raw", RAW),
        ("fp16", compression.Fp16Codec()),
        ("bf16", compression.Bf16Codec()),
        ("int8-block256", compression.Int8BlockCodec(256)),
        ("top-k 10%", compression.TopKCodec(ratio=0.10)),
        ("top-k 1%", compression.TopKCodec(ratio=0.01)),
    ]
    for name, c in codecs:

        def roundtrip(c: TensorCodec = c) -> torch.Tensor:
            return decode_tensor_frame(encode_tensor_frame(x, c))

        secs = _best(roundtrip, reps)
        frame = encode_tensor_frame(x, c)
        err = decode_tensor_frame(frame) - x
        rows.append(
            {
                "codec": name,
                "enc_dec_MB_s": round(nbytes / secs / MB),
                "vs_memcpy": round(memcpy_s / secs, 3),
                "size_reduction": round(len(blob) / len(frame), 2),
                "max_abs_err": float(err.abs().max()),
                "rel_err": float(err.norm() / x.norm()),
            }
        )
    ef = ErrorFeedback(compression.TopKCodec(ratio=0.01))
    secs = _best(lambda: decode_tensor_frame(ef.encode(x)), reps)
    rows.append(
        {
            "codec": "top-k 1% + error feedback",
            "enc_dec_MB_s": round(nbytes / secs / MB),
            "vs_memcpy": round(memcpy_s / secs, 3),
            "size_reduction": round(len(blob) / len(ef.encode(x)), 2),
        }
    )
    return rows


def control_rows(quick: bool, rounds: int | None = None) -> list[dict[str, Any]]:
    """Signed control messages per second (seal + open of a Ping) against same-run baselines.

    Rounds interleave four measurements (rotating their order) and every figure is a median over rounds, so
    load from other processes lands on all of them alike:

    * ``signed Ping seal+open``: :func:`protocol.envelope.seal_message` + :func:`~protocol.envelope.open_message`
      (Ed25519 sign and verify, sha256 of the payload, checks, replay window, msgpack), target >= 5,000/s;
    * ``Ed25519 sign+verify floor``: the bare primitives on a header-sized message with a cached key object,
      the most any envelope built on cryptography's Ed25519 could reach on this machine right now;
    * the checked codec alone and plain msgpack, for scale.
    """
    n = 500 if quick else 2000
    rounds = rounds or (5 if quick else 9)
    alice, bob = Identity.generate(), Identity.generate()
    keys = {alice.peer_id: alice.public_key_raw}
    guard = ReplayGuard()
    msg = Ping(seq=1, target=bob.peer_id, incarnation=3)
    now = 1_700_000_000_000
    seq = iter(range(1 << 62))
    public = Ed25519PublicKey.from_public_bytes(alice.public_key_raw)
    signed_bytes = envelope.SIGNING_TAG + bytes(envelope.HEADER_LEN)

    def signed() -> None:
        for _ in range(n):
            frame = envelope.seal_message(alice, msg, boot_id=1, seq=next(seq), timestamp_ms=now, recipient=bob.peer_id)
            envelope.open_message(
                frame,
                lookup_key=keys.get,
                expect_recipient=bob.peer_id,
                expect_job=envelope.NO_JOB,
                replay_guard=guard,
                now_ms=now,
            )

    def floor() -> None:
        for _ in range(n):
            public.verify(alice.sign(signed_bytes), signed_bytes)

    def plain() -> None:
        for _ in range(n):
            msgpack.unpackb(msgpack.packb({"seq": 1, "target": bob.peer_id, "incarnation": 3, "piggyback": []}))

    def ours_unsigned() -> None:
        for _ in range(n):
            codec.decode_as(Ping, codec.encode(msg))

    fns: dict[str, Callable[[], None]] = {
        "signed": signed,
        "floor": floor,
        "codec": ours_unsigned,
        "plain": plain,
    }
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    rate = {name: n / statistics.median(ts) for name, ts in times.items()}
    of_floor = statistics.median(f / s for s, f in zip(times["signed"], times["floor"], strict=True))
    signed_rate = round(rate["signed"])
    return [
        {
            "figure": "signed Ping seal+open",
            "msgs_per_s": signed_rate,
            "of_floor": round(of_floor, 2),
            "cost_vs_plain_msgpack": round(rate["plain"] / rate["signed"], 1),
            "target": f">= {CONTROL_TARGET}/s: {'MET' if signed_rate >= CONTROL_TARGET else 'NOT MET'}",
        },
        {
            "figure": "Ed25519 sign+verify floor",
            "msgs_per_s": round(rate["floor"]),
            "of_floor": 1.0,
            "cost_vs_plain_msgpack": round(rate["plain"] / rate["floor"], 1),
        },
        {
            "figure": "checked codec encode+decode (unsigned)",
            "msgs_per_s": round(rate["codec"]),
            "cost_vs_plain_msgpack": round(rate["plain"] / rate["codec"], 1),
        },
        {
            "figure": "plain msgpack encode+decode",
            "msgs_per_s": round(rate["plain"]),
            "cost_vs_plain_msgpack": 1.0,
        },
    ]


def control_table(quick: bool, rounds: int | None = None) -> str:
    """:func:`control_rows` as a printable table."""
    return _table(control_rows(quick, rounds))


def _table(rows: list[dict[str, Any]]) -> str:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _fmt(v: object) -> str:
    if isinstance(v, float) and (abs(v) < 1e-2 and v != 0):
        return f"{v:.2e}"
    return str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--rounds", type=int, help="interleaved rounds of the control-message figures")
    parser.add_argument("--control-only", action="store_true", help="skip the tensor codec rows")
    args = parser.parse_args()
    if not args.control_only:
        print(f"tensor codecs, {NUMEL * 4 // (1 << 20)} MiB float32 N(0,1), one thread:")
        print(_table(codec_rows(args.quick)))
        print()
    print("signed control messages (median of interleaved rounds):")
    print(control_table(args.quick, args.rounds))


if __name__ == "__main__":
    main()
