"""The device owner's terms (``[policy]`` in config.toml) and their pure evaluation.

Owns: :class:`Policy` (when to lend, caps, the lowest price accepted, which jobs), its checks, and the pure
functions that decide from a probe :class:`~arceusd.market.probes.Snapshot`:
- :func:`lend_reasons`: why this device should not lend right now (empty: it may);
- :func:`evaluate`: (policy, snapshot, job, price) -> :class:`Decision` (accept, or every reason why not);
- :func:`lend_terms` / :func:`policy_terms`: every term as the owner reads it (the dashboard's device page), with
  what the machine shows and whether it holds now; the lending conditions are decided in one place
  (``_machine_checks``), which :func:`lend_reasons` reads too.

The device lends while every condition holds: idle at least ``idle_minutes`` (no input), on mains power when
``require_ac``, the battery at or above ``min_battery_percent`` (a machine without a battery passes), the
owner's own CPU use (everything but Arceus) at most ``max_owner_cpu_percent``, and the local hour inside
``hours`` (``[start, end)``, wrapping past midnight; empty: any hour). A condition the probes cannot see
(``None`` in the snapshot) passes: a server with no login session and no battery is idle and on mains.
When a condition that held stops holding while the device works for a job, the owner is back
(:func:`owner_back`) and the device leaves its jobs.

Reading and writing the ``[policy]`` table lives in ``arceusd.market.policy_file``; probing the machine in
``arceusd.market.probes``.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field

from arceusd.jobs.record.view import usd_per_hour
from arceusd.market.probes import Snapshot
from arceusd.market.unpaid import GRACE_S

_PEER_ID = re.compile(r"^[0-9a-f]{32}$")


class PolicyError(ValueError):
    """A policy value is out of range; the message names the key and what is allowed."""


@dataclass(frozen=True)
class Policy:
    """The owner's terms. Zero caps mean "no cap"; an empty ``owners`` accepts every job owner. The defaults
    lend whenever the machine is up (:data:`LAPTOP` is the suggested laptop policy)."""

    lend: bool = True
    """Master switch: False lends to no job whatever else holds."""
    idle_minutes: float = 0.0
    require_ac: bool = False
    min_battery_percent: float = 0.0
    max_owner_cpu_percent: float = 100.0
    hours: tuple[int, ...] = ()
    """``(start, end)`` local hours, end exclusive, may wrap (``(22, 7)``); ``()`` = any hour."""
    max_cores: int = 0
    max_memory_mib: int = 0
    gpu: bool = True
    """Whether a job may use this device's GPU (CUDA/MPS)."""
    min_price_per_hour: float = 0.0
    owners: tuple[str, ...] = ()
    """Peer ids of the job owners this device works for (empty: anyone)."""
    max_model_params: int = 0
    """The largest model (parameters) this device trains a part of (0: any)."""
    probe_root: str = ""
    """Read the machine from this folder instead of ``/`` (a fake /proc, /sys and command outputs; tests)."""
    unpaid_checkpoints: int = 2
    """Checkpoints of this device's work a job's owner may leave unpaid (no countersigned receipt, or $0 ones)
    before the device leaves the job and says why (``arceusd.market.unpaid``)."""
    receipt_grace_s: float = GRACE_S
    """Seconds after this device's worker passed a checkpoint by which its receipt is due (and not before the next
    checkpoint passed): the owner's time to gather, check and commit the step and send the receipt. Longer on
    slow links; shorter leaves a withholding owner less of the device's work. In 5..86400 (the default:
    :data:`arceusd.market.unpaid.GRACE_S`, which says why)."""

    def __post_init__(self) -> None:
        def bad(key: str, allowed: str, value: object) -> PolicyError:
            return PolicyError(f"policy.{key}: {allowed}, got {value!r}")

        for key in ("idle_minutes", "min_battery_percent", "max_owner_cpu_percent", "min_price_per_hour"):
            v = getattr(self, key)
            if not (isinstance(v, int | float) and not isinstance(v, bool)) or not math.isfinite(v) or v < 0:
                raise bad(key, "must be a number >= 0", v)
        v = self.receipt_grace_s
        if not (isinstance(v, int | float) and not isinstance(v, bool)) or not 5 <= v <= 86400:
            raise bad("receipt_grace_s", "must be seconds in 5..86400", v)
        if self.min_battery_percent > 100 or self.max_owner_cpu_percent > 100:
            raise PolicyError("policy: percentages must be in 0..100")
        if self.hours and (len(self.hours) != 2 or not all(isinstance(h, int) and 0 <= h <= 24 for h in self.hours)):
            raise bad("hours", "must be [start, end] with hours in 0..24, or [] for any hour", list(self.hours))
        for key in ("max_cores", "max_memory_mib", "max_model_params", "unpaid_checkpoints"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise bad(key, "must be an integer >= 0 (0 = no cap)", v)
        for owner in self.owners:
            if not isinstance(owner, str) or not _PEER_ID.match(owner):
                raise bad("owners", "must be peer ids (32 lowercase hex characters)", owner)


DEFAULT_POLICY = Policy()
"""Lends whenever the machine is up (what ``auto_join`` did before policies): the owner opts in to conditions."""
LAPTOP = Policy(idle_minutes=5.0, require_ac=True, min_battery_percent=50.0, max_owner_cpu_percent=25.0)
"""The terms the README suggests for a laptop: idle 5 minutes, plugged in, battery at least half, the owner's
own CPU use at most a quarter."""


class Reason(enum.Enum):
    """Why a device does not lend or does not take a job (the value is the short text shown to owners)."""

    OFF = "lending is off (policy.lend = false)"
    NOT_IDLE = "the owner used this machine recently"
    ON_BATTERY = "not on mains power"
    LOW_BATTERY = "battery below the policy's minimum"
    OWNER_CPU = "the owner's own CPU use is above the policy's maximum"
    HOURS = "outside the policy's hours"
    OWNER_NOT_ALLOWED = "the job's owner is not in policy.owners"
    MODEL_TOO_LARGE = "the model is larger than policy.max_model_params"
    PRICE_TOO_LOW = "the job pays less than policy.min_price_per_hour"


@dataclass(frozen=True)
class Refusal:
    """One reason with the figures behind it (``detail``: "idle 40 s < 300 s")."""

    reason: Reason
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason.value} ({self.detail})" if self.detail else self.reason.value


@dataclass(frozen=True)
class JobFacts:
    """What the policy looks at in a job: its owner, its model's size, the price it pays this device."""

    owner: str
    model_params: int
    price_per_hour: float


@dataclass(frozen=True)
class Decision:
    refusals: tuple[Refusal, ...] = field(default=())

    @property
    def accept(self) -> bool:
        return not self.refusals

    def __str__(self) -> str:
        return "accept" if self.accept else "; ".join(str(r) for r in self.refusals)


def in_hours(hours: tuple[int, ...], hour: int) -> bool:
    """Whether ``hour`` (0..23) lies in ``[start, end)``; wraps past midnight; ``()`` or start == end: always."""
    if not hours or hours[0] == hours[1]:
        return True
    start, end = hours
    return start <= hour < end if start < end else (hour >= start or hour < end)


@dataclass(frozen=True)
class Term:
    """One of the owner's terms as shown to the owner: the ``[policy]`` key it is set with, what it asks, what
    the machine (or the announced jobs) show now, and whether it holds now (None: it is checked for each job as
    the job comes, not against the machine)."""

    key: str
    asks: str
    now: str
    met: bool | None


def _machine_checks(policy: Policy, snap: Snapshot) -> list[tuple[Term, Refusal | None]]:
    """Each lending condition of ``policy`` judged on ``snap``: the term as shown, and the refusal when it fails.
    The one place these conditions are decided (:func:`lend_reasons` and :func:`lend_terms` both read it)."""
    out: list[tuple[Term, Refusal | None]] = [
        (
            Term(
                "lend",
                "lend this device" if policy.lend else "lend to no job",
                "on" if policy.lend else "off",
                policy.lend,
            ),
            None if policy.lend else Refusal(Reason.OFF),
        )
    ]
    need = policy.idle_minutes * 60.0
    idle = snap.idle_s
    fails = idle is not None and idle < need
    out.append(
        (
            Term(
                "idle_minutes",
                f"idle at least {policy.idle_minutes:g} min" if need else "idle: any time",
                "this machine cannot tell (passes)"
                if idle is None
                else f"idle {idle:.0f} s {'<' if fails else '>='} {need:.0f} s",
                not fails,
            ),
            Refusal(Reason.NOT_IDLE, f"idle {idle:.0f} s < {need:.0f} s") if fails and idle is not None else None,
        )
    )
    fails = policy.require_ac and snap.on_ac is False
    power = {True: "on mains", False: "on battery", None: "this machine cannot tell (passes)"}[snap.on_ac]
    out.append(
        (
            Term(
                "require_ac", "on mains power" if policy.require_ac else "mains power: not required", power, not fails
            ),
            Refusal(Reason.ON_BATTERY) if fails else None,
        )
    )
    battery, least = snap.battery_percent, policy.min_battery_percent
    fails = battery is not None and snap.on_ac is not True and battery < least
    now = (
        "no battery (passes)"
        if battery is None
        else f"on mains, battery {battery:.0f}% (passes)"
        if snap.on_ac is True
        else f"battery {battery:.0f}% {'<' if fails else '>='} {least:.0f}%"
    )
    out.append(
        (
            Term(
                "min_battery_percent",
                f"battery at least {least:.0f}%" if least else "battery: any level",
                now,
                not fails,
            ),
            Refusal(Reason.LOW_BATTERY, f"{battery:.0f}% < {least:.0f}%") if fails and battery is not None else None,
        )
    )
    cpu, most = snap.owner_cpu_percent, policy.max_owner_cpu_percent
    fails = cpu is not None and cpu > most
    out.append(
        (
            Term(
                "max_owner_cpu_percent",
                f"owner's own CPU use at most {most:.0f}%",
                "not measured yet (passes)"
                if cpu is None
                else f"owner CPU {cpu:.0f}% {'>' if fails else '<='} {most:.0f}%",
                not fails,
            ),
            Refusal(Reason.OWNER_CPU, f"{cpu:.0f}% > {most:.0f}%") if fails and cpu is not None else None,
        )
    )
    fails = not in_hours(policy.hours, snap.local_hour)
    span = f"{policy.hours[0]}-{policy.hours[1]}" if policy.hours else ""
    out.append(
        (
            Term(
                "hours",
                f"hours {span} (local, end excluded)" if span else "hours: any",
                f"hour {snap.local_hour}" + (f" {'not in' if fails else 'in'} {span}" if span else ""),
                not fails,
            ),
            Refusal(Reason.HOURS, f"hour {snap.local_hour} not in {span}") if fails else None,
        )
    )
    return out


def lend_reasons(policy: Policy, snap: Snapshot) -> tuple[Refusal, ...]:
    """Every condition of ``policy`` the machine fails now (empty: it may lend)."""
    return tuple(r for _, r in _machine_checks(policy, snap) if r is not None)


def lend_terms(policy: Policy, snap: Snapshot) -> tuple[Term, ...]:
    """Every lending condition of ``policy`` with the reading it is judged on and whether it holds now."""
    return tuple(t for t, _ in _machine_checks(policy, snap))


def cores_within(policy: Policy, threads: int) -> bool:
    """Whether workers of ``threads`` threads keep to ``policy.max_cores`` (0: no cap)."""
    return not policy.max_cores or threads <= policy.max_cores


def pays_enough(policy: Policy, price_per_hour: float) -> bool:
    """Whether a job paying ``price_per_hour`` to this device meets the owner's floor price."""
    return price_per_hour >= policy.min_price_per_hour


def policy_terms(policy: Policy, snap: Snapshot, threads: int, prices: list[float] | None) -> tuple[Term, ...]:
    """Every term of ``policy`` as the owner reads it (the dashboard's device page): the lending conditions
    judged on ``snap`` (:func:`lend_terms`), the caps against this device's workers (``threads``), the floor price
    against what the announced jobs pay this device (``prices``; None: not known), and the terms each job is
    checked against when it comes (``met`` None)."""
    terms = list(lend_terms(policy, snap))
    ok = cores_within(policy, threads)
    terms.append(
        Term(
            "max_cores",
            f"at most {policy.max_cores} cores" if policy.max_cores else "cores: no cap",
            f"workers use {threads} thread(s)" + ("" if ok else f" > {policy.max_cores}"),
            ok,
        )
    )
    terms.append(
        Term(
            "max_memory_mib",
            f"lend at most {policy.max_memory_mib:,} MiB of memory" if policy.max_memory_mib else "memory: no cap",
            "applied to every offer",
            True,
        )
    )
    terms.append(
        Term(
            "gpu",
            "jobs may use the GPU" if policy.gpu else "CPU only (no GPU for jobs)",
            "applied to every offer",
            True,
        )
    )
    floor = usd_per_hour(policy.min_price_per_hour)
    paying = [p for p in prices or [] if pays_enough(policy, p)]
    terms.append(
        Term(
            "min_price_per_hour",
            f"floor price {floor}",
            "not known yet"
            if prices is None
            else "no job announced"
            if not prices
            else f"{len(paying)} of {len(prices)} announced job(s) pay at least {floor}",
            None if not prices else bool(paying),
        )
    )
    terms.append(
        Term(
            "owners",
            f"only jobs of {len(policy.owners)} owner(s)" if policy.owners else "jobs of any owner",
            "checked for each job",
            None,
        )
    )
    terms.append(
        Term(
            "max_model_params",
            f"models up to {policy.max_model_params:,} parameters" if policy.max_model_params else "models of any size",
            "checked for each job",
            None,
        )
    )
    terms.append(
        Term(
            "unpaid_checkpoints",
            f"leave a job after {policy.unpaid_checkpoints} unpaid checkpoint(s)",
            "checked for each job",
            None,
        )
    )
    terms.append(
        Term(
            "receipt_grace_s",
            f"a checkpoint's receipt is due {policy.receipt_grace_s:g} s after it",
            "checked for each job",
            None,
        )
    )
    return tuple(terms)


def job_reasons(policy: Policy, job: JobFacts) -> tuple[Refusal, ...]:
    """Whether ``policy`` takes this job at all, machine state aside."""
    out: list[Refusal] = []
    if policy.owners and job.owner not in policy.owners:
        out.append(Refusal(Reason.OWNER_NOT_ALLOWED, job.owner[:12]))
    if policy.max_model_params and job.model_params > policy.max_model_params:
        out.append(Refusal(Reason.MODEL_TOO_LARGE, f"{job.model_params:,} > {policy.max_model_params:,}"))
    if not pays_enough(policy, job.price_per_hour):
        out.append(
            Refusal(
                Reason.PRICE_TOO_LOW, f"{usd_per_hour(job.price_per_hour)} < {usd_per_hour(policy.min_price_per_hour)}"
            )
        )
    return tuple(out)


def evaluate(policy: Policy, snap: Snapshot, job: JobFacts) -> Decision:
    """Accept, or every reason not to: the machine's state first, then the job's terms."""
    return Decision(lend_reasons(policy, snap) + job_reasons(policy, job))


def owner_back(policy: Policy, snap: Snapshot) -> bool:
    """The owner needs the machine back: a lending condition (other than the price or the job) fails now."""
    return bool(lend_reasons(policy, snap))
