"""Anti-replay for authenticated messages: sliding sequence windows plus timestamp freshness.

One window per ``(sender, boot id, stream id)``, like the IPsec/DTLS anti-replay bitmap (RFC 4303 3.4.3, RFC
6347 4.1.2.6): the highest accepted sequence number ``top`` and a bitmap of the ``window`` numbers below it.
A number above ``top`` slides the window; one inside it is accepted once; one below it is refused. Sequence
numbers must therefore grow per stream (reordering within ``window`` is tolerated).

Freshness: the message timestamp must lie within ``skew_ms`` of the caller's ``now_ms`` (the caller reads the
clock, this module never does).

Bounded memory, failing closed: at most ``max_keys`` windows (least recently used evicted). An evicted window
leaves a tombstone with its ``top`` only; a later message for that key resumes from the tombstone with every
number up to ``top`` treated as seen (so old boots and old streams cannot be replayed after eviction).
Tombstones expire once every message the window accepted is stale anyway (``2 * skew_ms`` after eviction);
if more than ``max_tombstones`` are live, the oldest is dropped and from then on a key never seen before is
only accepted with a timestamp newer than anything the dropped key could have accepted
(``closed_until_ms``). Honest peers see at worst a short delay under that pressure; replays never get
through.

Error handling: :meth:`ReplayGuard.accept` raises :class:`RemoteProtocolError` with reason
``stale_timestamp``, ``future_timestamp``, ``replayed``, ``sequence_too_old`` or ``evicted_key``; nothing is
recorded when it raises.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from protocol.errors import LocalProtocolError, RemoteProtocolError

ReplayKey = tuple[str, int, int]
"""(sender peer id, sender boot id, stream id)."""

DEFAULT_WINDOW = 1024
DEFAULT_SKEW_MS = 30_000


@dataclass
class _Window:
    top: int
    bitmap: int
    """bit i set: sequence number ``top - i`` was accepted (bit 0 is ``top`` itself)."""


class ReplayGuard:
    """Per-key sliding windows with bounded memory. Not thread-safe; one per receiving context."""

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW,
        skew_ms: int = DEFAULT_SKEW_MS,
        max_keys: int = 4096,
        max_tombstones: int = 65_536,
    ) -> None:
        if window < 1 or skew_ms < 0 or max_keys < 1 or max_tombstones < 0:
            raise LocalProtocolError(
                "bad_replay_config", "window and max_keys must be >= 1, skew_ms and max_tombstones >= 0"
            )
        self.window = window
        self.skew_ms = skew_ms
        self.max_keys = max_keys
        self.max_tombstones = max_tombstones
        self._mask = (1 << window) - 1
        self._windows: OrderedDict[ReplayKey, _Window] = OrderedDict()
        self._tombstones: OrderedDict[ReplayKey, tuple[int, int]] = OrderedDict()  # key -> (top, evicted_at)
        self.closed_until_ms = -(2**63)
        """Timestamps at or below this are refused for keys with neither window nor tombstone."""

    def __len__(self) -> int:
        return len(self._windows)

    @property
    def tombstones(self) -> int:
        return len(self._tombstones)

    def accept(self, key: ReplayKey, seq: int, timestamp_ms: int, now_ms: int) -> None:
        """Record ``seq`` of ``key`` as seen, or raise RemoteProtocolError (and record nothing)."""
        if timestamp_ms < now_ms - self.skew_ms:
            raise RemoteProtocolError(
                "stale_timestamp",
                f"timestamp {timestamp_ms} is more than {self.skew_ms} ms before now {now_ms}",
            )
        if timestamp_ms > now_ms + self.skew_ms:
            raise RemoteProtocolError(
                "future_timestamp",
                f"timestamp {timestamp_ms} is more than {self.skew_ms} ms after now {now_ms}; check clocks (NTP)",
            )
        self._expire_tombstones(now_ms)
        win = self._windows.get(key)
        if win is None:
            tomb = self._tombstones.get(key)
            if tomb is not None:
                # Resume failing closed: everything up to the evicted top counts as seen.
                win = _Window(top=tomb[0], bitmap=self._mask)
            elif timestamp_ms <= self.closed_until_ms:
                raise RemoteProtocolError(
                    "evicted_key",
                    "replay state for this stream may have been evicted under memory pressure; "
                    "retry with a newer timestamp",
                )
            else:
                win = _Window(top=seq, bitmap=0)  # the first number seen is accepted below
            self._check(win, seq)
            self._tombstones.pop(key, None)
            self._windows[key] = win
            self._evict(now_ms)
        else:
            self._check(win, seq)
            self._windows.move_to_end(key)
        self._record(win, seq)

    def _check(self, win: _Window, seq: int) -> None:
        if seq > win.top:
            return
        offset = win.top - seq
        if offset >= self.window:
            raise RemoteProtocolError(
                "sequence_too_old",
                f"sequence {seq} is {offset} behind the newest {win.top} (window {self.window})",
            )
        if (win.bitmap >> offset) & 1:
            raise RemoteProtocolError("replayed", f"sequence {seq} was already accepted")

    def _record(self, win: _Window, seq: int) -> None:
        if seq > win.top:
            shift = seq - win.top
            win.bitmap = ((win.bitmap << shift) | 1) & self._mask if shift < self.window else 1
            win.top = seq
        else:
            win.bitmap |= 1 << (win.top - seq)

    def _evict(self, now_ms: int) -> None:
        while len(self._windows) > self.max_keys:
            old_key, old = self._windows.popitem(last=False)
            self._tombstones[old_key] = (old.top, now_ms)
            self._tombstones.move_to_end(old_key)
        while len(self._tombstones) > self.max_tombstones:
            _, (_, evicted_at) = self._tombstones.popitem(last=False)
            # Anything the dropped key accepted had timestamp <= evicted_at + skew.
            self.closed_until_ms = max(self.closed_until_ms, evicted_at + self.skew_ms)

    def _expire_tombstones(self, now_ms: int) -> None:
        limit = 2 * self.skew_ms
        while self._tombstones:
            key, (_, evicted_at) = next(iter(self._tombstones.items()))
            if now_ms - evicted_at <= limit:
                break
            del self._tombstones[key]
