"""The retransmit-limited broadcast queue for piggybacked gossip (memberlist ``TransmitLimitedQueue``).

Owns :class:`BroadcastQueue`. One pending update per member: a newer update about a member replaces the queued
one. :meth:`take` returns the least-transmitted (then newest) updates that fit a byte budget and counts a
transmission for each; an update is dropped after ``limit`` transmissions, where the caller passes
``retransmit_mult * ceil(log10(n + 1))``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from arceusd.membership.events import PeerId, Update


@dataclass(slots=True)
class _Item:
    update: Update
    transmits: int
    order: int


class BroadcastQueue:
    __slots__ = ("_counter", "_items")

    def __init__(self) -> None:
        self._items: dict[PeerId, _Item] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, update: Update) -> None:
        """Queue ``update``, replacing any queued update about the same member."""
        self._counter += 1
        self._items[update.peer] = _Item(update, 0, self._counter)

    def pending(self) -> list[Update]:
        return [item.update for item in self._items.values()]

    def take(self, budget: int, limit: int, size: Callable[[Update], int]) -> tuple[Update, ...]:
        """Updates fitting ``budget`` bytes, fewest transmissions first; drops those reaching ``limit``."""
        if not self._items:
            return ()
        chosen: list[Update] = []
        used = 0
        for item in sorted(self._items.values(), key=lambda it: (it.transmits, -it.order)):
            cost = size(item.update)
            if used + cost > budget:
                continue
            used += cost
            chosen.append(item.update)
            item.transmits += 1
            if item.transmits >= limit:
                del self._items[item.update.peer]
        return tuple(chosen)
