"""Who may hold the transport's server slots: stream and call admission per source, pure (a clock is passed in).

This module owns the bookkeeping that keeps one source from taking the whole server. gRPC's own
``maximum_concurrent_rpcs`` counts calls and streams together, so 48 streams that never sent a byte once took
all 40 slots and every join, report and start failed while they lasted. Here:

* **Streams and unary calls have separate slots**: at most ``max_streams`` streams (each holds a server
  thread for its life) and ``max_calls`` unary calls in flight; a stream can never take a call's slot.
* **Per source** (the remote IP address: a stranger on the LAN has one): at most ``max_pending_per_host``
  streams still in their handshake, ``max_streams_per_host`` streams in all, ``max_calls_per_host`` calls in
  flight; after the handshake at most ``max_streams_per_peer`` streams per proven peer id.
* **Rate limits per source**: token buckets for calls and for stream opens (``call_rate``/``call_burst``,
  ``stream_rate``/``stream_burst`` per second); a call or stream over the budget is refused at once.

Every refusal returns a reason (the counter key in the transport's ``rejected``): ``streams_full``,
``host_streams_full``, ``host_handshakes_full``, ``peer_streams_full``, ``calls_full``, ``host_calls_full``,
``call_rate``, ``stream_rate``. The per-source tables are bounded (``max_hosts``; idle entries are evicted
first), so a flood of addresses cannot grow them either.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionConfig:
    """Slot and rate limits of one transport server (see the module docstring)."""

    max_streams: int = 32
    max_calls: int = 16
    max_pending_per_host: int = 8
    max_streams_per_host: int = 24
    max_streams_per_peer: int = 16
    max_calls_per_host: int = 12
    call_rate: float = 1000.0
    call_burst: float = 2000.0
    stream_rate: float = 50.0
    stream_burst: float = 100.0
    max_hosts: int = 4096


@dataclass
class _Host:
    calls: int = 0
    pending: int = 0
    streams: int = 0
    call_tokens: float = 0.0
    stream_tokens: float = 0.0
    refilled: float = 0.0

    @property
    def idle(self) -> bool:
        return self.calls == 0 and self.streams == 0


def host_of(grpc_peer: str) -> str:
    """The IP address in a gRPC peer string (``ipv4:10.0.0.7:5555``, ``ipv6:[::1]:5555``, ``unix:...``)."""
    kind, _, rest = grpc_peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.find("]")] if "]" in rest else rest
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    return grpc_peer[:128]


class Admission:
    """Slot and rate bookkeeping for one server. Not thread-safe: the transport holds a lock around it."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.calls = 0
        self.streams = 0
        self.pending = 0
        self._hosts: OrderedDict[str, _Host] = OrderedDict()
        self._peers: dict[str, int] = {}

    # ------------------------------------------------------------------ calls
    def admit_call(self, host: str, now: float) -> str | None:
        """Take a call slot for ``host``; returns the refusal reason, or None when admitted."""
        c = self.config
        entry = self._host(host, now)
        if entry.call_tokens < 1.0:
            return "call_rate"
        if self.calls >= c.max_calls:
            return "calls_full"
        if entry.calls >= c.max_calls_per_host:
            return "host_calls_full"
        entry.call_tokens -= 1.0
        entry.calls += 1
        self.calls += 1
        return None

    def release_call(self, host: str) -> None:
        entry = self._hosts.get(host)
        if entry is not None and entry.calls > 0:
            entry.calls -= 1
        self.calls = max(0, self.calls - 1)

    # ------------------------------------------------------------------ streams
    def admit_stream(self, host: str, now: float) -> str | None:
        """Take a stream slot (in its handshake) for ``host``; the reason it is refused, or None."""
        c = self.config
        entry = self._host(host, now)
        if entry.stream_tokens < 1.0:
            return "stream_rate"
        if self.streams >= c.max_streams:
            return "streams_full"
        if entry.streams >= c.max_streams_per_host:
            return "host_streams_full"
        if entry.pending >= c.max_pending_per_host:
            return "host_handshakes_full"
        entry.stream_tokens -= 1.0
        entry.streams += 1
        entry.pending += 1
        self.streams += 1
        self.pending += 1
        return None

    def handshake_done(self, host: str, peer_id: str) -> str | None:
        """The stream's handshake finished (or failed: ``peer_id`` empty); count it against the proven peer.

        Returns ``peer_streams_full`` when that peer already holds its share (the caller closes the stream
        and then calls :meth:`release_stream` with ``peer_id=""``)."""
        entry = self._hosts.get(host)
        if entry is not None and entry.pending > 0:
            entry.pending -= 1
        self.pending = max(0, self.pending - 1)
        if not peer_id:
            return None
        if self._peers.get(peer_id, 0) >= self.config.max_streams_per_peer:
            return "peer_streams_full"
        self._peers[peer_id] = self._peers.get(peer_id, 0) + 1
        return None

    def release_stream(self, host: str, peer_id: str, *, pending: bool) -> None:
        """The stream ended. ``pending``: it ended inside its handshake (handshake_done was never called)."""
        entry = self._hosts.get(host)
        if entry is not None:
            entry.streams = max(0, entry.streams - 1)
            if pending:
                entry.pending = max(0, entry.pending - 1)
        if pending:
            self.pending = max(0, self.pending - 1)
        self.streams = max(0, self.streams - 1)
        if peer_id:
            left = self._peers.get(peer_id, 0) - 1
            if left > 0:
                self._peers[peer_id] = left
            else:
                self._peers.pop(peer_id, None)

    # ------------------------------------------------------------------ per-host table
    def _host(self, host: str, now: float) -> _Host:
        c = self.config
        entry = self._hosts.get(host)
        if entry is None:
            entry = _Host(call_tokens=c.call_burst, stream_tokens=c.stream_burst, refilled=now)
            self._hosts[host] = entry
            self._evict()
        else:
            elapsed = max(0.0, now - entry.refilled)
            entry.call_tokens = min(c.call_burst, entry.call_tokens + elapsed * c.call_rate)
            entry.stream_tokens = min(c.stream_burst, entry.stream_tokens + elapsed * c.stream_rate)
            entry.refilled = now
        self._hosts.move_to_end(host)
        return entry

    def _evict(self) -> None:
        """Keep at most ``max_hosts`` entries: drop the least recently seen idle ones (busy ones stay, and
        their number is bounded by the slots)."""
        excess = len(self._hosts) - self.config.max_hosts
        if excess <= 0:
            return
        for host in [h for h, e in self._hosts.items() if e.idle][:excess]:
            del self._hosts[host]

    def snapshot(self) -> dict[str, int]:
        return {"calls": self.calls, "streams": self.streams, "handshakes": self.pending, "hosts": len(self._hosts)}
