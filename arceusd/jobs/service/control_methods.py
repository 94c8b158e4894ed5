"""The job manager's control-socket methods: ``submit``, ``join``, ``jobs``, ``job``, ``cancel``, ``leave`` and
``lending``.

What the CLI asks this daemon about jobs (:mod:`arceusd.base.control` routes a request to these by name; the manager
registers them in :meth:`arceusd.jobs.service.manager.JobManager.run`). Each takes the request's parameters and answers
a JSON-able result, or raises :class:`arceusd.base.control.RequestError` saying what was wrong. ``submit`` refuses a job
whose training state cannot fit even on every device this daemon sees (:mod:`arceusd.jobs.plans.memory_fit`, the peers
asked by :mod:`arceusd.jobs.service.lending`); ``lending`` answers what they lend, for ``submit --quote``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from arceusd.base.control import RequestError
from arceusd.jobs.common.ports import Feed, JoinResult, Leads, OwnOffer, Spawn
from arceusd.jobs.core import Role, events
from arceusd.jobs.plans.memory_fit import Lent, refusal, training_memory
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.jobs.record.job import Job
from arceusd.jobs.spec.schema import JobSpecError, job_id, load_spec, spec_hash, to_dict
from arceusd.network.peers import PeerService
from protocol.job_wire import JobAck, JobReport, ReportKind

log = logging.getLogger(__name__)

ASKED_WITHIN_S = 60.0
"""A submit's ``asked_at`` (when the command began) is taken as the job's start when at most this much earlier."""


@dataclass(frozen=True)
class ControlMethodsPorts:
    """What :class:`ControlMethods` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    addresses: Mapping[str, str]
    """This daemon's listening addresses (``peer``: a submitted job's owner address)."""
    jobs: dict[str, Job]
    """The jobs this daemon holds, by id (a submitted job is added here)."""
    root: Path
    """This daemon's jobs folder."""
    feed: Feed
    leads: Leads
    spawn: Spawn
    offer: OwnOffer
    find: Callable[[str], Job]
    """The one job an id's prefix names (a one-line error otherwise)."""
    listing: Callable[[], list[dict[str, Any]]]
    """Every job this daemon holds or its records name, as JSON."""
    persist: Callable[[Job], None]
    """The job's durable record written."""
    lead: Callable[[Job], Awaitable[None]]
    """The leader's loop for one job."""
    join: Callable[[Job], Awaitable[JoinResult]]
    """Ask the job's leader to take this device in."""
    seen_lending: Callable[[], Awaitable[Lent]]
    """What this device and the peers it knows lend (:func:`arceusd.jobs.service.lending.seen_lending`)."""
    cost: Callable[[Job], dict[str, Any] | None]
    """The job's cost so far and to finish, on its leader (``arceusd.market.progress.job_cost``)."""
    peers: PeerService
    """The peer network (a member's leave told to the leader)."""


class ControlMethods:
    """The control-socket methods, over the manager's shared state."""

    def __init__(self, ports: ControlMethodsPorts) -> None:
        self.ports = ports

    def methods(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[Any]]]:
        """The control methods by the name the CLI calls them."""
        return {
            "submit": self.m_submit,
            "join": self.m_join,
            "jobs": self.m_jobs,
            "job": self.m_job,
            "cancel": self.m_cancel,
            "leave": self.m_leave,
            "lending": self.m_lending,
        }

    async def m_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        submitted = time.time()  # the job's start, as the quote times it (arceusd.market.timings)
        asked = params.get("asked_at")  # when the command began, on this machine's clock (the CLI's submit)
        if isinstance(asked, (int, float)) and submitted - ASKED_WITHIN_S <= float(asked) <= submitted:
            submitted = float(asked)

        path = params.get("spec_path")
        if not isinstance(path, str):
            raise RequestError("submit needs 'spec_path'")
        min_members = int(params.get("min_members", 1))
        if min_members < 1:
            raise RequestError("min_members must be >= 1")
        try:
            spec = await trio.to_thread.run_sync(load_spec, path)
        except JobSpecError as exc:
            raise RequestError(str(exc)) from None
        except OSError as exc:
            raise RequestError(f"cannot read the job spec {path}: {exc.strerror}") from None
        lent = await self.ports.seen_lending()
        too_big = refusal(training_memory(spec), lent)
        if too_big is not None:
            raise RequestError(too_big)
        digest = spec_hash(spec)
        jid = job_id(digest, self.ports.me, os.urandom(16))
        spec_bytes = json.dumps(to_dict(spec), sort_keys=True).encode()
        job = Job.submitted(
            jid,
            spec,
            spec_bytes,
            digest,
            self.ports.me,
            self.ports.addresses.get("peer", ""),
            self.ports.root,
            min_members=min_members,
            first_of_daemon=not self.ports.jobs,  # (its first worker waits for torch's import: the quote's start)
            created=submitted,
        )
        job.directory.mkdir(parents=True, exist_ok=True)
        job.paths.spec.write_bytes(spec_bytes)
        self.ports.jobs[jid] = job
        job.offers[self.ports.me] = await self.ports.offer()
        self.ports.persist(job)
        self.ports.spawn(self.ports.lead, job)
        self.ports.spawn(warm_starts().warm_up, spec.model)  # torch imported while the members gather (issue 33)
        log.info("job %s (%s) submitted; waiting for %d member(s)", jid, spec.name, min_members)
        return {"job_id": jid, "spec_hash": digest, "name": spec.name, "directory": str(job.directory)}

    async def m_lending(self, _params: dict[str, Any]) -> dict[str, Any]:
        """What this device and the alive peers it knows lend (bytes), and how many did not say."""
        lent = await self.ports.seen_lending()
        return {"own_bytes": lent.own_bytes, "peer_bytes": list(lent.peer_bytes), "unanswered": lent.unanswered}

    async def m_join(self, params: dict[str, Any]) -> JoinResult:
        job = self.ports.find(str(params.get("job_id", "")))
        return await self.ports.join(job)

    async def m_jobs(self, _params: dict[str, Any]) -> list[dict[str, Any]]:
        return self.ports.listing()

    async def m_job(self, params: dict[str, Any]) -> dict[str, Any]:
        history = params.get("history")
        if history not in (None, "all"):
            raise RequestError('history must be "all" (every loss point) or left out (the last 200)')
        job = self.ports.find(str(params.get("job_id", "")))
        out = job.summary(full=True, whole_history=history == "all", me=self.ports.me)
        out["cost"] = self.ports.cost(job)  # spent, budget left, time and cost to finish (on the leader)
        return out

    async def m_cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.ports.find(str(params.get("job_id", "")))
        if job.role != Role.OWNER and not self.ports.leads(job):
            raise RequestError("only the job's owner or its leader can cancel it")
        self.ports.feed(job, events.Cancel())
        return {"job_id": job.job_id, "state": job.state.value}

    async def m_leave(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.ports.find(str(params.get("job_id", "")))
        if job.role == Role.OWNER:
            raise RequestError("the owner cannot leave its own job (it serves the data); cancel it instead")
        if job.role != Role.MEMBER:
            raise RequestError(f"this device is not a member of job {job.job_id[:12]}")
        if self.ports.leads(job):
            raise RequestError("this device leads the job now (its owner is gone); cancel it instead")
        report = JobReport(job.job_id, job.epoch, ReportKind.LEAVE)
        reply = await self.ports.peers.request(
            job.leader_address, job.leader, report, timeout=10.0, job_id=job.job_id, term=job.term, epoch=job.epoch
        )
        told = isinstance(reply, JobAck) and reply.ok
        self.ports.feed(job, events.LeaveJob())  # stops our worker after the leader knows why our links break
        return {"job_id": job.job_id, "reason": "" if told else "the leader did not answer; it will notice"}


__all__ = ["ControlMethods"]
