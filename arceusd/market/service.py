"""The daemon's market service: keeps the machine's latest probe reading and answers ``market`` and ``quote``.

I/O only: it samples the probe (``arceusd.market.probes``) once a second in a thread, reloads the policy from
config.toml on each question (so ``arceusd policy --set`` takes effect without a restart), and reads the jobs
this daemon knows through the job manager's read-only attributes (``node.jobs.jobs``, ``node.jobs.offer()``)
and the membership view (``node.peers.alive_peers()``). Every decision is a pure call into
``arceusd.market.needs`` / ``policy`` / ``pricing``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from typing import Any

import trio

from arceusd.control import RequestError
from arceusd.market.needs import DeviceOffer, JobNeeds, demand_in_view, match
from arceusd.market.policy import Policy, PolicyError
from arceusd.market.policy_file import load_policy
from arceusd.market.pricing import Demand
from arceusd.market.probes import Probe, Snapshot, probe_for
from arceusd.node import Node

log = logging.getLogger(__name__)

SAMPLE_S = 1.0
TERMINAL = frozenset({"done", "failed", "cancelled"})


def own_pids(node: Node) -> list[int]:
    """The daemon and its stage workers (their CPU use is not the owner's)."""
    pids = [os.getpid()]
    manager = node.jobs
    for job in getattr(manager, "jobs", {}).values():
        worker = getattr(job, "worker", None)
        pid = getattr(worker, "pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return pids


class Market:
    """What the market service holds: the policy file's path, the probe and its latest reading."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.policy = self._load()
        self.probe: Probe = probe_for(self.policy.probe_root, own_pids=lambda: own_pids(node))
        self.snapshot: Snapshot = Snapshot(None, None, None, None, time.localtime().tm_hour)

    def _load(self) -> Policy:
        try:
            return load_policy(self.node.paths.config)
        except PolicyError as exc:
            log.warning("%s; lending under the default policy until it is fixed", exc)
            return Policy()

    def reload(self) -> Policy:
        new = self._load()
        if new.probe_root != self.policy.probe_root:
            self.probe = probe_for(new.probe_root, own_pids=lambda: own_pids(self.node))
        self.policy = new
        return new

    async def sample(self) -> Snapshot:
        self.snapshot = await trio.to_thread.run_sync(self.probe.snapshot, time.time())
        return self.snapshot

    def job_needs(self) -> list[tuple[Any, JobNeeds]]:
        out = []
        for job in getattr(self.node.jobs, "jobs", {}).values():
            if job.state in TERMINAL:
                continue
            try:
                needs = JobNeeds.from_spec(job.job_id, job.owner, job.spec, len(job.members))
            except (AssertionError, ValueError, TypeError):
                continue
            out.append((job, needs))
        return out

    def demand(self, jobs: list[tuple[Any, JobNeeds]]) -> Demand:
        peers = self.node.peers
        alive = len(peers.alive_peers()) if peers is not None else 1
        busy = len({m for job, _ in jobs for m in job.members})
        return demand_in_view([n for _, n in jobs], alive, busy)

    async def offer(self) -> DeviceOffer:
        o = await self.node.jobs.offer()
        return DeviceOffer(self.node.identity.peer_id, o.kind, int(o.memory_bytes), float(o.flops_per_s))

    async def listing(self) -> dict[str, Any]:
        policy = self.reload()
        offer = await self.offer()
        jobs = self.job_needs()
        demand = self.demand(jobs)
        me = self.node.identity.peer_id
        rows = []
        for job, needs in jobs:
            if job.owner == me:
                continue
            m = match(offer, policy, self.snapshot, needs, demand, member=me in job.members)
            rows.append({"job_id": job.job_id, "name": job.spec.name, "owner": job.owner, "state": job.state,
                         "members": needs.members, "max_members": needs.max_members,
                         "max_price_per_hour": needs.max_price_per_hour, "price_per_hour": m.price_per_hour,
                         "qualifies": m.qualifies, "reasons": [str(r) for r in m.reasons]})  # fmt: skip
        return {"device": asdict(offer), "machine": asdict(self.snapshot), "demand": asdict(demand), "jobs": rows}


async def serve_market(node: Node, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Sample the machine every second and answer ``market``."""
    market = Market(node)
    node.market = market

    async def m_market(_params: dict[str, Any]) -> dict[str, Any]:
        if node.jobs is None:
            raise RequestError("the job service is not running")
        return await market.listing()

    node.methods["market"] = m_market
    await market.sample()
    task_status.started()
    while True:
        await trio.sleep(SAMPLE_S)
        await market.sample()
