"""The retransmit-limited broadcast queue for piggybacked gossip (memberlist ``TransmitLimitedQueue``).

Owns :class:`BroadcastQueue`. One pending update per member: a newer update about a member replaces the queued
one. :meth:`BroadcastQueue.take` returns the least-transmitted (then newest) updates that fit a byte budget
and counts a transmission for each; an update is dropped after ``limit`` transmissions, where the caller
passes ``retransmit_mult * ceil(log10(n + 1))``.

Items live in buckets by transmission count (insertion-ordered dicts, newest last), so a take costs O(updates
taken + buckets), not a sort of the whole queue: a member joining a 1,000-member cluster queues 1,000 updates.
"""

from __future__ import annotations

from collections.abc import Callable

from arceusd.membership.events import PeerId, Update

_MAX_MISSES = 8  # stop scanning after this many updates that did not fit the remaining budget


class BroadcastQueue:
    __slots__ = ("_buckets", "_where")

    def __init__(self) -> None:
        self._buckets: list[dict[PeerId, Update]] = [{}]
        self._where: dict[PeerId, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def push(self, update: Update) -> None:
        """Queue ``update``, replacing any queued update about the same member."""
        old = self._where.pop(update.peer, None)
        if old is not None:
            del self._buckets[old][update.peer]
        self._buckets[0][update.peer] = update
        self._where[update.peer] = 0

    def pending(self) -> list[Update]:
        return [u for bucket in self._buckets for u in bucket.values()]

    def take(self, budget: int, limit: int, size: Callable[[Update], int]) -> tuple[Update, ...]:
        """Updates fitting ``budget`` bytes, fewest transmissions first; drops those reaching ``limit``."""
        if not self._where:
            return ()
        chosen: list[tuple[int, Update]] = []
        used = 0
        misses = 0
        for count, bucket in enumerate(self._buckets):
            for update in reversed(bucket.values()):
                cost = size(update)
                if used + cost > budget:
                    misses += 1
                    if misses >= _MAX_MISSES:
                        break
                    continue
                used += cost
                chosen.append((count, update))
            if misses >= _MAX_MISSES:
                break
        for count, update in chosen:
            del self._buckets[count][update.peer]
            if count + 1 >= limit:
                del self._where[update.peer]
                continue
            if count + 1 >= len(self._buckets):
                self._buckets.append({})
            self._buckets[count + 1][update.peer] = update
            self._where[update.peer] = count + 1
        return tuple(u for _, u in chosen)
