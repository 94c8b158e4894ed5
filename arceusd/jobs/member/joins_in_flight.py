"""The joins this device has asked for and not yet settled: :class:`JoinsInFlight`.

A leader that accepts a join may plan at once and send its start; over gRPC that start can be taken before this
device's join task has read the answer and stepped the job's core to member (``events.Joined``), and a start to a
device that has not joined is refused ("this device has not joined the job"): the leader then repartitions without
it (seen in bench/quote.py under load). So the join task holds its job's entry here from asking until the answer is
fed to the core, and a start for a job whose join is in flight waits for it to settle (bounded) before it is judged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

SETTLE_WAIT_S = 10.0
"""The longest a start waits for this device's join of its job to settle (a join request times out in 10 s)."""


class JoinsInFlight:
    """Per job: an event set once this device's join of it settled (answered and fed, or failed)."""

    def __init__(self) -> None:
        self._settled: dict[str, trio.Event] = {}

    @contextmanager
    def asking(self, job_id: str) -> Iterator[None]:
        """Around a join: from the request until its answer is fed to the job's core."""
        settled = trio.Event()
        self._settled[job_id] = settled
        try:
            yield
        finally:
            settled.set()
            if self._settled.get(job_id) is settled:
                del self._settled[job_id]

    async def settled(self, job_id: str, timeout_s: float = SETTLE_WAIT_S) -> None:
        """Wait until this device's join of ``job_id`` settled, at most ``timeout_s``; at once if none is in
        flight."""
        event = self._settled.get(job_id)
        if event is not None:
            with trio.move_on_after(timeout_s):
                await event.wait()
