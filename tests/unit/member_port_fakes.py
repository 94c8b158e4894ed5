"""The manager's side of :class:`arceusd.jobs.member.local_worker.LocalWorkerPorts` in unit tests: a leader check
that accepts every command, this device's fixed offer, and dropping the worker as the manager does (stop it with
a short grace, forget it). Shared by the tests that drive ``LocalWorker.on_start`` without a daemon."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from arceusd.jobs.record.job import Job
from protocol.envelope import Header


@dataclass(frozen=True)
class PortFakes:
    check_leader: Callable[[Header, Job], Awaitable[None]]
    offer: Callable[[], Awaitable[Any]]
    drop_own_worker: Callable[[Job], Awaitable[None]]


def port_fakes(offer: Any) -> PortFakes:
    """Fakes whose ``offer`` answers ``offer``."""

    async def check_leader(_header: Header, _job: Job) -> None:
        return None

    async def own_offer() -> Any:
        return offer

    async def drop_own_worker(job: Job) -> None:  # the manager's: stop and forget the worker
        worker, job.worker = job.worker, None
        if worker is not None:
            await worker.stop(grace=0.5)

    return PortFakes(check_leader, own_offer, drop_own_worker)
