"""The job manager's control-socket methods: ``submit``, ``join``, ``jobs``, ``job``, ``cancel`` and ``leave``.

What the CLI asks this daemon about jobs (:mod:`arceusd.control` routes a request to these by name; the manager
registers them in :meth:`arceusd.jobs.manager.JobManager.run`). Each takes the request's parameters and answers a
JSON-able result, or raises :class:`arceusd.control.RequestError` saying what was wrong.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import trio

from arceusd.control import RequestError
from arceusd.jobs.job import Job
from arceusd.jobs.manager_base import ManagerBase
from protocol.job_wire import JobAck, JobReport

log = logging.getLogger(__name__)


class ControlMethods(ManagerBase):
    """The control-socket methods, over the manager's shared state."""

    async def _m_submit(self, params: dict[str, Any]) -> dict[str, Any]:
        from arceusd.jobs.spec import JobSpecError, job_id, load_spec, spec_hash, to_dict

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
        digest = spec_hash(spec)
        jid = job_id(digest, self.node.identity.peer_id, os.urandom(16))
        spec_bytes = json.dumps(to_dict(spec), sort_keys=True).encode()
        job = Job(jid, spec, spec_bytes, digest, self.node.identity.peer_id, self.node.addresses.get("peer", ""),
                  "owner", self.root / jid, min_members=min_members,
                  total_steps=spec.training.steps)  # fmt: skip
        job.directory.mkdir(parents=True, exist_ok=True)
        (job.directory / "spec.json").write_bytes(spec_bytes)
        self.jobs[jid] = job
        job.members[self.node.identity.peer_id] = await self.offer()
        self._persist(job)
        self._spawn(self._lead, job)
        log.info("job %s (%s) submitted; waiting for %d member(s)", jid, spec.name, min_members)
        return {"job_id": jid, "spec_hash": digest, "name": spec.name, "directory": str(job.directory)}

    async def _m_join(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        return await self.join(job)

    async def _m_jobs(self, _params: dict[str, Any]) -> list[dict[str, Any]]:
        return [j.summary() for j in sorted(self.jobs.values(), key=lambda j: j.created)]

    async def _m_job(self, params: dict[str, Any]) -> dict[str, Any]:
        history = params.get("history")
        if history not in (None, "all"):
            raise RequestError('history must be "all" (every loss point) or left out (the last 200)')
        return self.find(str(params.get("job_id", ""))).summary(
            full=True, whole_history=history == "all", me=self.node.identity.peer_id
        )

    async def _m_cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        if job.role != "owner" and not self._leads(job):
            raise RequestError("only the job's owner or its leader can cancel it")
        await self._finish(job, "cancelled", "cancelled by the owner")
        return {"job_id": job.job_id, "state": job.state}

    async def _m_leave(self, params: dict[str, Any]) -> dict[str, Any]:
        job = self.find(str(params.get("job_id", "")))
        if job.role == "owner":
            raise RequestError("the owner cannot leave its own job (it serves the data); cancel it instead")
        if job.role != "member":
            raise RequestError(f"this device is not a member of job {job.job_id[:12]}")
        if self._leads(job):
            raise RequestError("this device leads the job now (its owner is gone); cancel it instead")
        job.role, job.state = "seen", "left"
        report = JobReport(job.job_id, job.epoch, json.dumps({"event": "leave"}))
        reply = await self.peers.request(job.leader_address, job.leader, report, timeout=10.0, job_id=job.job_id,
                                         term=job.term, epoch=job.epoch)  # fmt: skip
        told = isinstance(reply, JobAck) and reply.ok
        await self._drop_own_worker(job)  # after the leader knows why our links are about to break
        return {"job_id": job.job_id, "reason": "" if told else "the leader did not answer; it will notice"}


__all__ = ["ControlMethods"]
