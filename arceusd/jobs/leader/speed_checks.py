"""The leader's speed challenges of a job's devices, over the wire and in child processes (the pure part:
:mod:`arceusd.jobs.judging.challenges`).

The leader's side (:meth:`SpeedChecks.on_step`, :meth:`SpeedChecks.judge`): once the job runs at least
:data:`arceusd.jobs.judging.claims.MIN_EXCESS_S` a step slower than its plan said (the leader's own step times, on its
own clock, over :data:`FIRST_STEPS` steps), or a plan device offers more than the market pays an unmeasured
device for (``arceusd.market.hooks.wants_timing``: it is paid what it measured), the leader times every device
of the plan once per job, one at a time: itself first (the baseline of how much slower than their offers devices
run beside the job), then the members doing the most of the plan's work (a later plan's new devices in a round
of their own). A member:
:class:`protocol.job_wire.SpeedChallenge` (ready?), :class:`protocol.job_wire.ChallengeGo` (the seed; the clock
runs until its :class:`protocol.job_wire.ChallengeRoot`), :class:`protocol.job_wire.ChallengeOpen` (blocks drawn
at random; their proofs are checked here and their digests recomputed in a child process). A member that
refuses, or does not answer, is asked once more after the others (:data:`REFUSED_RETRY_S`); a second refusal
counts as a failed challenge, a second silence as no result (a gone member is membership's business). At the
next checkpoint a member whose challenge ran far slower than its offer, against the others, or failed, is
discounted and planned again (:func:`challenges.challenge_factor`), like a member caught by its step times;
``speed_checks`` in ``arceusd status JOB`` shows every result.

The member's side, its answers: :mod:`arceusd.jobs.member.speed_answers`; the challenge's child, which both
sides run: :mod:`arceusd.jobs.procs.challenge_child`.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

import trio

from arceusd.jobs.common.ports import Leads, OwnOffer, Spawn
from arceusd.jobs.judging import challenges, claims
from arceusd.jobs.judging.challenges import Timed
from arceusd.jobs.procs.challenge_child import ChallengeChild, ChildError, check_blocks_in_child, lent_kind
from arceusd.jobs.record.job import Job
from arceusd.network.peers import PeerService
from protocol.job_wire import (
    CHALLENGE_BLOCK_MAX,
    ChallengeBlocks,
    ChallengeGo,
    ChallengeOpen,
    ChallengeRoot,
    JobAck,
    SpeedChallenge,
)

log = logging.getLogger(__name__)


class Stamped(TypedDict):
    """The job and plan stamp a leader's request to a member carries (:meth:`PeerService.request`'s keywords)."""

    job_id: str
    term: int
    epoch: int


FIRST_STEPS = 5
"""The leader's own steps it looks at before deciding the job runs slow."""
VERIFY_S = 60.0
"""How long the leader's own check of opened blocks may take."""
REFUSED_RETRY_S = 5.0
"""A member that refused its challenge (or did not answer) is asked once more this long after the others."""
REFUSED = "refused the challenge"


async def check_blocks(size: int, rounds: int, seed: str, leaves: tuple[int, ...], blocks: list[bytes]) -> float:
    """The largest relative error of the opened ``blocks`` against this device's own products (a child)."""
    request = (
        json.dumps(
            {"size": size, "rounds": rounds, "seed": seed, "open": list(leaves), "blocks": [b.hex() for b in blocks]}
        ).encode()
        + b"\n"
    )
    with trio.move_on_after(VERIFY_S):
        code, out, err = await check_blocks_in_child(request)
        if code == 0:
            try:
                return float(json.loads(out.decode().strip().splitlines()[-1])["error"])
            except (ValueError, KeyError, IndexError):
                pass
        log.warning("checking a speed challenge failed: %s", err.decode(errors="replace")[-300:])
    return math.nan


@dataclass(frozen=True)
class SpeedCheckPorts:
    """What :class:`SpeedChecks` uses, built by the composition root (issue 32: a port, not the manager)."""

    me: str
    """This device's peer id."""
    leads: Leads
    spawn: Spawn
    offer: OwnOffer
    peers: PeerService
    """The peer network (challenges sent, and their seeds and openings)."""
    worker_threads: int
    """The threads a challenge's child process may use (the daemon's ``worker_threads``)."""
    wants_timing: Callable[[Job], bool]
    """Whether the market wants the job's untimed devices timed now (``arceusd.market.hooks.wants_timing``)."""


class SpeedChecks:
    """The leader's timed challenges of a job's devices (a member's answers:
    :mod:`arceusd.jobs.member.speed_answers`)."""

    def __init__(self, ports: SpeedCheckPorts) -> None:
        self.ports = ports

    def on_step(self, job: Job) -> None:
        """The leader's own worker ran a step: once the job runs slow, time the devices of its plan not timed
        yet (each once per job: the first plan's, then any that a later plan brings in)."""
        if job.leading.speed.challenging or job.plan is None or not self.ports.leads(job):
            return
        if len(job.stage_times) < FIRST_STEPS:
            return
        untimed = [p for p in job.plan_peers() if p not in job.leading.speed.challenged and p in job.members]
        total = claims.own_step_total(job)
        slow = total is not None and total - job.plan.predicted_step_time_s >= claims.MIN_EXCESS_S
        if not untimed or not (slow or self.ports.wants_timing(job)):  # the market pays what it measured
            return
        job.leading.speed.challenging = True
        log.info(
            "job %s: running %.2f s a step against %.2f s planned; timing %d device(s)",
            job.job_id,
            total or 0.0,
            job.plan.predicted_step_time_s,
            len(untimed),
        )
        self.ports.spawn(self.challenge_all, job, untimed)

    async def challenge_all(self, job: Job, peers: list[str]) -> None:
        """Time ``peers``, one at a time: this device first (the baseline), then the members doing the most
        work; once each."""
        try:
            await self._challenge_all(job, peers)
        finally:
            job.leading.speed.challenging = False

    async def _challenge_all(self, job: Job, peers: list[str]) -> None:
        me = self.ports.me
        if job.plan is None:
            return
        job.leading.speed.challenged.update(peers)
        work = {sh.peer_id: (st.end - st.start) / len(st.shares) for st in job.plan.stages for sh in st.shares}
        members = sorted(
            (p for p in peers if p != me), key=lambda p: (-work.get(p, 0.0), -job.members[p].flops_per_s, p)
        )
        refused: list[str] = []
        for peer in [me, *members] if me in peers else members:
            if not self._still_leading(job):
                return
            await self._time_and_keep(job, peer, refused)
        if refused:  # asked again once, a while later (a replan or a busy device may have been the reason)
            await trio.sleep(REFUSED_RETRY_S)
            for peer in refused:
                if not self._still_leading(job) or peer not in job.plan_peers():
                    return
                await self._time_and_keep(job, peer, None)

    def _still_leading(self, job: Job) -> bool:
        return job.state.value not in ("done", "failed", "cancelled") and self.ports.leads(job)

    async def _time_and_keep(self, job: Job, peer: str, refused: list[str] | None) -> None:
        """Time ``peer`` and keep the result (a first refusal or no answer is put in ``refused`` to ask again;
        with ``refused`` None, a refusal counts as a failed challenge, no answer as no result)."""
        me = self.ports.me
        timed = await self._time(job, peer)
        if timed is None or (timed.why.startswith(REFUSED) and refused is not None):
            if refused is not None:
                refused.append(peer)
            return
        if "busy with another challenge" in timed.why:
            return  # another job's leader is timing it: not a refusal of this one
        job.leading.speed.timed[peer] = timed
        factor = challenges.challenge_factor(job.leading.speed.timed, peer) if peer != me else None
        if factor is not None and timed.why == "" and challenges.worth_confirming(factor):
            again = await self._time(job, peer)  # one hiccup is not a lie: the faster of two counts
            if again is not None and not again.why and again.seconds < timed.seconds:
                job.leading.speed.timed[peer] = again
        kept = job.leading.speed.timed[peer]
        log.info(
            "job %s: %s ran its speed challenge %.1fx slower than its offer%s",
            job.job_id,
            peer[:12],
            kept.slowdown,
            f" ({kept.why})" if kept.why else "",
        )

    async def _time(self, job: Job, peer: str) -> Timed | None:
        offer = job.members.get(peer)
        if offer is None:
            return None
        size, rounds = challenges.challenge_size(offer.flops_per_s)
        work = challenges.challenge_flops(size, rounds)
        if peer == self.ports.me:
            return await self._time_self(offer.flops_per_s, size, rounds)
        wait = challenges.wait_for(offer.flops_per_s, size, rounds)
        challenge = secrets.token_hex(challenges.CHALLENGE_ID_LEN // 2)
        kw = Stamped(job_id=job.job_id, term=job.term, epoch=job.epoch)
        ready = await self.ports.peers.request(
            offer.address,
            peer,
            SpeedChallenge(job.job_id, challenge, size, rounds, wait),
            challenges.READY_S + challenges.REPLY_S,
            **kw,
        )
        if not isinstance(ready, JobAck):
            return None  # gone or unreachable: membership deals with that, not this
        if not ready.ok:
            return Timed(offer.flops_per_s, work, wait, f"{REFUSED}: {ready.reason[:100]}")
        seed = challenges.new_seed()
        began = time.monotonic()
        root = await self.ports.peers.request(offer.address, peer, ChallengeGo(job.job_id, challenge, seed), wait, **kw)
        seconds = time.monotonic() - began
        if not isinstance(root, ChallengeRoot) or root.challenge != challenge or len(root.root) != 64:
            return Timed(offer.flops_per_s, work, max(seconds, wait))  # no answer in time: it ran at most this fast
        leaves = challenges.blocks_to_open(size, rounds)
        shown = await self.ports.peers.request(
            offer.address, peer, ChallengeOpen(job.job_id, challenge, leaves), challenges.REPLY_S + wait, **kw
        )
        why = await self._check_shown(shown, challenge, size, rounds, seed, leaves, root.root)
        if why is None:
            return None  # this device could not check the blocks: an unchecked time proves nothing
        return Timed(offer.flops_per_s, work, seconds, why)

    async def _check_shown(
        self, shown: object, challenge: str, size: int, rounds: int, seed: str, leaves: tuple[int, ...], root_hex: str
    ) -> str | None:
        """Why the member's opened blocks fail (wrong proofs or values), ``""`` when they hold, None when this
        device could not check them."""
        if not isinstance(shown, ChallengeBlocks) or shown.challenge != challenge:
            return "did not show the blocks asked for"
        if len(shown.blocks) != len(leaves) or len(shown.proofs) != len(leaves):
            return "showed another number of blocks"
        try:
            root = bytes.fromhex(root_hex)
        except ValueError:
            return "its root is not hex"
        count = challenges.leaf_count(size, rounds)
        for leaf, data, proof in zip(leaves, shown.blocks, shown.proofs, strict=True):
            if len(data) != CHALLENGE_BLOCK_MAX or len(proof) % 32 or len(proof) > 32 * 64:
                return "a block or proof has the wrong length"
            hashes = [proof[i : i + 32] for i in range(0, len(proof), 32)]
            if not challenges.verify_proof(challenges.leaf_hash(data), leaf, count, hashes, root):
                return f"block {leaf} is not the one its root committed to"
        error = await check_blocks(size, rounds, seed, leaves, list(shown.blocks))
        if math.isnan(error):
            return None
        if error > challenges.TOLERANCE:
            return f"its blocks are wrong (relative error {error:.2g})"
        return ""

    async def _time_self(self, offered: float, size: int, rounds: int) -> Timed | None:
        """This device's own challenge, timed alike (the baseline)."""
        try:
            child = await ChallengeChild.start(
                size, rounds, self.ports.worker_threads, await lent_kind(self.ports.offer)
            )
        except (ChildError, OSError) as exc:
            log.warning("cannot time this device: %s", exc)
            return None
        try:
            began = time.monotonic()
            await child.say({"seed": challenges.new_seed()})
            await child.expect("root", challenges.MAX_WAIT_S)
            return Timed(offered, challenges.challenge_flops(size, rounds), time.monotonic() - began)
        except ChildError as exc:
            log.warning("cannot time this device: %s", exc)
            return None
        finally:
            await child.close()

    def judge(self, job: Job) -> list[str]:
        """At a checkpoint: discount every member whose challenge ran far slower than its offer (once per member
        and job); the restart reasons."""
        me = self.ports.me
        reasons = []
        for peer in sorted(job.leading.speed.timed):
            if peer == me or peer in job.leading.speed.discounts or peer not in job.plan_peers():
                continue
            factor = challenges.challenge_factor(job.leading.speed.timed, peer)
            if factor is None:
                continue
            job.leading.speed.discounts[peer] = factor
            why = job.leading.speed.timed[peer].why
            log.warning(
                "job %s: %s ran its speed challenge %.1fx slower than its offer%s; planning again at its "
                "measured speed",
                job.job_id,
                peer[:12],
                factor,
                f" ({why})" if why else "",
            )
            reasons.append(
                f"member {peer[:12]} ran {factor:.1f}x slower than its offer in the leader's timed "
                f"speed challenge{f' ({why})' if why else ''}; planning again at its measured speed"
            )
        return reasons
