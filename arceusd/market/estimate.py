"""The quote of a job on this device's daemon, before it is announced: ``arceusd submit --quote`` and
``arceus.quote`` both ask :func:`estimate` (torch-free; one control call for the market's demand).

Owns: which devices the quote assumes (this device's measured profile when cached in the state directory, else a
typical laptop; as many as ``--members``, ``[needs] min_members`` and ``memory_total_mib`` ask), the demand the
daemon's market sees now (neutral when no daemon answers), and the :class:`Estimate` that bundles them with the
:class:`arceusd.market.quote.Quote`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from arceusd.control import ControlError, call
from arceusd.jobs.spec_types import JobSpec
from arceusd.market.admission import devices_for_memory
from arceusd.market.pricing import CLOUD_PRICES_AS_OF, CLOUD_PRICES_SOURCE, NEUTRAL, TYPICAL_LAPTOP_FLOPS, Demand
from arceusd.market.quote import Quote, job_flops, quote, quote_lines
from arceusd.paths import StatePaths
from arceusd.profile import CACHE_FILE


@dataclass(frozen=True)
class DeviceGuess:
    """The device a quote assumes each member is like."""

    flops_per_s: float
    efficiency: float
    memory_bytes: int
    """Free memory it lends (0: unknown)."""
    source: str
    """Where the figures come from, for people."""


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

    def lines(self) -> list[str]:
        """The estimate for people, as ``arceusd submit --quote`` prints it."""
        d = self.demand
        out = [f"quote for {self.name} (not announced): {self.devices} device(s) like {self.device.source}; demand "
               f"{d.jobs_wanting} job(s) wanting, {d.idle_devices} idle device(s)"]  # fmt: skip
        if self.memory_total_mib and self.lends_mib:
            out.append(f"  memory    needs.memory_total_mib {self.memory_total_mib} MiB: {self.for_memory} device(s) "
                       f"of {self.lends_mib} MiB hold it")  # fmt: skip
        out += [f"  {line}" for line in quote_lines(self.quote)]
        out.append(f"  cloud prices: on-demand list prices as of {CLOUD_PRICES_AS_OF} ({CLOUD_PRICES_SOURCE})")
        return out


def device_guess(state_dir: Path) -> DeviceGuess:
    """This device's measured profile when cached in ``state_dir``, else the typical laptop's."""
    try:
        data = json.loads((state_dir / CACHE_FILE).read_text())
        best = max(data["devices"], key=lambda d: float(d["flops_per_s"]))
        return DeviceGuess(float(best["flops_per_s"]), float(best.get("block_efficiency", 1.0)),
                           int(best.get("memory_bytes", 0)), "this device's measured profile")  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return DeviceGuess(TYPICAL_LAPTOP_FLOPS, 1.0, 0,
                           "a typical laptop (this device is not measured yet: start the daemon)")  # fmt: skip


def market_demand(state_dir: Path) -> Demand:
    """The demand the daemon's market sees with this job added; neutral when no daemon answers."""
    try:
        listing = call(StatePaths(state_dir).control_socket, "market", timeout=5.0)
        return Demand(int(listing["demand"]["jobs_wanting"]) + 1, int(listing["demand"]["idle_devices"]))
    except (ControlError, KeyError, TypeError, ValueError):
        return NEUTRAL


def estimate(state_dir: Path, spec: JobSpec, members: int) -> Estimate:
    """The quote for ``spec`` on ``members`` devices like this one (more when ``needs.min_members`` or
    ``needs.memory_total_mib`` take more of them), at the demand the daemon sees."""
    device = device_guess(state_dir)
    needs = spec.needs
    lends_mib = device.memory_bytes >> 20 or needs.memory_per_device_mib
    for_memory = devices_for_memory(needs.memory_total_mib, lends_mib) if lends_mib else 1
    n = max(members, needs.min_members, for_memory)
    demand = market_demand(state_dir)
    q = quote(job_flops(spec), n, device.flops_per_s, device.efficiency, demand, needs.budget_usd,
              needs.deadline_hours, needs.max_price_per_hour)  # fmt: skip
    return Estimate(spec.name, q, n, device, demand, needs.memory_total_mib, for_memory, lends_mib)


__all__ = ["DeviceGuess", "Estimate", "device_guess", "estimate", "market_demand"]
