"""Price per device-hour: a pure function of the device's measured FLOP/s and the demand in the swarm.

The formula (all figures below are constants of this module)::

    F      = min(flops_per_s, MAX_FLOPS)                       measured float32 matmul FLOP/s (arceusd.device.profile)
    r      = (jobs_wanting + 1) / (idle_devices + 1)           announced jobs against idle devices
    d      = clamp(sqrt(r), DEMAND_MIN, DEMAND_MAX)            demand factor: 1 when supply meets demand
    raw    = BASE_RATE_PER_HOUR * (F / TYPICAL_LAPTOP_FLOPS) * d
    cap    = CLOUD_SHARE * cheapest_cloud_usd_per_flop_hour * F
    price  = min(raw, cap)                                     dollars per device-hour

So a typical laptop (:data:`TYPICAL_LAPTOP_FLOPS`) earns :data:`BASE_RATE_PER_HOUR` ($0.30) an hour when one
job wants devices for each idle one; the price scales linearly with what the device computes (a device twice as
fast earns twice as much: the price is per FLOP, so a job pays the same for the same work wherever it runs); it
rises with the square root of the jobs-to-idle-devices ratio, at most 2x and at least 0.5x; and it never
exceeds :data:`CLOUD_SHARE` (90%) of what the cheapest GPU in :data:`CLOUD_GPUS` costs for the same FLOPs at
its peak. The price is monotone (non-decreasing) in FLOP/s and in demand, and bounded by
:func:`max_price_per_hour`.

The typical laptop: 2.6 TFLOP/s, the float32 peak Apple states for the M1's 8-core GPU (Apple M1 press
release, 10 November 2020: "2.6 teraflops of throughput"), the accelerator a laptop offers through torch's MPS
backend. A laptop lending only CPU cores measures far less (about 0.1 TFLOP/s per core here: 95-100 GFLOP/s
at one thread, commit 0eafffe) and earns correspondingly less: about $0.01/h per core at neutral demand.

The cloud table lists on-demand *list* prices (Amazon EC2 On-Demand pricing page, us-east-1, Linux, as of
2024-06; we cannot browse, so these are the published list prices known at that date, not live quotes) per
GPU (instance price / GPUs in it), with each GPU's float32 peak (non-tensor-core) from NVIDIA's datasheets.
The comparison is generous to the cloud: it assumes the GPU runs at its peak, which no training job reaches.
The table holds training GPUs (the ones sold with the memory and interconnect for training); inference parts
(T4, L4, A10G) are cheaper per float32 FLOP and are not in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BASE_RATE_PER_HOUR = 0.30
"""Dollars per device-hour for :data:`TYPICAL_LAPTOP_FLOPS` at neutral demand (the issue's seed figure)."""
TYPICAL_LAPTOP_FLOPS = 2.6e12
"""Apple M1 8-core GPU, float32 peak (Apple, 10 November 2020); see the module docstring."""
MAX_FLOPS = 1.0e15
"""Measured FLOP/s above this are taken as this (no single device measures 1 PFLOP/s in float32)."""
DEMAND_MIN = 0.5
DEMAND_MAX = 2.0
CLOUD_SHARE = 0.9
"""The price per FLOP is at most this share of the cheapest cloud GPU's price per FLOP at peak."""
CLOUD_PRICES_AS_OF = "2024-06"
CLOUD_PRICES_SOURCE = "Amazon EC2 On-Demand pricing, us-east-1, Linux (list prices); NVIDIA datasheets (FP32 peak)"


@dataclass(frozen=True)
class CloudGpu:
    """One cloud GPU: the on-demand list price of one GPU-hour and its float32 peak FLOP/s."""

    name: str
    instance: str
    usd_per_hour: float
    fp32_flops: float

    @property
    def usd_per_flop_hour(self) -> float:
        """Dollars for one FLOP/s sustained for an hour (the unit the cap compares in)."""
        return self.usd_per_hour / self.fp32_flops

    def cost_for(self, flops: float) -> tuple[float, float]:
        """(hours, dollars) to compute ``flops`` at this GPU's peak."""
        hours = flops / self.fp32_flops / 3600.0
        return hours, hours * self.usd_per_hour


CLOUD_GPUS: tuple[CloudGpu, ...] = (
    # p5.48xlarge: 8x H100 SXM 80 GB, $98.32/h -> $12.29 per GPU-hour; H100 SXM FP32 67 TFLOP/s.
    CloudGpu("H100 SXM 80GB", "AWS p5.48xlarge", 98.32 / 8, 67.0e12),
    # p4d.24xlarge: 8x A100 SXM 40 GB, $32.7726/h -> $4.10 per GPU-hour; A100 FP32 19.5 TFLOP/s.
    CloudGpu("A100 SXM 40GB", "AWS p4d.24xlarge", 32.7726 / 8, 19.5e12),
    # p3.2xlarge: 1x V100 SXM2 16 GB, $3.06/h; V100 SXM2 FP32 15.7 TFLOP/s.
    CloudGpu("V100 SXM2 16GB", "AWS p3.2xlarge", 3.06, 15.7e12),
)


def cheapest_cloud() -> CloudGpu:
    """The table's GPU with the lowest price per FLOP."""
    return min(CLOUD_GPUS, key=lambda g: g.usd_per_flop_hour)


@dataclass(frozen=True)
class Demand:
    """Announced jobs still wanting devices, and idle devices, in this device's membership view."""

    jobs_wanting: int
    idle_devices: int

    def __post_init__(self) -> None:
        if self.jobs_wanting < 0 or self.idle_devices < 0:
            raise ValueError(f"demand counts must be >= 0, got {self.jobs_wanting} jobs, {self.idle_devices} idle")


NEUTRAL = Demand(0, 0)


def demand_factor(demand: Demand) -> float:
    """``clamp(sqrt((jobs + 1) / (idle + 1)), DEMAND_MIN, DEMAND_MAX)``."""
    ratio = (demand.jobs_wanting + 1) / (demand.idle_devices + 1)
    return min(DEMAND_MAX, max(DEMAND_MIN, math.sqrt(ratio)))


def _flops(flops_per_s: float) -> float:
    if math.isnan(flops_per_s) or flops_per_s <= 0:
        return 0.0
    return min(flops_per_s, MAX_FLOPS)


def price_per_hour(flops_per_s: float, demand: Demand = NEUTRAL) -> float:
    """Dollars per device-hour (the module docstring's formula). A device measuring nothing costs nothing."""
    f = _flops(flops_per_s)
    raw = BASE_RATE_PER_HOUR * (f / TYPICAL_LAPTOP_FLOPS) * demand_factor(demand)
    cap = CLOUD_SHARE * cheapest_cloud().usd_per_flop_hour * f
    return min(raw, cap)


def max_price_per_hour() -> float:
    """The highest price any device can be given (at :data:`MAX_FLOPS` and the highest demand)."""
    return price_per_hour(MAX_FLOPS, Demand(10**9, 0))


def cost_of(flops: float, flops_per_s: float, demand: Demand = NEUTRAL) -> float:
    """Dollars for ``flops`` of work on a device of ``flops_per_s`` at this price (its hours x its price)."""
    f = _flops(flops_per_s)
    if f == 0.0:
        return 0.0
    return flops / f / 3600.0 * price_per_hour(flops_per_s, demand)


__all__ = [
    "BASE_RATE_PER_HOUR",
    "CLOUD_GPUS",
    "CLOUD_PRICES_AS_OF",
    "CLOUD_PRICES_SOURCE",
    "CLOUD_SHARE",
    "NEUTRAL",
    "TYPICAL_LAPTOP_FLOPS",
    "CloudGpu",
    "Demand",
    "cheapest_cloud",
    "cost_of",
    "demand_factor",
    "max_price_per_hour",
    "price_per_hour",
]
