"""Announcing jobs and joining them: the owner's announcements, a device's join (by hand or automatically), the
leader's answer to a join request, and an owner's hand-over to the leader its members follow after its standby
took over.

An announcement from a stranger is bounded and validated before anything of it is kept
(:class:`arceusd.network.announce_guard.AnnounceGuard`); a join request is checked against the job's admission, the
offer's physical bounds, the job's needs and budget (:mod:`arceusd.market`), and excluded members are not let
back in. A leader's answer to a join of a finished job says ``done`` (what a returning owner learns the end from);
a member's answer to its returning owner's announce names the peer it follows (``follows``): both typed fields.
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
from arceusd.jobs.common.ports import Feed, JoinResult, Leads, OwnOffer, Spawn
from arceusd.jobs.core import JobState, Role, events, leadership
from arceusd.jobs.judging.claims import check_offer_bounds
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.jobs.record.job import TERMINAL, Job
from arceusd.jobs.spec.schema import JobSpecError, spec_from_dict, spec_hash
from arceusd.market.hooks import enough_memory
from arceusd.membership.events import MemberState
from arceusd.network.announce_guard import AnnounceGuard, address_host
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.errors import RemoteProtocolError
from protocol.job_wire import JOB_MEMBERS_MAX, JobAck
from protocol.messages import Address, JobAnnounce, JoinReply, JoinRequest
from protocol.validation import member_ids

log = logging.getLogger(__name__)

AUTO_JOIN_ATTEMPTS = 8
"""How many times an auto-join asks (backing off 0.5 s to 4 s: about 20 s in all)."""


@dataclass(frozen=True)
class JoiningPorts:
    """What :class:`Joining` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: dict[str, Job]
    """The jobs this daemon holds, by id (an announced job is added here, a stale one evicted)."""
    root: Path
    """This daemon's jobs folder (an announced job's folder is in it)."""
    auto_join: bool
    """Whether this device joins announced jobs on its own (the daemon's ``auto_join``)."""
    feed: Feed
    leads: Leads
    spawn: Spawn
    offer: OwnOffer
    follow_leader: Callable[[Job, str], None]
    """Take the job's commands from that peer."""
    peers: PeerService
    """The peer network (announces, joins, the hand-over; who is a member)."""
    join_refusal: Callable[[Job, Offer], Awaitable[str | None]]
    """The job's needs and budget against a joining offer; a reason to refuse it (``arceusd.market.hooks``)."""
    may_auto_join: Callable[[Job], Awaitable[bool]]
    """This device's lending policy on an announced job (``arceusd.market.hooks``)."""


class Joining:
    """Announcements, joins and the owner's hand-over (see the module docstring)."""

    def __init__(self, ports: JoiningPorts) -> None:
        self.ports = ports
        self.announced = AnnounceGuard()  # bounds and validates what strangers announce

    async def announce(self, job: Job, peer: str, address: str) -> None:
        msg = JobAnnounce(job.job_id, job.owner, bytes.fromhex(job.spec_hash), job.spec_bytes)
        reply = await self.ports.peers.request(address, peer, msg, timeout=10.0, job_id=job.job_id)
        leader = leadership.followed_leader(reply.follows) if isinstance(reply, JobAck) and not reply.ok else None
        if leader is not None:
            self.ports.feed(job, events.FollowsOther(leader, peer))  # a majority saying so: the owner hands over

    async def hand_over(self, job: Job, leader: str) -> None:
        """Owner, back after its standby took the job over: ask that leader to take this device in as a member
        (its signed answer confirms it leads). A finished job is recorded as finished there."""
        me = self.ports.me
        async with job.sync_lock:
            if not self.ports.leads(job) or job.role != Role.OWNER or leader == me or job.state in TERMINAL:
                return
            lead = job.core.lead
            known = set(job.plan_peers()) | set(job.members) | (set(lead.expected) if lead is not None else set())
            if leader not in known:  # only a device that was in the job can have been elected to lead it
                log.warning(
                    "job %s: a peer says %s leads it, who was never a member; not handing over", job.job_id, leader[:12]
                )
                self.ports.feed(job, events.HandOverAnswered(leader, False))
                return
            member = self.ports.peers.membership.members.get(leader)
            if member is None or not member.address:
                log.warning("job %s: a member says %s leads it, who is not a live peer here", job.job_id, leader[:12])
                self.ports.feed(job, events.HandOverAnswered(leader, False))
                return
            reply = await self.request_join(job, leader, member.address)
            accepted, done = reply is not None and reply.accepted, reply is not None and reply.done
            if not (accepted or done):
                log.warning(
                    "job %s: %s leads it and did not take this device in: %s",
                    job.job_id,
                    leader[:12],
                    reply.reason if reply is not None else "no answer",
                )
            # The core follows the leader with a stamp of (0, 0): terms and epochs count the leader's commands;
            # ours (raised by our own repartitions while we still thought we led) say nothing about its.
            self.ports.feed(job, events.HandOverAnswered(leader, accepted, done))
            if accepted or done:
                self.ports.follow_leader(job, leader)
                job.plan, job.replica_plan, job.leading.commits.reports = None, None, {}
                job.leading.commits.witnesses, job.leading.commits.complete = {}, {}
                job.leading.commits.outer_witnesses = {}
                log.info("job %s: %s", job.job_id, job.error)
            job.poke()

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

    async def on_join_request(self, header: Header, msg: JoinRequest) -> JoinReply:
        job = self.ports.jobs.get(msg.job_id)
        if job is None or not self.ports.leads(job):
            return JoinReply(msg.job_id, False, "this device does not lead that job")
        if header.sender != msg.peer_id:
            return JoinReply(msg.job_id, False, "a join must come from the joining device itself")
        if not job.spec.admission.admits(msg.peer_id):
            log.info("job %s: refused %s (not admitted)", job.job_id, msg.peer_id)
            return JoinReply(msg.job_id, False, "not admitted by the job's owner")
        if job.state in TERMINAL:
            return JoinReply(msg.job_id, False, f"the job is {job.state.value}", done=job.state == JobState.DONE)
        held = self.ports.peers.membership.members.get(msg.peer_id)
        if held is not None and held.state in (MemberState.DEAD, MemberState.LEFT):
            # a join sent before it died and delivered after the leader dropped it would bring it back as a new
            # member (a rebalance at the next checkpoint, onto a device that is gone)
            return JoinReply(
                msg.job_id,
                False,
                f"this leader holds the device {held.state.value}; it joins again once membership sees it alive",
                retry=True,
            )
        if msg.flops_per_s <= 0 or msg.free_memory_bytes <= 0:
            return JoinReply(msg.job_id, False, "the offer must have positive speed and memory")
        why = check_offer_bounds(msg.free_memory_bytes, msg.flops_per_s) or job.leading.checks.excluded.get(msg.peer_id)
        if why:  # a physically implausible offer, or a member excluded for a bad report (issue #19)
            return JoinReply(msg.job_id, False, f"refused: {why}")
        offer = Offer(
            msg.peer_id,
            f"{msg.address.host}:{msg.address.port}",
            msg.flops_per_s,
            msg.free_memory_bytes,
            msg.kind,
            msg.block_efficiency,
            msg.dispatch_s,
            msg.adamw_s_per_param,
            msg.sgd_s_per_param,
            msg.message_s,
        )
        try:
            offer.check()
        except ValueError as exc:
            return JoinReply(msg.job_id, False, f"the offer is not usable: {exc}")
        refused = await self.ports.join_refusal(job, offer)  # the job's needs and budget (arceusd.market)
        if refused is not None:
            return JoinReply(msg.job_id, False, refused[:1000])
        new = msg.peer_id not in job.members
        if new and len(job.members) >= JOB_MEMBERS_MAX:
            return JoinReply(msg.job_id, False, f"the job has {len(job.members)} members, the most a job holds")
        job.offers[msg.peer_id] = offer  # (a member once the core takes it in)
        if new:
            log.info("job %s: %s joined (%d members)", job.job_id, msg.peer_id[:12], len(job.members) + 1)
        # a running job rebalances at its next checkpoint; a waiting one plans once the members lend the memory
        self.ports.feed(job, events.MemberJoined(msg.peer_id, enough_memory(job, offer)))  # needs.memory_total_mib
        if not job.core.is_member(msg.peer_id):  # the core did not take it in (the job ended meanwhile)
            job.offers.pop(msg.peer_id, None)
        if new:
            job.poke()
        return JoinReply(msg.job_id, True, "", tuple(sorted(job.members)))

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
        reply = await self.request_join(job, job.leader, job.leader_address)
        if reply is None:
            raise RequestError(f"the job's leader {job.leader[:12]} did not answer")
        if reply.accepted:
            self.ports.feed(job, events.Joined())
            self.ports.spawn(warm_starts().warm_up, job.spec.model)  # torch imported before any start (issue 33)
        return JoinResult(job_id=job.job_id, accepted=reply.accepted, reason=reply.reason, retry=reply.retry)


__all__ = ["Joining"]
