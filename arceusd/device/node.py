"""The running node: what every service of one daemon shares (identity, config, clock origin, status sections).

Services register a *status section* (a zero-argument callable returning JSON-friendly data) and control
methods; ``arceusd status`` shows the union. This keeps :mod:`arceusd.daemon.run` down to opening services.

Every node answers the ``modules`` control method: the top-level packages loaded in the daemon's process (the
daemon never imports torch: its tensor work runs in child processes; a test holds it to that).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from arceusd import __version__
from arceusd.base.control import Handler
from arceusd.base.identity import Identity
from arceusd.base.paths import StatePaths
from arceusd.device.config import DaemonConfig, config_summary

if TYPE_CHECKING:
    from arceusd.elections.driver import JobElections
    from arceusd.jobs.plans.planning import Offer
    from arceusd.jobs.record.job import Job
    from arceusd.network.peers import PeerService


class JobService(Protocol):
    """What the daemon's other services use of the job manager (``arceusd.jobs.service.manager.JobManager``): its jobs
    by id and this device's offer. A port, so this module imports nothing of the job layer, which imports it
    (issue 32: ``Node.jobs`` typed as the manager closed the job layer's import cycle through here)."""

    @property
    def jobs(self) -> Mapping[str, Job]: ...

    async def offer(self) -> Offer: ...


@dataclass
class Node:
    identity: Identity
    config: DaemonConfig
    started_monotonic: float = field(default_factory=time.monotonic)
    boot_id: int = field(default_factory=lambda: int.from_bytes(os.urandom(8), "big") >> 1)
    addresses: dict[str, str] = field(default_factory=dict)
    sections: dict[str, Callable[[], Any]] = field(default_factory=dict)
    methods: dict[str, Handler] = field(default_factory=dict)
    peers: PeerService | None = None  # each set by its service once it starts
    jobs: JobService | None = None
    elections: JobElections | None = None
    market: Any = None
    shutdown_hooks: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    started: trio.Event = field(default_factory=trio.Event)  # set once every service is started

    def __post_init__(self) -> None:
        self.methods.setdefault("modules", self._m_modules)

    @staticmethod
    async def _m_modules(_params: dict[str, Any]) -> dict[str, Any]:
        """The top-level packages this process has imported (``torch`` must never be among them)."""
        return {"packages": sorted({name.partition(".")[0] for name in list(sys.modules)}), "count": len(sys.modules)}

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.config.state_dir)

    def uptime(self) -> float:
        return time.monotonic() - self.started_monotonic

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "peer_id": self.identity.peer_id,
            "fingerprint": self.identity.fingerprint,
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": round(self.uptime(), 3),
            "state_dir": str(self.config.state_dir),
            "preset": self.config.preset,
            "addresses": dict(self.addresses),
            "config": config_summary(self.config),
        }
        for name, section in self.sections.items():
            out[name] = section()
        return out
