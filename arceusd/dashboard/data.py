"""What the dashboard shows, and where it comes from: a snapshot provider and the pure views built on it.

The pages never reach into the daemon's objects. They read a :class:`Snapshots` provider, whose answers are the
JSON the control methods give the CLI (``status --json``, ``status JOB --json``, ``market``, ``earnings``):
:class:`NodeSnapshots` calls those handlers in-process, and a bench or test may hand the app any other provider
(a synthetic job with 10,000 steps of history, say) without the daemon growing a test-only path.

The views are plain functions: :func:`downsample` bounds a loss history for drawing (every point when there are
few, the first, last, lowest and highest of each bucket when there are many), and :class:`Timeline` keeps what
the job JSON shows only as a current value (the validation loss) as points over time, bounded, for as long as the
dashboard watches the job. Committed checkpoints and recoveries are in the job's own record (``checkpoints`` and
``recoveries`` of ``status JOB --json``), so a page opened late still draws every one of them; so are the times
of the steps (``history_at``), which give the loss chart its wall-clock axis and :func:`loss_csv` its rows.

Figures reach the pages written (:func:`market_view`, :func:`earnings_view`: prices and counts by the CLI's own
helpers in ``arceusd.jobs.record.view``); the device page's terms and whether each holds come from
``arceusd.market.policy.policy_terms``, and its form is checked by :func:`term_form` before the policy's own checks
(``set_term``). :class:`MachineSamples` keeps the device's CPU and memory readings in a bounded ring, filled by
:func:`keep_reading` while the dashboard serves.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs

import trio

from arceusd.base.control import RequestError
from arceusd.device.profile import parse_meminfo_available
from arceusd.device.summary import device_summary
from arceusd.jobs.record.view import count, standby_note, usd, usd_per_hour
from arceusd.market.ledger import LEDGER_FILE, earnings, verify_file
from arceusd.market.policy import lend_reasons, policy_terms
from arceusd.market.policy_file import change_policy
from arceusd.market.probes import parse_proc_stat

log = logging.getLogger(__name__)

PRICES_EVERY_S = 5.0
"""How often the device page's floor price is set against what the announced jobs pay (the market's listing)."""
PRICES_WATCHED_S = 60.0
"""The prices are read only while a device page asked within this (a listing may first measure the device)."""
MACHINE_SAMPLES = 900
"""CPU and memory readings kept for the device page's chart (30 minutes at :data:`MACHINE_EVERY_S`)."""
MACHINE_EVERY_S = 2.0
EDITABLE_TERMS = (
    "lend",
    "idle_minutes",
    "require_ac",
    "min_battery_percent",
    "max_owner_cpu_percent",
    "hours",
    "max_cores",
    "max_memory_mib",
    "gpu",
    "min_price_per_hour",
    "owners",
    "max_model_params",
    "unpaid_checkpoints",
    "receipt_grace_s",
)
"""The terms the device page may change: every key of ``[policy]`` but ``probe_root`` (a test's fake machine)."""
MAX_TERM_VALUE = 400
"""The longest value the device page's form may send (``owners`` holds a few 32-character peer ids)."""
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
        """The device owner's view: the lending terms and whether each holds, what this device earned, and its
        CPU and memory over time."""
        ...

    async def set_term(self, key: str, value: str) -> None:
        """Change one term of the lending policy as ``arceusd policy --set key=value`` does (the same code:
        :func:`arceusd.market.policy_file.change_policy`); :class:`~arceusd.market.policy.PolicyError` says why
        not, and nothing changed."""
        ...


class NodeSnapshots:
    """The daemon's own answers, taken in-process (the control methods' handlers, ``Node.status``)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self._earnings: tuple[tuple[float, int], dict[str, Any] | None] = ((0.0, -1), None)
        self.samples = MachineSamples()
        self.prices: list[float] | None = None  # what the announced jobs pay this device (the latest listing)
        self.owner_seen = -math.inf  # when the device page last asked (monotonic): prices are read while it does

    async def status(self) -> dict[str, Any]:
        # its "device": this machine's line as its peers see it (the GPU once measured)
        status: dict[str, Any] = self.node.status()
        if "device" not in status:  # (no peer network running)
            status["device"] = device_summary(self.node.paths.root, self.node.config.devices)
        return status

    async def job(self, job_id: str) -> dict[str, Any] | None:
        handler = self.node.methods.get("job")
        if handler is None:
            return None
        try:
            result: dict[str, Any] = await handler({"job_id": job_id, "history": "all"})  # downsampled below
        except RequestError:
            return None
        return result

    async def market(self) -> dict[str, Any] | None:
        handler = self.node.methods.get("market")
        if handler is None:
            return None
        try:
            result: dict[str, Any] = await handler({})
        except RequestError:
            return None
        self.prices = [float(r["price_per_hour"]) for r in result.get("jobs", []) if _finite(r.get("price_per_hour"))]
        return result

    async def owner(self) -> dict[str, Any]:
        self.owner_seen = time.monotonic()
        out: dict[str, Any] = {
            "peer_id": self.node.identity.peer_id,
            "policy": None,
            "earnings": earnings_view(await self._read()),
            "machine_samples": self.samples.rows(),
        }
        market = getattr(self.node, "market", None)
        if market is not None:
            reasons = lend_reasons(market.policy, market.snapshot)
            terms = policy_terms(market.policy, market.snapshot, int(self.node.config.worker_threads), self.prices)
            out["policy"] = {
                "policy": _plain(asdict(market.policy)),
                "terms": [asdict(t) for t in terms],
                "editable": list(EDITABLE_TERMS),
                "lends_now": not reasons,
                "reasons": [str(r) for r in reasons],
            }
        return out

    async def set_term(self, key: str, value: str) -> None:
        await trio.to_thread.run_sync(change_policy, self.node.paths.config, [f"{key}={value}"], "the dashboard")
        market = getattr(self.node, "market", None)
        if market is not None:
            market.reload()  # the page shows the new term at once (the market reloads it every tick anyway)

    def sample(self, now: float) -> None:
        """One reading of this machine's CPU and memory into the ring (the owner's CPU from the market's probe)."""
        market = getattr(self.node, "market", None)
        owner_cpu = getattr(getattr(market, "snapshot", None), "owner_cpu_percent", None)
        self.samples.add(now, _proc("stat"), _proc("meminfo"), owner_cpu)

    async def _read(self) -> dict[str, Any] | None:
        """This device's earnings from its ledger (verified in a thread, cached while the file is unchanged)."""
        path = self.node.config.state_dir / LEDGER_FILE
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (st.st_mtime, st.st_size)
        if self._earnings[0] != key:
            verified = await trio.to_thread.run_sync(verify_file, path)
            value = (
                earnings(verified.entries, self.node.identity.peer_id)
                if verified.ok
                else {"error": f"the ledger does not verify: {verified.error}"}
            )
            self._earnings = (key, value)
        return self._earnings[1]


def _proc(name: str) -> str | None:
    """``/proc/<name>`` (None where there is no procfs: the chart then says it is not measured)."""
    try:
        with open(f"/proc/{name}") as fh:
            return fh.read()
    except OSError:
        return None


async def keep_reading(snapshots: NodeSnapshots, every: float = MACHINE_EVERY_S) -> None:
    """For as long as the dashboard serves: the machine into ``snapshots``' ring every ``every`` seconds, and,
    while a device page is open, the market's prices every :data:`PRICES_EVERY_S` (never cancelled half way: the
    first listing waits on measuring the device, which a cancel would start over)."""

    async def machine() -> None:
        while True:
            try:
                snapshots.sample(time.time())
            except Exception:  # a reading must never take the dashboard down
                log.exception("machine sample failed")
            await trio.sleep(every)

    async def prices() -> None:
        while True:
            if time.monotonic() - snapshots.owner_seen < PRICES_WATCHED_S:  # no listing nobody reads
                try:
                    await snapshots.market()
                except Exception:
                    log.exception("reading the market's prices failed")
            await trio.sleep(PRICES_EVERY_S)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(machine)
        nursery.start_soon(prices)


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
        chunk = rows[int(b * size) : int((b + 1) * size)]
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


def step_times(job: dict[str, Any]) -> dict[int, float]:
    """Each loss point's step -> the wall-clock time the daemon saw it (``history`` beside ``history_at``)."""
    history, at = job.get("history"), job.get("history_at")
    if not isinstance(history, list) or not isinstance(at, list) or len(at) != len(history):
        return {}
    return {
        int(p[0]): float(t)
        for p, t in zip(history, at, strict=True)
        if isinstance(p, list | tuple) and len(p) >= 2 and _finite(p[0]) and _finite(t)
    }


def job_view(job: dict[str, Any], timeline: Timeline, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The job page's data: the job JSON with its history bounded for drawing (each point's wall-clock time in
    ``history_at``, None where unknown), the validation points, the job record's committed checkpoints
    (``{"step", "at"}``, those whose step is an integer) and what is written beside the standby
    (:func:`standby_note`)."""
    history = job.get("history") or []
    times = step_times(job)
    out = dict(job)
    out["standby_note"] = standby_note(job)
    out["history"] = downsample(history, max_points)
    out["history_at"] = [times.get(int(p[0])) for p in out["history"]]
    out["history_points"] = len(history)
    out["val_history"] = [list(p) for p in timeline.val]
    checkpoints = job.get("checkpoints")
    out["checkpoints"] = [
        {"step": c["step"], "at": c.get("at") if _finite(c.get("at")) else None}
        for c in (checkpoints if isinstance(checkpoints, list) else [])
        if isinstance(c, dict) and isinstance(c.get("step"), int) and not isinstance(c.get("step"), bool)
    ]
    return out


def _utc(at: float) -> str:
    """A wall-clock time as ISO 8601 UTC with milliseconds (``2025-01-02T03:04:05.678Z``)."""
    seconds, ms = divmod(round(at * 1000), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def loss_csv(job: dict[str, Any], timeline: Timeline) -> str:
    """The job's whole loss history as CSV: ``step,time,loss,val`` (time: when the daemon saw the step, ISO 8601
    UTC, empty when unknown; val: the validation loss the dashboard saw at that step, else empty)."""
    times = step_times(job)
    val = dict(timeline.val)
    lines = ["step,time,loss,val"]
    for p in job.get("history") or []:
        if not (isinstance(p, list | tuple) and len(p) >= 2 and _finite(p[0]) and _finite(p[1])):
            continue
        step = int(p[0])
        at = times.get(step)
        v = val.get(step)
        lines.append(f"{step},{_utc(at) if at is not None else ''},{float(p[1])!r},{'' if v is None else repr(v)}")
    return "\n".join(lines) + "\n"


def earnings_view(e: dict[str, Any] | None) -> dict[str, Any] | None:
    """This device's earnings with every figure written as ``arceusd earnings`` writes it (``$0.0020``)."""
    if not isinstance(e, dict) or e.get("error"):
        return e
    hours = e.get("device_hours")
    return {
        **e,
        "total_shown": usd(e.get("total_usd")),
        "receipts_shown": count(e.get("receipts")),
        "device_hours_shown": f"{hours:.3f}" if _finite(hours) else "-",
        "by_job_shown": [[str(j), usd(u)] for j, u in (e.get("by_job") or {}).items()],
        "by_day_shown": [[str(d), usd(u)] for d, u in (e.get("by_day") or {}).items()],
    }


def market_view(market: dict[str, Any] | None) -> dict[str, Any] | None:
    """The market listing with prices and counts written as ``arceusd market`` writes them: each job's
    ``price_shown`` (``$0.0020/h``), ``max_price_shown`` (``any`` without a cap), ``members_shown`` (``2 / 4``),
    and the demand's counts as whole numbers."""
    if not isinstance(market, dict):
        return market
    rows = []
    for j in market.get("jobs") or []:
        members = count(j.get("members")) + (f" / {count(j['max_members'])}" if j.get("max_members") else "")
        rows.append(
            {
                **j,
                "price_shown": usd_per_hour(j.get("price_per_hour")),
                "members_shown": members,
                "max_price_shown": usd_per_hour(j["max_price_per_hour"]) if j.get("max_price_per_hour") else "any",
            }
        )
    demand = market.get("demand") or {}
    return {**market, "jobs": rows, "demand_shown": {k: count(v) if _finite(v) else str(v) for k, v in demand.items()}}


def term_form(body: bytes) -> tuple[str, str]:
    """The key and value of the device page's form (``key=...&value=...``, URL-encoded), checked before the
    policy's own checks: a known term's key, one of each, a value of at most :data:`MAX_TERM_VALUE` printable
    characters. ``ValueError`` says in one line what was wrong and what to send."""
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True, max_num_fields=4)
    except (UnicodeDecodeError, ValueError):
        raise ValueError("the form must be key=TERM&value=VALUE, URL-encoded UTF-8") from None
    keys, values = fields.get("key", []), fields.get("value", [])
    if len(keys) != 1 or len(values) != 1 or set(fields) != {"key", "value"}:
        raise ValueError("the form must hold one key and one value (key=TERM&value=VALUE)")
    key, value = keys[0], values[0].strip()
    if key not in EDITABLE_TERMS:
        raise ValueError(f"{key[:40]!r} is not a term the page may change; one of: {', '.join(EDITABLE_TERMS)}")
    if not value or len(value) > MAX_TERM_VALUE or not value.isprintable():
        raise ValueError(
            f"policy.{key}: give a value of 1 to {MAX_TERM_VALUE} printable characters (for example 10, true, [22, 7])"
        )
    return key, value


@dataclass(frozen=True)
class MachineSample:
    """One reading of the machine: all CPU use, the owner's own (the market's probe: everything but Arceus),
    memory in use, in percent (None: not measured)."""

    at: float
    cpu_percent: float | None
    owner_cpu_percent: float | None
    memory_percent: float | None


def cpu_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Busy share of the CPU between two ``/proc/stat`` readings ((busy, total) ticks), in percent."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return max(0.0, min(100.0, 100.0 * (after[0] - before[0]) / (after[1] - before[1])))


def memory_percent(meminfo: str | None) -> float | None:
    """Memory in use (``MemTotal`` less ``MemAvailable`` of ``/proc/meminfo``), in percent."""
    if meminfo is None:
        return None
    available = parse_meminfo_available(meminfo)
    total = next(
        (
            int(line.split()[1]) * 1024
            for line in meminfo.splitlines()
            if line.startswith("MemTotal:") and len(line.split()) >= 2 and line.split()[1].isdigit()
        ),
        None,
    )
    if available is None or not total:
        return None
    return max(0.0, min(100.0, 100.0 * (total - available) / total))


class MachineSamples:
    """The device page's CPU and memory chart: the latest :data:`MACHINE_SAMPLES` readings (a ring)."""

    def __init__(self, limit: int = MACHINE_SAMPLES) -> None:
        self.ring: deque[MachineSample] = deque(maxlen=limit)
        self._ticks: tuple[int, int] | None = None

    def add(self, at: float, proc_stat: str | None, meminfo: str | None, owner_cpu: float | None) -> None:
        """A reading from ``/proc/stat`` and ``/proc/meminfo`` texts (the CPU use is since the previous one)."""
        ticks = parse_proc_stat(proc_stat) if proc_stat is not None else None
        cpu, self._ticks = cpu_percent(self._ticks, ticks), ticks
        owner = float(owner_cpu) if owner_cpu is not None and _finite(owner_cpu) else None
        self.ring.append(MachineSample(at, cpu, owner, memory_percent(meminfo)))

    def rows(self) -> list[list[float | None]]:
        """``[at, cpu %, owner's cpu %, memory %]`` per reading, oldest first (one decimal)."""

        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return [[round(x.at, 3), r(x.cpu_percent), r(x.owner_cpu_percent), r(x.memory_percent)] for x in self.ring]


__all__ = [
    "EDITABLE_TERMS",
    "MAX_POINTS",
    "MAX_TERM_VALUE",
    "MachineSample",
    "MachineSamples",
    "NodeSnapshots",
    "Snapshots",
    "Timeline",
    "Timelines",
    "cpu_percent",
    "downsample",
    "earnings_view",
    "job_view",
    "keep_reading",
    "loss_csv",
    "market_view",
    "memory_percent",
    "standby_note",
    "step_times",
    "term_form",
]
