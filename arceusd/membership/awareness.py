"""Lifeguard local health awareness (LHM): a small saturating score that slows us down when we are the sick
one.

Owns :class:`Awareness`. The score rises when our probes fail without the nacks that healthy intermediaries
would have sent, and when we must refute a suspicion about ourselves; it falls on every successful probe.
Probe interval and probe timeout are multiplied by ``score + 1`` so that a member starved of CPU or network
stops accusing healthy peers (memberlist ``awareness.go``).
"""

from __future__ import annotations


class Awareness:
    """Score in ``[0, max_multiplier - 1]``; ``scale(t) = t * (score + 1)``."""

    __slots__ = ("_max", "_score")

    def __init__(self, max_multiplier: int) -> None:
        if max_multiplier < 1:
            raise ValueError("max_multiplier must be >= 1")
        self._max = max_multiplier
        self._score = 0

    @property
    def score(self) -> int:
        return self._score

    def apply_delta(self, delta: int) -> None:
        self._score = min(self._max - 1, max(0, self._score + delta))

    def scale(self, timeout: float) -> float:
        return timeout * (self._score + 1)
