"""The leader's (and owner's) side of announcing jobs and joining them: the owner's announcements, the leader's
answer to a join request, and an owner's hand-over to the leader its members follow after its standby took over (it
joins that leader as a member does). The joining device's side (an announcement taken, a join asked for, by hand or
automatically): :mod:`arceusd.jobs.member.join`.

A join request is checked against the job's admission, the offer's physical bounds, the job's needs and budget
(:mod:`arceusd.market`), and excluded members are not let back in. A leader's answer to a join of a finished job
says ``done`` (what a returning owner learns the end from); a member's answer to its returning owner's announce
names the peer it follows (``follows``): both typed fields.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from arceusd.jobs.common.ports import Feed, Leads
from arceusd.jobs.core import JobState, Role, events, leadership
from arceusd.jobs.judging.claims import check_offer_bounds
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.record.job import TERMINAL, Job
from arceusd.market.hooks import enough_memory
from arceusd.membership.events import MemberState
from arceusd.network.peers import PeerService
from protocol.envelope import Header
from protocol.job_wire import JOB_MEMBERS_MAX, JobAck
from protocol.messages import JobAnnounce, JoinReply, JoinRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoiningPorts:
    """What :class:`Joining` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    jobs: Mapping[str, Job]
    """The jobs this daemon holds, by id."""
    feed: Feed
    leads: Leads
    follow_leader: Callable[[Job, str], None]
    """Take the job's commands from that peer."""
    peers: PeerService
    """The peer network (announces, the hand-over; who is a member)."""
    join_refusal: Callable[[Job, Offer], Awaitable[str | None]]
    """The job's needs and budget against a joining offer; a reason to refuse it (``arceusd.market.hooks``)."""
    request_join: Callable[[Job, str, str], Awaitable[JoinReply | None]]
    """Ask that leader (at that address) to take this device in; its answer, None when none came
    (``Joiner.request_join``: the owner's hand-over joins the new leader as a member does)."""


class Joining:
    """The owner's announcements and hand-over, and the leader's answer to a join (see the module docstring)."""

    def __init__(self, ports: JoiningPorts) -> None:
        self.ports = ports

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
            reply = await self.ports.request_join(job, leader, member.address)
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


__all__ = ["Joining", "JoiningPorts"]
