"""The joining device's side of a job's announcements and joins: an owner's announcement taken (a stranger's is
bounded and validated before anything of it is kept: :class:`arceusd.network.announce_guard.AnnounceGuard`), a
join asked for by hand (``arceusd join``) or automatically (this device's lending policy and the job's needs decide
first, :mod:`arceusd.market`), and the join request itself, which the owner's hand-over uses too. The leader's
side (the owner's announcements, its answer to a join, the hand-over): :mod:`arceusd.jobs.leader.joining`.

A member's answer to its returning owner's announce names the peer it follows (``JobAck.follows``), which the owner
hands the job over to.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from arceusd.base.control import RequestError
from arceusd.jobs.common.ports import Feed, JoinResult, OwnOffer, Spawn
from arceusd.jobs.core import JobState, Role, events
from arceusd.jobs.member.joins_in_flight import JoinsInFlight
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.jobs.record.job import TERMINAL, Job
from arceusd.jobs.spec.schema import JobSpecError, spec_from_dict, spec_hash
from arceusd.membership.events import MemberState
from arceusd.network.announce_guard import AnnounceGuard, address_host
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.errors import RemoteProtocolError
from protocol.job_wire import JobAck
from protocol.messages import Address, JobAnnounce, JoinReply, JoinRequest
from protocol.validation import member_ids

log = logging.getLogger(__name__)

AUTO_JOIN_ATTEMPTS = 8
"""How many times an auto-join asks (backing off 0.5 s to 4 s: about 20 s in all)."""


@dataclass(frozen=True)
class JoinerPorts:
    """What :class:`Joiner` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: dict[str, Job]
    """The jobs this daemon holds, by id (an announced job is added here, a stale one evicted)."""
    root: Path
    """This daemon's jobs folder (an announced job's folder is in it)."""
    auto_join: bool
    """Whether this device joins announced jobs on its own (the daemon's ``auto_join``)."""
    feed: Feed
    spawn: Spawn
    offer: OwnOffer
    peers: PeerService
    """The peer network (joins asked for; who is a member, at which address)."""
    may_auto_join: Callable[[Job], Awaitable[bool]]
    """This device's lending policy on an announced job (``arceusd.market.hooks``)."""
    joins: JoinsInFlight
    """This device's joins not yet settled (a start that overtakes a join's answer waits for it)."""


class Joiner:
    """Announcements taken and joins asked for (see the module docstring)."""

    def __init__(self, ports: JoinerPorts) -> None:
        self.ports = ports
        self.announced = AnnounceGuard()  # bounds and validates what strangers announce

    async def request_join(self, job: Job, leader: str, address: str) -> JoinReply | None:
        offer = await self.ports.offer()
        host, _, port = offer.address.rpartition(":")
        request = JoinRequest(
            job.job_id,
            self.ports.me,
            Address(host, int(port)),
            offer.memory_bytes,
            offer.flops_per_s,
            offer.block_efficiency,
            offer.dispatch_s,
            offer.adamw_s_per_param,
            offer.sgd_s_per_param,
            offer.message_s,
            offer.kind,
        )
        reply = await self.ports.peers.request(address, leader, request, timeout=10.0, job_id=job.job_id)
        if not isinstance(reply, JoinReply):
            return None
        if reply.accepted:  # the job's members as the leader holds them: what this device shows as its members
            try:
                job.told_members = member_ids(reply.members)
            except RemoteProtocolError as exc:
                log.warning("job %s: the leader's list of members is not usable: %s", job.job_id, exc)
        return reply

    async def on_announce(self, header: Header, msg: JobAnnounce) -> JobAck:
        refused = self.announced.admit(header.sender, msg, known=msg.job_id in self.ports.jobs, now=time.monotonic())
        if refused is not None:
            return JobAck(False, refused)
        if header.sender != msg.owner:
            return JobAck(False, "an announcement must come from the job's owner")
        known = self.ports.jobs.get(msg.job_id)
        if known is not None:
            if known.role == Role.MEMBER and known.leader != msg.owner:
                # the owner is back after its standby took over: it joins the leader we follow
                return JobAck(False, f"this device follows {known.leader[:12]}", follows=known.leader)
            if known.role == Role.MEMBER and known.state not in TERMINAL:
                self.ports.spawn(self.auto_join, known)  # the owner lost us (we were declared dead): join again
            return JobAck(True)
        try:
            spec = spec_from_dict(json.loads(msg.spec))
        except (JobSpecError, ValueError) as exc:
            log.warning("ignoring job %s: bad spec: %s", msg.job_id, exc)
            return JobAck(False, self.announced.refuse("bad_spec"))
        if spec_hash(spec) != msg.spec_hash.hex():
            return JobAck(False, self.announced.refuse("spec_hash_mismatch"))
        member = self.ports.peers.membership.members.get(msg.owner)
        owner_address = member.address if member is not None else ""
        job = Job.announced(
            msg.job_id,
            spec,
            msg.spec,
            msg.spec_hash.hex(),
            msg.owner,
            owner_address,
            self.ports.me,
            self.ports.root,
        )
        self.ports.jobs[msg.job_id] = job
        # fair shares of the table: an owner in our membership (it answers our probes there) before a key
        # that only said hello, then by its address host and key (arceusd.network.announce_guard)
        trusted = member is not None and member.state in (MemberState.ALIVE, MemberState.SUSPECT)
        for old in self.announced.added(msg.job_id, msg.owner, member=trusted, host=address_host(owner_address)):
            stale = self.ports.jobs.get(old)
            if stale is not None and stale.role == Role.SEEN and stale.state == JobState.ANNOUNCED:
                del self.ports.jobs[old]
        if msg.job_id not in self.ports.jobs:
            return JobAck(False, "announce_evicted")  # the table is full of jobs with a better claim to it
        log.info("job %s (%s) announced by %s", msg.job_id, spec.name, msg.owner[:12])
        if self.ports.auto_join:
            self.ports.spawn(self.auto_join, job)
        return JobAck(True)

    async def auto_join(self, job: Job) -> None:
        """Join an announced job; an owner that does not answer yet (e.g. still restoring its jobs after a
        restart), or refuses for now (``JoinReply.retry``), is asked again a few times, backing off. The device's
        policy and the job's needs decide first (``arceusd.market``)."""
        if not await self.ports.may_auto_join(job):
            return
        for attempt in range(AUTO_JOIN_ATTEMPTS):
            try:
                result = await self.join(job)
                log.info("auto-join %s: %s", job.job_id, result)
                if result["accepted"] or not result.get("retry"):
                    return
            except RequestError as exc:
                log.warning("auto-join %s failed (attempt %d): %s", job.job_id, attempt + 1, exc)
            # (a leader that held this device dead refuses until its membership sees it alive again: a loaded
            # device's false death, then a join that gave up at once, left a job waiting for a member forever)
            await trio.sleep(min(4.0, 0.5 * 2**attempt))

    async def join(self, job: Job) -> JoinResult:
        if job.role == Role.OWNER:
            return JoinResult(job_id=job.job_id, accepted=True, reason="this device owns the job")
        member = self.ports.peers.membership.members.get(job.leader)
        if member is not None and member.address:
            job.leader_address = member.address
            if job.leader == job.owner:
                job.owner_address = member.address
        with self.ports.joins.asking(job.job_id):  # a start that overtakes the answer waits for it (JoinsInFlight)
            reply = await self.request_join(job, job.leader, job.leader_address)
            if reply is None:
                raise RequestError(f"the job's leader {job.leader[:12]} did not answer")
            if reply.accepted:
                self.ports.feed(job, events.Joined())
        if reply.accepted:
            self.ports.spawn(warm_starts().warm_up, job.spec.model)  # torch imported before any start (issue 33)
        return JoinResult(job_id=job.job_id, accepted=reply.accepted, reason=reply.reason, retry=reply.retry)


__all__ = ["AUTO_JOIN_ATTEMPTS", "Joiner", "JoinerPorts"]
