"""A member's answers to its leader's speed challenges (the leader's side, which asks, times and judges:
:mod:`arceusd.jobs.leader.speed_checks`; the pure part: :mod:`arceusd.jobs.judging.challenges`).

The leader sends :class:`protocol.job_wire.SpeedChallenge` (ready?), :class:`protocol.job_wire.ChallengeGo` (the
seed; its clock runs until this device's :class:`protocol.job_wire.ChallengeRoot`) and
:class:`protocol.job_wire.ChallengeOpen` (the blocks to show, :class:`protocol.job_wire.ChallengeBlocks`). One
challenge at a time on this device (another is refused as busy), only from the job's leader at its term and epoch,
its request checked (:func:`challenges.check_request`); the child (:class:`ChallengeChild`) is killed once it showed
the blocks, when the seed does not come within :data:`challenges.READY_S` + :data:`challenges.REPLY_S` seconds of
being ready, or when the work and the open take longer than the ``deadline_s`` the leader said it waits (at most
:data:`challenges.MAX_WAIT_S`).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from arceusd.jobs.common.ports import Commanded, OwnOffer, Spawn
from arceusd.jobs.judging import challenges
from arceusd.jobs.procs.challenge_child import ChallengeChild, ChildError, lent_kind
from protocol.envelope import Header
from protocol.job_wire import ChallengeBlocks, ChallengeGo, ChallengeOpen, ChallengeRoot, JobAck, SpeedChallenge


@dataclass
class Pending:
    """The challenge this device is answering (one at a time)."""

    challenge: str
    job_id: str
    leader: str
    child: ChallengeChild
    deadline_s: float  # how long the leader waits for the root once it sent the seed
    scope: trio.CancelScope  # its deadline ends the challenge (the child killed)
    went: bool = False


@dataclass(frozen=True)
class SpeedAnswersPorts:
    """What :class:`SpeedAnswers` uses, built by the composition root (issue 32: a port, not the manager)."""

    spawn: Spawn
    offer: OwnOffer
    commanded: Commanded
    worker_threads: int
    """The threads a challenge's child process may use (the daemon's ``worker_threads``)."""


class SpeedAnswers:
    """This device's answers to its leaders' speed challenges (one challenge at a time)."""

    def __init__(self, ports: SpeedAnswersPorts) -> None:
        self.ports = ports
        self._pending: Pending | None = None

    async def on_challenge(self, header: Header, msg: SpeedChallenge) -> JobAck:
        job = await self.ports.commanded(header, msg.job_id)
        if isinstance(job, JobAck):
            return job
        why = challenges.check_request(msg.challenge, msg.size, msg.rounds, msg.deadline_s)
        if why:
            return JobAck(False, why)
        if self._pending is not None:
            return JobAck(False, "busy with another challenge")
        try:
            child = await ChallengeChild.start(
                msg.size, msg.rounds, self.ports.worker_threads, await lent_kind(self.ports.offer)
            )
        except (ChildError, OSError) as exc:
            return JobAck(False, f"cannot run the challenge: {exc}"[:200])
        if self._pending is not None:  # another took the place while this one loaded
            await child.close()
            return JobAck(False, "busy with another challenge")
        pending = Pending(
            msg.challenge,
            msg.job_id,
            header.sender,
            child,
            msg.deadline_s,
            trio.CancelScope(deadline=trio.current_time() + challenges.READY_S + challenges.REPLY_S),
        )
        self._pending = pending
        self.ports.spawn(self._expire, pending)
        return JobAck(True)

    async def _expire(self, pending: Pending) -> None:
        """End ``pending`` when its scope's deadline passes (the seed did not come; the work or the open took
        longer than the leader said it would wait)."""
        with pending.scope:
            await trio.sleep_forever()
        await self._end(pending)

    async def _end(self, pending: Pending) -> None:
        if self._pending is pending:
            self._pending = None
        pending.scope.cancel()
        await pending.child.close()

    def _current(self, header: Header, job_id: str, challenge: str) -> Pending | None:
        pending = self._pending
        if pending is None or pending.challenge != challenge or pending.job_id != job_id:
            return None
        return pending if pending.leader == header.sender else None

    async def on_go(self, header: Header, msg: ChallengeGo) -> ChallengeRoot | JobAck:
        pending = self._current(header, msg.job_id, msg.challenge)
        if pending is None or pending.went:
            return JobAck(False, "no such challenge waiting for its seed")
        why = challenges.check_seed(msg.seed)
        if why:
            await self._end(pending)
            return JobAck(False, why)
        pending.went = True
        # the work, then the open
        pending.scope.deadline = trio.current_time() + 2 * pending.deadline_s + challenges.REPLY_S
        try:
            await pending.child.say({"seed": msg.seed})
            root = str((await pending.child.expect("root", pending.deadline_s))["root"])
        except ChildError as exc:
            await self._end(pending)
            return JobAck(False, str(exc))
        return ChallengeRoot(msg.challenge, root[:64])

    async def on_open(self, header: Header, msg: ChallengeOpen) -> ChallengeBlocks | JobAck:
        pending = self._current(header, msg.job_id, msg.challenge)
        if pending is None or not pending.went:
            return JobAck(False, "no such challenge answered")
        try:
            await pending.child.say({"open": list(msg.leaves)})
            shown = await pending.child.expect("blocks", challenges.REPLY_S + pending.deadline_s)
            blocks = tuple(bytes.fromhex(str(b)) for b in shown["blocks"])
            proofs = tuple(b"".join(bytes.fromhex(str(h)) for h in p) for p in shown["proofs"])
        except (ChildError, ValueError, TypeError, KeyError) as exc:
            return JobAck(False, f"cannot show the blocks: {exc}"[:200])
        finally:
            await self._end(pending)
        return ChallengeBlocks(msg.challenge, blocks, proofs)


__all__ = ["SpeedAnswers", "SpeedAnswersPorts"]
