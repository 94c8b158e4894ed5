"""Lifeguard suspicion: a timeout that starts at ``max`` and shrinks toward ``min`` with independent
confirmations.

Owns :class:`Suspicion` (one per suspected member) and :func:`suspicion_timeout`. The formula is memberlist's
``remainingSuspicionTime``: ``timeout = max - (max - min) * log(c + 1) / log(k + 1)``, floored at ``min`` (and
truncated to whole milliseconds), where ``c`` is the number of confirmations from members other than the first
accuser and ``k`` the number expected. No timers: the owner asks :attr:`Suspicion.deadline`.
"""

from __future__ import annotations

import math

from arceusd.membership.events import PeerId


def suspicion_timeout(confirmations: int, expected: int, min_timeout: float, max_timeout: float) -> float:
    if expected < 1:
        return min_timeout
    frac = math.log(confirmations + 1.0) / math.log(expected + 1.0)
    raw = max_timeout - frac * (max_timeout - min_timeout)
    return max(min_timeout, math.floor(1000.0 * raw) / 1000.0)


class Suspicion:
    """A suspicion of one member at one incarnation, started at ``start`` by ``accuser``."""

    __slots__ = ("_confirmers", "expected", "incarnation", "max_timeout", "min_timeout", "start")

    def __init__(
        self,
        accuser: PeerId,
        incarnation: int,
        expected: int,
        min_timeout: float,
        max_timeout: float,
        start: float,
    ) -> None:
        self.incarnation = incarnation
        self.expected = expected
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout
        self.start = start
        self._confirmers: set[PeerId] = {accuser}

    @property
    def confirmations(self) -> int:
        return len(self._confirmers) - 1

    def confirm(self, accuser: PeerId) -> bool:
        """Record an independent confirmation; True if it was new and counted (it then shortens the
        deadline)."""
        if self.confirmations >= self.expected or accuser in self._confirmers:
            return False
        self._confirmers.add(accuser)
        return True

    @property
    def deadline(self) -> float:
        return self.start + suspicion_timeout(self.confirmations, self.expected, self.min_timeout, self.max_timeout)
