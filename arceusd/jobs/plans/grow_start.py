"""What a spare's ``JobStart.grow`` says when it takes a dropped replica's place (issue 22): the leader's
:mod:`arceusd.jobs.leader.regrow` writes it, the member's :mod:`arceusd.jobs.member.local_worker` reads it (checked
and bounded: it comes from the network). Pure: json only."""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_SLOTS = 1024


@dataclass(frozen=True)
class GrowStart:
    """What a spare's ``JobStart.grow`` says: the ``slot`` it takes, the ``slots`` of every replica of the grown
    plan (increasing), the ``shares`` of each batch, and the ring ``generation`` it starts in."""

    slot: int
    slots: tuple[int, ...]
    shares: int
    generation: int

    @property
    def position(self) -> int:
        return self.slots.index(self.slot)

    def to_wire(self) -> bytes:
        return json.dumps(
            {"slot": self.slot, "slots": list(self.slots), "shares": self.shares, "generation": self.generation},
            separators=(",", ":"),
        ).encode()

    @staticmethod
    def from_wire(data: bytes) -> GrowStart | None:
        """``None`` for a plan's start (empty); ``ValueError`` for anything malformed or out of bounds."""
        if not data:
            return None
        try:
            d = json.loads(data)
            slot, slots, shares, generation = d["slot"], tuple(d["slots"]), d["shares"], d["generation"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed grow description: {exc}") from None
        if not all(type(v) is int for v in (slot, shares, generation, *slots)):
            raise ValueError("a grow description holds integers only")
        if not 2 <= len(slots) <= shares <= MAX_SLOTS or list(slots) != sorted(set(slots)) or slots[0] < 0:
            raise ValueError(f"grow slots {list(slots)[:8]} of {shares} shares: 2 or more increasing slots below it")
        if slot not in slots or slots[-1] >= shares or not 1 <= generation <= MAX_SLOTS:
            raise ValueError(f"grow slot {slot} or generation {generation} out of range")
        return GrowStart(slot, slots, shares, generation)
