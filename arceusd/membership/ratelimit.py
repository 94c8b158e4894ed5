"""Per-key token buckets with a bounded number of keys (pure: the caller passes the clock).

Owns :class:`RateLimiter`: ``allow(key, now)`` spends one token of ``key``'s bucket (``rate`` tokens a second,
at most ``burst`` saved) and says whether the message may be handled. The peer service keys it by the
authenticated sender of each membership message and drops (and counts) the excess. Buckets are kept for at most
``max_keys`` keys, least recently used evicted first; an evicted key starts again with a full bucket, which is
no more than a new key gets, so eviction cannot be used to gain tokens beyond one burst per eviction.
"""

from __future__ import annotations

from collections import OrderedDict


class RateLimiter:
    __slots__ = ("_buckets", "burst", "max_keys", "rate")

    def __init__(self, rate: float, burst: float, max_keys: int = 1024) -> None:
        if rate <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate must be > 0, burst >= 1 and max_keys >= 1")
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, key: str, now: float) -> bool:
        tokens, last = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - last) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return allowed

    def __len__(self) -> int:
        return len(self._buckets)
