"""How fast a job trains, from its step counter alone: the one owner of steps/s, samples/s, tokens/s and the time
left that ``status``, ``--watch``, the dashboard and the Python API show. Pure.

Each figure is the same rate over the same window (:data:`WINDOW_S` of step events), so they agree with each
other and with the step counter: tokens/s = steps/s x batch x context. Before, the daemon measured samples/s
over one-second windows while ``--watch`` timed its own polls of the step counter, and the two disagreed by 2x
(issue 31). A step counter that goes back (a resume from an earlier checkpoint) starts the window again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 30.0
MAX_SAMPLES = 1024


@dataclass(frozen=True)
class Speed:
    """The rates one :class:`Throughput` gives (None: not measured yet)."""

    steps_per_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    """Seconds to the last step at this rate."""


@dataclass
class Throughput:
    """(time, step) samples over a sliding window."""

    window_s: float = WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def add(self, now: float, step: int) -> None:
        q = self.samples
        if q and step < q[-1][1]:  # resumed from an earlier checkpoint: the old rate no longer applies
            q.clear()
        q.append((now, step))
        while len(q) > 2 and now - q[0][0] > self.window_s:
            q.popleft()

    def steps_per_s(self) -> float | None:
        q = self.samples
        if len(q) < 2 or q[-1][0] <= q[0][0] or q[-1][1] <= q[0][1]:
            return None
        return (q[-1][1] - q[0][1]) / (q[-1][0] - q[0][0])

    def speed(self, step: int, total_steps: int, batch_size: int, context: int | None) -> Speed:
        """The rates for a job of ``batch_size`` samples of ``context`` tokens per step (None: not a token model)."""
        per_s = self.steps_per_s()
        if per_s is None:
            return Speed()
        samples = per_s * batch_size
        eta = max(0.0, (total_steps - step) / per_s) if total_steps > 0 else None
        return Speed(per_s, samples, samples * context if context else None, eta)


__all__ = ["MAX_SAMPLES", "WINDOW_S", "Speed", "Throughput"]
