"""Measuring a link to a peer, for the planner: :func:`measure_link` times an async ``echo(payload) -> payload``
callable (the transport supplies it: ``arceusd.jobs.leader.starting``) for round-trip time (median of small
echoes), bandwidth (one large echo) and the cost of one message (a burst of small echoes in flight at once)."""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from partitioner.inputs import Link


@dataclass(frozen=True)
class LinkMeasurement:
    rtt_s: float
    bandwidth_bytes_per_s: float
    message_s: float = 0.0
    """Seconds one message keeps the two ends busy: a burst of small echoes in flight at once, per message."""

    def to_link(self) -> Link:
        return Link(self.rtt_s, self.bandwidth_bytes_per_s, self.message_s)


def _payload(n: int) -> bytes:
    pattern = bytes(range(256))
    return (pattern * (n // 256 + 1))[:n]


async def measure_link(
    echo: Callable[[bytes], Awaitable[bytes]],
    small_count: int = 5,
    small_size: int = 64,
    large_size: int = 1 << 20,
    burst: int = 16,
    in_flight: int = 4,
) -> LinkMeasurement:
    """RTT = median time of ``small_count`` echoes of ``small_size`` bytes; bandwidth from one echo of
    ``large_size`` bytes: the payload crosses the link twice, so bw = 2 x size / (time - rtt); the cost of
    one message from ``burst`` small echoes with ``in_flight`` of them outstanding at once: their latencies
    overlap, what does not is the time each message keeps the two ends busy (authenticating, framing,
    scheduling), so message_s = elapsed / (2 x burst) (two messages per echo).

    Uses ``trio.current_time()``, so it runs under trio's MockClock in tests.
    Error handling: ``ValueError`` when the echo returns different bytes (a broken transport).
    """
    if small_count <= 0 or small_size <= 0 or large_size <= small_size or burst <= 0 or in_flight <= 0:
        raise ValueError("need small_count, burst, in_flight > 0 and 0 < small_size < large_size")
    small = _payload(small_size)

    async def once(payload: bytes) -> float:
        start = trio.current_time()
        got = await echo(payload)
        took = trio.current_time() - start
        if got != payload:
            raise ValueError("echo returned different bytes than it was sent")
        return took

    rtt = statistics.median([await once(small) for _ in range(small_count)])
    elapsed = await once(_payload(large_size))
    transfer = elapsed - rtt
    if transfer <= 0:  # faster than the small echoes' median: the large payload costs ~nothing extra
        transfer = max(elapsed, 1e-9)
    left = [burst]

    async def worker() -> None:
        while left[0] > 0:  # bounded: every pass takes one of ``burst``
            left[0] -= 1
            await once(small)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(min(in_flight, burst)):
            nursery.start_soon(worker)
    message = (trio.current_time() - start) / (2 * burst)
    return LinkMeasurement(rtt, 2 * large_size / transfer, message)


__all__ = ["LinkMeasurement", "measure_link"]
