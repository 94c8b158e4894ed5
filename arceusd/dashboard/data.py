"""What the dashboard shows, and where it comes from: a snapshot provider and the pure views built on it.

The pages never reach into the daemon's objects. They read a :class:`Snapshots` provider, whose answers are the
JSON the control methods give the CLI (``status --json``, ``status JOB --json``, ``market``, ``earnings``):
:class:`NodeSnapshots` calls those handlers in-process, and a bench or test may hand the app any other provider
(a synthetic job with 10,000 steps of history, say) without the daemon growing a test-only path.

The views are plain functions: :func:`downsample` bounds a loss history for drawing (every point when there are
few, the first, last, lowest and highest of each bucket when there are many), and :class:`Timeline` keeps what
the job JSON shows only as a current value (the validation loss) as points over time, bounded, for as long as the
dashboard watches the job. Committed checkpoints and recoveries are in the job's own record (``checkpoints`` and
``recoveries`` of ``status JOB --json``), so a page opened late still draws every one of them.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import trio

log = logging.getLogger(__name__)

MAX_POINTS = 2000
"""Default bound on the loss points one answer carries (a 10,000-step history is drawn from at most this)."""
TIMELINE_POINTS = 2000
"""Validation points kept per job."""


class Snapshots(Protocol):
    """Where the dashboard's data comes from; every answer is JSON-like and may hold strangers' strings."""

    async def status(self) -> dict[str, Any]:
        """What ``arceusd status --json`` shows (and ``device``: this machine's hardware line)."""
        ...

    async def job(self, job_id: str) -> dict[str, Any] | None:
        """What ``arceusd status JOB --json`` shows, or None when there is no such job."""
        ...

    async def market(self) -> dict[str, Any] | None:
        """What ``arceusd market --json`` shows, or None when the market service is not running."""
        ...

    async def owner(self) -> dict[str, Any]:
        """The device owner's view: the lending policy's state and what this device earned."""
        ...


class NodeSnapshots:
    """The daemon's own answers, taken in-process (the control methods' handlers, ``Node.status``)."""

    def __init__(self, node: Any) -> None:
        from arceusd.network import device_summary

        self.node = node
        self.device = device_summary()  # this machine's hardware line, as its peers see it
        self._earnings: tuple[tuple[float, int], dict[str, Any] | None] = ((0.0, -1), None)

    async def status(self) -> dict[str, Any]:
        return {**self.node.status(), "device": self.device}

    async def job(self, job_id: str) -> dict[str, Any] | None:
        from arceusd.control import RequestError

        handler = self.node.methods.get("job")
        if handler is None:
            return None
        try:
            result: dict[str, Any] = await handler({"job_id": job_id, "history": "all"})  # downsampled below
        except RequestError:
            return None
        return result

    async def market(self) -> dict[str, Any] | None:
        from arceusd.control import RequestError

        handler = self.node.methods.get("market")
        if handler is None:
            return None
        try:
            result: dict[str, Any] = await handler({})
        except RequestError:
            return None
        return result

    async def owner(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peer_id": self.node.identity.peer_id, "policy": None, "earnings": await self._read()}
        market = getattr(self.node, "market", None)
        if market is not None:
            from arceusd.market.policy import lend_reasons

            reasons = lend_reasons(market.policy, market.snapshot)
            out["policy"] = {"policy": _plain(asdict(market.policy)), "machine": _plain(asdict(market.snapshot)),
                             "lends_now": not reasons, "reasons": [str(r) for r in reasons]}  # fmt: skip
        return out

    async def _read(self) -> dict[str, Any] | None:
        """This device's earnings from its ledger (verified in a thread, cached while the file is unchanged)."""
        from arceusd.market.ledger import LEDGER_FILE, earnings, verify_file

        path = self.node.config.state_dir / LEDGER_FILE
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (st.st_mtime, st.st_size)
        if self._earnings[0] != key:
            verified = await trio.to_thread.run_sync(verify_file, path)
            value = (earnings(verified.entries, self.node.identity.peer_id) if verified.ok
                     else {"error": f"the ledger does not verify: {verified.error}"})  # fmt: skip
            self._earnings = (key, value)
        return self._earnings[1]


def _plain(value: Any) -> Any:
    """Tuples as lists, so the answer is JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def downsample(points: Sequence[Sequence[float]], max_points: int) -> list[list[float]]:
    """``points`` ((step, value) pairs, steps rising) bounded to about ``max_points`` for drawing.

    Every point when there are no more than ``max_points``; otherwise the first and last points, and in each of
    ``max_points // 4`` buckets its first, lowest, highest and last point (in step order), so spikes survive.
    """
    rows = [[float(p[0]), float(p[1])] for p in points if len(p) >= 2 and _finite(p[1])]
    if len(rows) <= max_points:
        return rows
    buckets = max(1, max_points // 4)
    size = len(rows) / buckets
    out: list[list[float]] = []
    for b in range(buckets):
        chunk = rows[int(b * size): int((b + 1) * size)]
        if not chunk:
            continue
        lo = min(range(len(chunk)), key=lambda i: chunk[i][1])
        hi = max(range(len(chunk)), key=lambda i: chunk[i][1])
        for i in sorted({0, lo, hi, len(chunk) - 1}):
            out.append(chunk[i])
    if out[-1] is not rows[-1]:
        out.append(rows[-1])
    return out


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Timeline:
    """Validation losses as the dashboard saw them change (bounded)."""

    val: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=TIMELINE_POINTS))
    seen: float = field(default_factory=time.monotonic)

    def observe(self, job: dict[str, Any]) -> None:
        self.seen = time.monotonic()
        step, val = job.get("step"), job.get("val_loss")
        if isinstance(step, int) and isinstance(val, int | float) and _finite(val):
            self._validation(step, float(val))

    def _validation(self, step: int, val: float) -> None:
        """A new evaluation: the value changed (the job JSON holds only the latest), drawn at the step seen."""
        if not self.val or (val != self.val[-1][1] and step >= self.val[-1][0]):
            self.val.append((step, val))


class Timelines:
    """One :class:`Timeline` per job id, the least recently watched dropped beyond ``limit`` jobs."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self.jobs: dict[str, Timeline] = {}

    def observe(self, job: dict[str, Any]) -> Timeline:
        job_id = str(job.get("job_id", ""))
        line = self.jobs.get(job_id)
        if line is None:
            if len(self.jobs) >= self.limit:
                del self.jobs[min(self.jobs, key=lambda k: self.jobs[k].seen)]
            line = self.jobs[job_id] = Timeline()
        line.observe(job)
        return line


def job_view(job: dict[str, Any], timeline: Timeline, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The job page's data: the job JSON with its history bounded for drawing, the validation points, and the
    job record's committed checkpoints (``{"step", "at"}``, those whose step is an integer)."""
    history = job.get("history") or []
    out = dict(job)
    out["history"] = downsample(history, max_points)
    out["history_points"] = len(history)
    out["val_history"] = [list(p) for p in timeline.val]
    checkpoints = job.get("checkpoints")
    out["checkpoints"] = [
        {"step": c["step"], "at": c.get("at") if _finite(c.get("at")) else None}
        for c in (checkpoints if isinstance(checkpoints, list) else [])
        if isinstance(c, dict) and isinstance(c.get("step"), int) and not isinstance(c.get("step"), bool)
    ]
    return out


__all__ = ["MAX_POINTS", "NodeSnapshots", "Snapshots", "Timeline", "Timelines", "downsample", "job_view"]
