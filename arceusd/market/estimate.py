"""The quote of a job on this device's daemon, before it is announced: ``arceusd submit --quote`` and
``arceus.quote`` both ask :func:`estimate` (torch-free; one control call for the market's demand).

Owns: which devices the quote assumes (this device's measured profile when cached in the state directory, else a
typical laptop; as many as ``--members``, ``[needs] min_members`` and ``memory_total_mib`` ask, and as many as hold
the model's training state), the demand the daemon's market sees now (neutral when no daemon answers), the memory
the devices the daemon sees lend (its ``lending`` method; this device's cached profile alone when no daemon
answers) against the training state's (:mod:`arceusd.jobs.plans.memory_fit`), and the :class:`Estimate` that bundles
them with the :class:`arceusd.market.quote.Quote` (the FLOPs' lower bound) and the
:class:`arceusd.market.forecast.Forecast` (the time and bill it states: the daemon's plan over those devices, with
the start, end and step factor this daemon measured its past jobs to take, :mod:`arceusd.market.timings`; the JSON's
``assumed`` names those it has not measured yet).

The devices a forecast plans over: this device's measured offer (its cached profile, with its calibration) and,
for each further device, one lending what the peer the daemon asked lends (peers tell their memory, not
their speed: each is planned at the speed of a peer this daemon's past jobs ran with, as their plans took it:
:func:`arceusd.market.timings.peer_speeds`; beyond those, as fast as this device, and the quote says so); links at
the planner's defaults until the job measures them (``arceusd.jobs.plans.planning.DEFAULT_BANDWIDTH``). The prices are
the market's while the job runs: the demand the daemon sees with this job added, its devices no longer idle (as the
leader prices each commit: ``MarketService.demand``). The machine's load now (:func:`machine_load`) stretches the
range's top where it is busier than when the daemon's jobs ran.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from arceusd.base.control import ControlError, call, daemon_answers
from arceusd.base.paths import StatePaths
from arceusd.device.profile import CACHE_FILE
from arceusd.jobs.plans.memory_fit import (
    Lent,
    TrainingMemory,
    devices_needed,
    fits,
    summary,
    training_memory,
    what_to_do,
)
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.market.admission import devices_for_memory
from arceusd.market.forecast import Forecast, forecast
from arceusd.market.pricing import CLOUD_PRICES_AS_OF, CLOUD_PRICES_SOURCE, NEUTRAL, TYPICAL_LAPTOP_FLOPS, Demand
from arceusd.market.quote import Quote, job_flops, quote, quote_lines
from arceusd.market.timings import machine_load, peer_speeds, read_timings
from partitioner import PlanError


@dataclass(frozen=True)
class DeviceGuess:
    """The device a quote assumes each member is like."""

    flops_per_s: float
    efficiency: float
    memory_bytes: int
    """Free memory it lends (0: unknown)."""
    source: str
    """Where the figures come from, for people."""
    dispatch_s: float = 0.0
    adamw_s_per_param: float = 0.0
    sgd_s_per_param: float = 0.0
    kind: str = "cpu"


@dataclass(frozen=True)
class Estimate:
    """A job's quote and what it assumed: ``devices`` like ``device`` at ``demand``."""

    name: str
    quote: Quote
    devices: int
    device: DeviceGuess
    demand: Demand
    memory_total_mib: int
    for_memory: int
    """Devices of this one's memory that hold ``memory_total_mib`` (1 when the spec states none)."""
    lends_mib: int
    need: TrainingMemory | None = None
    """The model's training state (:func:`arceusd.jobs.plans.memory_fit.training_memory`)."""
    lent: Lent | None = None
    """What the devices the daemon sees lend (None: neither the daemon nor a measured profile says)."""
    daemon_running: bool = False
    """Whether this device's daemon answered its control socket when the estimate began."""
    forecast: Forecast | None = None
    """The time and bill of the daemon's plan over the devices assumed (None: no plan fits; ``plan_error``)."""
    plan_error: str = ""
    known_peers: int = 0
    """Of the further devices, how many are planned at a speed this daemon measured (the rest: like this one)."""

    @property
    def seconds(self) -> float:
        """The wall time stated: the forecast's, else the FLOPs' lower bound."""
        return self.forecast.seconds if self.forecast is not None else self.quote.hours * 3600.0

    @property
    def usd(self) -> float:
        """The bill stated: the forecast's, else the FLOPs' lower bound."""
        return self.forecast.usd if self.forecast is not None else self.quote.usd

    def to_json(self) -> dict[str, Any]:
        """``arceusd submit --quote --json``: the figures stated, the devices assumed, the lower bound and the cloud."""
        q, f = self.quote, self.forecast
        return {
            "name": self.name,
            "devices": self.devices,
            "device": asdict(self.device),
            "demand": asdict(self.demand),
            "seconds": self.seconds,
            "usd": self.usd,
            "low_s": f.low_s if f else None,
            "high_s": f.high_s if f else None,
            "low_usd": f.low_usd if f else None,
            "high_usd": f.high_usd if f else None,
            "forecast": asdict(f) if f else None,
            "assumed": list(f.assumed) if f else None,
            "plan_error": self.plan_error,
            "lower_bound": {
                "flops": q.flops,
                "seconds": q.hours * 3600.0,
                "usd": q.usd,
                "price_per_device_hour": q.price_per_device_hour,
            },
            "cloud": [asdict(c) for c in q.cloud],
            "problems": self.problems(),
            "memory": {"needs_mib": self.need.mib if self.need else None, "fits": self.fits},
        }

    def problems(self) -> list[str]:
        """What in ``[needs]`` the stated figures cannot meet (empty: everything)."""
        q, out = self.quote, []
        if q.budget_usd and self.usd > q.budget_usd:
            out.append(f"the budget cannot be met: about ${self.usd:.6f}, over needs.budget_usd ${q.budget_usd:.6f}")
        if q.deadline_hours and self.seconds > q.deadline_hours * 3600.0:
            out.append(
                f"the deadline cannot be met: about {self.seconds / 3600:.2f} h, past needs.deadline_hours "
                f"{q.deadline_hours:g} h"
            )
        return out

    @property
    def fits(self) -> bool:
        """Whether the devices seen lend enough for the training state (True when unknown)."""
        return self.need is None or self.lent is None or fits(self.need, self.lent)

    def lines(self) -> list[str]:
        """The estimate for people, as ``arceusd submit --quote`` prints it."""
        d = self.demand
        out = [
            f"quote for {self.name} (not announced): {self.devices} device(s) like {self.device.source}; demand "
            f"{d.jobs_wanting} job(s) wanting, {d.idle_devices} idle device(s)"
        ]
        if self.memory_total_mib and self.lends_mib:
            out.append(
                f"  memory    needs.memory_total_mib {self.memory_total_mib} MiB: {self.for_memory} device(s) "
                f"of {self.lends_mib} MiB hold it"
            )
        out += self.memory_lines()
        if self.forecast is None:
            out += [f"  {line}" for line in quote_lines(self.quote)]
            out.append(f"  (no plan fits these devices, so only the lower bound: {self.plan_error})")
        else:
            q = self.quote
            out.append(f"  work      {q.flops:.3g} FLOPs")
            out.append(f"  devices   {_devices_line(self.devices, self.device, self.known_peers)}")
            out += [f"  {line}" for line in self.forecast.lines()]
            out += [f"  warning   {p}" for p in self.problems()]
            out += [
                f"  cloud     ${c.usd:.4f} on {c.name} ({c.instance}, {c.hours * 3600:.1f} s at its fp32 peak)"
                for c in q.cloud
            ]
        out.append(f"  cloud prices: on-demand list prices as of {CLOUD_PRICES_AS_OF} ({CLOUD_PRICES_SOURCE})")
        return out

    def memory_lines(self) -> list[str]:
        """Needed against lent, and a warning when it cannot fit."""
        if self.need is None:
            return []
        if self.lent is None:
            why = (
                "the daemon did not say in time: it is still measuring this device; ask again in half a minute"
                if self.daemon_running
                else "start the daemon"
            )
            return [
                f"  memory    the model's training state needs {self.need.mib} MiB (what the devices lend is "
                f"unknown: {why})"
            ]
        out = [f"  memory    {summary(self.need, self.lent)}"]
        if not self.fits:
            out.append(
                f"  warning   it cannot be trained on the devices this daemon sees: submit would refuse it; "
                f"{what_to_do(self.need, self.lent)}"
            )
        return out


MEASURED = "this device's measured profile"


def _devices_line(n: int, d: DeviceGuess, known: int = 0) -> str:
    if n <= 1:
        others = ""
    else:
        measured = min(known, n - 1)
        assumed = n - 1 - measured
        parts = []
        if measured:
            parts.append(
                f"{measured} of the other {n - 1} at the speed this daemon's past jobs measured for their peers "
                f"(offered, less what the leader measured them to run slower)"
            )
        if assumed:
            parts.append(
                f"{'the rest' if measured else f'the other {n - 1}'} assumed as fast as this device (peers tell "
                f"what they lend, not their speed; no past job of this daemon ran with {'more' if measured else 'one'})"
            )
        others = "; " + "; ".join(parts) + "; links at the planner's defaults until measured"
    return f"{n} x {d.flops_per_s / 1e9:.1f} GFLOP/s at block efficiency {d.efficiency:.2f} ({d.source}{others})"


def offers_for(
    device: DeviceGuess, n: int, lent: Lent | None, known: Sequence[tuple[str, float, float]] = ()
) -> list[Offer]:
    """The offers a forecast plans over: this device's (``this-device``) and ``n - 1`` more (``peer-1``...), each
    lending what a peer the daemon asked lends (else what this device lends), at the speed and efficiency of a
    peer this daemon's past jobs ran with (``known``: :func:`arceusd.market.timings.peer_speeds`, newest first),
    else like this device."""
    peers = sorted(lent.peer_bytes, reverse=True) if lent is not None else []
    memory = device.memory_bytes or (8 << 30)
    out = []
    for i in range(n):
        lends = memory if i == 0 or i - 1 >= len(peers) or not peers[i - 1] else peers[i - 1]
        flops, efficiency = device.flops_per_s, device.efficiency
        if 0 < i <= len(known):
            _, flops, efficiency = known[i - 1]
        out.append(
            Offer(
                "this-device" if i == 0 else f"peer-{i}",
                "",
                flops,
                lends,
                device.kind,
                min(max(efficiency, 1e-3), 1.0),
                device.dispatch_s,
                device.adamw_s_per_param,
                device.sgd_s_per_param,
            )
        )
    return out


def unmeasured_source(daemon_running: bool) -> str:
    """What a quote says it assumed when this device is not measured yet (issue 31: it told the user to start
    the daemon while the daemon was running, and measuring)."""
    why = (
        "the daemon is measuring it now; ask again in about half a minute for its own figures"
        if daemon_running
        else "start the daemon, which measures it"
    )
    return f"a typical laptop (this device is not measured yet: {why})"


def device_guess(state_dir: Path, daemon_running: bool = False) -> DeviceGuess:
    """This device's measured profile when cached in ``state_dir``, else the typical laptop's (saying why:
    ``daemon_running``, whether this device's daemon answers, which measures it)."""
    try:
        data = json.loads((state_dir / CACHE_FILE).read_text())
        best = max(data["devices"], key=lambda d: float(d["flops_per_s"]))
        return DeviceGuess(
            float(best["flops_per_s"]),
            float(best.get("block_efficiency", 1.0)),
            int(best.get("memory_bytes", 0)),
            MEASURED,
            float(best.get("dispatch_s", 0.0)),
            float(best.get("adamw_s_per_param", 0.0)),
            float(best.get("sgd_s_per_param", 0.0)),
            str(best.get("kind", "cpu")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return DeviceGuess(TYPICAL_LAPTOP_FLOPS, 1.0, 0, unmeasured_source(daemon_running))


def market_demand(state_dir: Path) -> Demand:
    """The demand the daemon's market sees with this job added; neutral when no daemon answers."""
    try:
        listing = call(StatePaths(state_dir).control_socket, "market", timeout=5.0)
        return Demand(int(listing["demand"]["jobs_wanting"]) + 1, int(listing["demand"]["idle_devices"]))
    except (ControlError, KeyError, TypeError, ValueError):
        return NEUTRAL


def first_job(state_dir: Path, daemon_running: bool) -> bool:
    """Whether a job submitted now would be this daemon's first since it started (it pays more to start:
    :data:`arceusd.market.forecast.FIRST_JOB_S`); True without a daemon (it starts for the job)."""
    if not daemon_running:
        return True
    try:
        jobs = call(StatePaths(state_dir).control_socket, "jobs", timeout=5.0)
        return not any(isinstance(j, dict) and not j.get("restored") for j in jobs)
    except (ControlError, TypeError):
        return False


def seen_lending(state_dir: Path, device: DeviceGuess) -> Lent | None:
    """What the devices the daemon sees lend (its ``lending`` method); without a daemon, this device's measured
    profile alone (None when it has none)."""
    try:
        seen = call(StatePaths(state_dir).control_socket, "lending", timeout=30.0)
        return Lent(int(seen["own_bytes"]), tuple(int(b) for b in seen["peer_bytes"]), int(seen["unanswered"]))
    except (ControlError, KeyError, TypeError, ValueError):
        return Lent(device.memory_bytes) if device.memory_bytes else None


def estimate(state_dir: Path, spec: JobSpec, members: int) -> Estimate:
    """The quote for ``spec`` on ``members`` devices like this one (more when ``needs.min_members``,
    ``needs.memory_total_mib`` or the training state take more of them), at the demand the daemon sees."""
    daemon = daemon_answers(StatePaths(state_dir).control_socket)
    need = training_memory(spec)
    lent = seen_lending(state_dir, device_guess(state_dir, daemon))  # a daemon measures this device first
    device = device_guess(state_dir, daemon)  # (measured meanwhile, when the daemon was measuring it)
    if lent is not None and lent.own_bytes:  # what this device lends, capped by lend_memory_mib
        device = replace(device, memory_bytes=lent.own_bytes)
    needs = spec.needs
    lends_mib = device.memory_bytes >> 20 or needs.memory_per_device_mib
    for_memory = devices_for_memory(needs.memory_total_mib, lends_mib) if lends_mib else 1
    for_state = devices_needed(need, lends_mib << 20) if lends_mib else 1
    n = max(members, needs.min_members, for_memory, for_state)
    demand = market_demand(state_dir)
    q = quote(
        job_flops(spec),
        n,
        device.flops_per_s,
        device.efficiency,
        demand,
        needs.budget_usd,
        needs.deadline_hours,
        needs.max_price_per_hour,
    )
    running = Demand(demand.jobs_wanting, max(0, demand.idle_devices - n))  # its devices are busy while it runs
    timings = read_timings(state_dir)
    known = peer_speeds(timings)[: n - 1]
    try:
        fc: Forecast | None = forecast(
            spec,
            offers_for(device, n, lent, known),
            "this-device",
            running,
            first_job=first_job(state_dir, daemon),
            timings=timings,
            load_now=machine_load(),
        )
        why = ""
    except PlanError as exc:
        fc, why = None, str(exc)
    if fc is not None and n > 1:
        fc = with_peers(fc, n - 1, len(known))
    return Estimate(
        spec.name,
        q,
        n,
        device,
        demand,
        needs.memory_total_mib,
        for_memory,
        lends_mib,
        need,
        lent,
        daemon,
        fc,
        why,
        len(known),
    )


def with_peers(fc: Forecast, others: int, known: int) -> Forecast:
    """``fc`` naming where its ``others`` further devices' speeds come from: ``known`` measured, the rest assumed
    (``peers`` among its assumed terms)."""
    if known >= others:
        source = f"measured: {others} peer(s) at the speed this daemon's past jobs ran them"
        return replace(fc, sources=(*fc.sources, ("peers", source)))
    source = (
        f"assumed: {others - known} of {others} peer(s) as fast as this device (this daemon's past jobs ran with "
        f"{known} peer(s); peers tell what they lend, not their speed)"
    )
    return replace(fc, sources=(*fc.sources, ("peers", source)), assumed=(*fc.assumed, "peers"))


__all__ = [
    "DeviceGuess",
    "Estimate",
    "device_guess",
    "estimate",
    "first_job",
    "market_demand",
    "offers_for",
    "seen_lending",
    "unmeasured_source",
    "with_peers",
]
