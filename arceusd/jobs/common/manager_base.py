"""The job manager's shared state and helpers.

:class:`JobContext` holds what the job service shares: the node and the peer network, the jobs by id, this device's
offer, the manager's nursery (:meth:`JobContext.spawn`), the file transfers
(:class:`arceusd.jobs.common.transfers.Transfers`), the durable record of a job (the owner's to resume it, a member's
to list it after a restart: :mod:`arceusd.jobs.record.known`) and the jobs listing. It also owns whom this device
follows as a job's leader: the check of a leader's command (:meth:`JobContext.check_leader` over
:mod:`arceusd.jobs.core.leadership`), the election's answer and tracking.

The manager (:class:`arceusd.jobs.service.manager.JobManager`) is a ``JobContext``; its parts are not handed it:
each gets a port of its own (a frozen dataclass of exactly the callables and values it uses, declared beside it;
the shared shapes are in :mod:`arceusd.jobs.common.ports`), built by the manager from these methods. The one
call back into the manager left here is :attr:`JobContext.life` (:class:`Lifecycle`): a leader loop that fails
fails its job.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from arceusd.base.atomic_files import atomic_write
from arceusd.base.control import RequestError
from arceusd.device.node import Node
from arceusd.device.summary import device_summary
from arceusd.jobs.common.transfers import Transfers
from arceusd.jobs.core import Role, Stamp, actions, events, leadership
from arceusd.jobs.plans.initial_weights import standby_copies
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.record.job import TERMINAL, Job
from arceusd.jobs.record.known import KnownJob, known_jobs, member_record
from arceusd.market.hooks import job_receipts
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import JobAck

log = logging.getLogger(__name__)


class JobContext:
    """What every part of the job manager shares: state, the nursery, the offer, and whom this device follows."""

    def __init__(self, node: Node, peers: PeerService) -> None:
        self.node = node
        self.peers = peers
        self.jobs: dict[str, Job] = {}
        self._offer: Offer | None = None
        self._nursery: trio.Nursery | None = None  # set by the service while it runs
        self.root = node.paths.jobs_dir
        self.transfers = Transfers(peers, self.jobs, node.identity.peer_id, self.elected)
        self.life: Lifecycle | None = None  # the manager, once built: a failed leader loop fails its job
        self.known: dict[str, KnownJob] = {}  # jobs this daemon's records name (read once, at its start)
        self._leader_waiters: dict[str, list[trio.Event]] = {}  # job id -> elected() calls waiting for a change
        self._tracked: dict[str, tuple[list[str], list[str]]] = {}  # job id -> members, ranking asked for

    def persist(self, job: Job) -> None:
        """The durable record of a job: the owner's (enough to resume it after this daemon restarts), a
        member's (enough to list it after a restart: :mod:`arceusd.jobs.record.known`; kept once written, also after
        it left the job)."""
        record = member_record(job)
        if job.role == Role.OWNER:
            path = job.paths.owner_record
            record.update(
                {
                    "spec_hash": job.spec_hash,
                    "base_dir": str(job.spec.base_dir),
                    "term": job.term,
                    "epoch": job.epoch,
                    "members": sorted(job.members),
                }
            )
        elif job.role == Role.MEMBER or job.paths.member_record.is_file():
            path = job.paths.member_record
        else:
            return
        try:
            job.directory.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(record, indent=1).encode())
        except OSError as exc:
            log.warning("job %s: cannot save its state: %s", job.job_id, exc)

    def known_ids(self) -> set[str]:
        """The ids of the jobs this daemon's records or ledger name (held or not)."""
        return set(self.known) | set(job_receipts(self.node))

    def listing(self) -> list[dict[str, Any]]:
        """Every job this daemon holds (oldest first), then one row per job only its records or its ledger name
        (:func:`arceusd.jobs.record.known.known_jobs`: e.g. a job it earned from before it restarted)."""
        held = [j.summary() for j in sorted(self.jobs.values(), key=lambda j: j.created)]
        known = known_jobs(self.known, job_receipts(self.node), self.node.identity.peer_id, self.jobs)
        return held + [k.summary() for k in known]

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` in the manager's nursery; a failure is logged (and fails its job when it is the
        leader loop), never allowed to take the daemon down."""
        assert self._nursery is not None

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                log.exception("job task %s failed", getattr(fn, "__name__", fn))
                job = args[0] if args and isinstance(args[0], Job) else None
                life = self.life
                if job is not None and life is not None and fn == life.lead and job.state not in TERMINAL:
                    life.feed(job, events.Fail(f"internal error in the job's leader: {exc!r}"))

        self._nursery.start_soon(guarded)

    async def offer(self) -> Offer:
        """This device's offer (measured once in a child process, cached on disk for a day); the memory it lends
        is capped by ``lend_memory_mib`` when the device's owner set one."""
        if self._offer is None:
            result = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "arceusd.jobs.procs.probe",
                    str(self.node.paths.root),
                    str(self.node.config.worker_threads),
                    ",".join(self.node.config.devices),
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            if result.returncode != 0:
                raise RequestError(f"measuring this device failed: {result.stderr.decode()[-500:]}")
            m = json.loads(result.stdout.decode().strip().splitlines()[-1])
            memory = int(m["memory_bytes"])
            if self.node.config.lend_memory_mib:  # the device's owner caps what a job may use
                memory = min(memory, self.node.config.lend_memory_mib << 20)
            self._offer = Offer(
                self.node.identity.peer_id,
                self.node.addresses.get("peer", ""),
                m["flops_per_s"],
                memory,
                m["kind"],
                float(m.get("block_efficiency", 1.0)),
                float(m.get("dispatch_s", 0.0)),
                float(m.get("adamw_s_per_param", 0.0)),
                float(m.get("sgd_s_per_param", 0.0)),
            )
            if self.node.peers is not None:  # peers, status and the dashboard now name the measured device
                self.node.peers.set_device(device_summary(self.node.paths.root, self.node.config.devices))
        return self._offer

    def find(self, job_ref: str) -> Job:
        matches = [j for jid, j in self.jobs.items() if jid.startswith(job_ref)] if job_ref else []
        if len(matches) != 1:
            known = ", ".join(sorted(self.jobs)) or "none"
            if not matches and job_ref and any(k.startswith(job_ref) for k in self.known_ids()):
                raise RequestError(
                    f"job {job_ref!r} is known here only from this device's records (the daemon "
                    "restarted since): `arceusd jobs` lists it, `arceusd earnings` what it paid"
                )
            raise RequestError(
                f"no job matches {job_ref!r} (known jobs: {known})"
                if not matches
                else f"{job_ref!r} matches several jobs; give more of the id"
            )
        return matches[0]

    async def drop_own_worker(self, job: Job) -> None:
        worker, job.worker = job.worker, None
        if worker is not None:
            await worker.stop(grace=0.5)

    # ---------------------------------------------------------------------------------------------- following
    async def commanded(self, header: Header, job_id: str) -> Job | JobAck:
        """The job a leader's command names, or the answer refusing it (an unknown job; not from the leader this
        device follows, at its term and epoch: :meth:`check_leader`)."""
        job = self.jobs.get(job_id)
        if job is None:
            return JobAck(False, "unknown job")
        why = await self.check_leader(header, job)
        if why is not None:
            return JobAck(False, why.reason, why.follows)
        return job

    async def check_leader(self, header: Header, job: Job, epochs: bool = True) -> leadership.Refuse | None:
        """Why a leader command for ``job`` must be refused (None when it is acceptable).

        Acceptable: from our leader, not older than what we have (``epochs=False``: only the term counts); or
        with a newer term from the peer the job's election made leader (a standby that took over), which then
        becomes our leader; on a spare, which is in no election, from the standby its gone leader named
        (:func:`leadership.spare_may_follow`). A refusal because we follow another peer names it
        (:func:`leadership.refusal`), so a leader that was replaced while membership thought it dead learns whom to
        join."""
        verdict = leadership.judge_command(
            header.sender, header.term, header.epoch, job.leader, job.term, job.epoch, epochs
        )
        if isinstance(verdict, leadership.Accept):
            return None
        if isinstance(verdict, leadership.Refuse):
            return verdict
        gone = job.leader not in self.peers.answering_peers()
        if leadership.spare_may_follow(header.sender, job.standby, job.is_spare(), gone):
            log.info("job %s: a spare; following %s, the standby of its gone leader", job.job_id, header.sender[:12])
            self.follow_leader(job, header.sender, Stamp(header.term, job.epoch))
            return None
        if await self.elected(job, header.sender):
            log.info("job %s: following %s, elected leader (term %d)", job.job_id, header.sender[:12], header.term)
            self.follow_leader(job, header.sender, Stamp(header.term, job.epoch))
            return None
        return leadership.refusal(job.leader, job.term)  # tells a replaced leader whom we follow

    def follow_leader(self, job: Job, peer: str, stamp: Stamp | None = None) -> None:
        """Take ``job``'s commands from ``peer`` (at ``stamp``, when given), at its address in membership."""
        member = self.peers.membership.members.get(peer)
        job.core.follow(peer, stamp)
        job.leader_address = member.address if member is not None else job.leader_address

    async def elected(self, job: Job, peer: str, wait_s: float = 3.0) -> bool:
        """Whether the job's election has ``peer`` as leader (waiting a little: its announce may still be on its
        way when its first command arrives). Woken by the election's leader changes
        (:meth:`leader_changed`), not by polling."""
        elections = self.node.elections
        if elections is None:
            return False
        with trio.move_on_after(wait_s):
            while True:
                current = elections.leader(job.job_id)
                if current is not None and current[0] == peer:
                    return True
                changed = trio.Event()
                waiters = self._leader_waiters.setdefault(job.job_id, [])
                waiters.append(changed)
                try:
                    await changed.wait()
                finally:  # timed out or cancelled: leave no waiter behind (a stranger's commands cannot pile up)
                    if changed in waiters:
                        waiters.remove(changed)
                    if not waiters and self._leader_waiters.get(job.job_id) is waiters:
                        del self._leader_waiters[job.job_id]
        return False

    def leader_changed(self, job_id: str) -> None:
        """The job's election changed its leader (the manager's leader-change callback): wake every
        :meth:`elected` waiting on it."""
        for changed in self._leader_waiters.pop(job_id, []):
            changed.set()

    def leads(self, job: Job) -> bool:
        return job.leader == self.node.identity.peer_id

    def track(self, job: Job, members: list[str], ranking: list[str]) -> None:
        """Elect the job's leader among the plan's members: the leader first, then the standby; this device
        stands as the standby only once it holds what leading needs (:func:`leadership.own_ranking`;
        :meth:`standby_ready` tracks again when its copies are checked)."""
        if self.node.elections is None:
            return
        self._tracked[job.job_id] = (list(members), list(ranking))
        own = leadership.own_ranking(self.node.identity.peer_id, ranking, self.holds_standby_copy(job))
        try:
            self.node.elections.track(job.job_id, members, own)
        except ValueError as exc:
            log.warning("job %s: cannot track its election: %s", job.job_id, exc)

    def holds_standby_copy(self, job: Job) -> bool:
        """Whether this device is the job's standby and holds the checked copies a take-over leads from (the
        data; a LoRA job's initial weights too)."""
        holds = job.standby == self.node.identity.peer_id and job.standby_data is not None and job.plan is not None
        return holds and (not standby_copies(job.spec.model) or job.paths.weights_copy.is_file())

    def standby_ready(self, job: Job) -> None:
        """The standby's copies are checked: track the job's election again, this device now standing second."""
        tracked = self._tracked.get(job.job_id)
        if tracked is not None and self.node.elections is not None and job.job_id in self.node.elections.jobs():
            self.track(job, *tracked)

    def untrack(self, job: Job) -> None:
        """The job is over here: stop taking part in its election (no more heartbeats, votes or takeovers)."""
        self._tracked.pop(job.job_id, None)
        if self.node.elections is not None and job.job_id in self.node.elections.jobs():
            self.node.elections.untrack(job.job_id)
            log.info("job %s: %s; left its election", job.job_id, job.state)


class Lifecycle(Protocol):
    """What :meth:`JobContext.spawn` calls back into when a leader loop fails; implemented by
    :class:`arceusd.jobs.service.manager.JobManager`."""

    async def lead(self, job: Job) -> None:
        """The leader's loop for one job."""

    def feed(self, job: Job, event: events.Event) -> list[actions.Action]:
        """Hand ``job``'s core an event and carry out what it answers; the actions (for a handler's answer)."""


__all__ = ["JobContext", "Lifecycle"]
