"""The speed challenge's solving child (``python -m arceusd.worker.speed_challenge solve``), the daemon's side of it:
started, fed JSON lines, read, killed. Both sides of a challenge run one: the member to answer its leader
(:mod:`arceusd.jobs.member.speed_answers`), the leader to time itself, the baseline
(:mod:`arceusd.jobs.leader.speed_checks`). The pure part: :mod:`arceusd.jobs.judging.challenges`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from arceusd.base.control import RequestError
from arceusd.jobs.judging import challenges
from arceusd.jobs.plans.planning import Offer
from arceusd.jobs.procs.warm_starts import ChildProcess, warm_starts

MODULE = "arceusd.worker.speed_challenge"

MAX_LINE = 1 << 20
"""The longest line a challenge child may print (at most 16 opened blocks of 64 bytes and their proofs, in hex)."""


class ChildError(Exception):
    """A challenge child failed, printed something unexpected, or took too long."""


class ChallengeChild:
    """A ``python -m arceusd.worker.speed_challenge solve`` child: JSON lines in and out."""

    def __init__(self, process: ChildProcess) -> None:
        self.process = process
        self._buffer = bytearray()

    @classmethod
    async def start(cls, size: int, rounds: int, threads: int, kind: str) -> ChallengeChild:
        """The child, solving on ``kind`` (the kind of the offer this device lends: what a job would run on); forked
        from the daemon's fork server (torch imported already: ready in milliseconds, where a cold start's import
        took over :data:`challenges.READY_S` on a loaded machine), else started cold."""
        command = ["solve", str(size), str(rounds), str(threads), kind]
        child = cls(await warm_starts().spawn(MODULE, command, Path(os.devnull)))
        try:
            await child.expect("ready", challenges.READY_S)
        except BaseException:
            await child.close()
            raise
        return child

    async def say(self, obj: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            await self.process.stdin.send_all(json.dumps(obj).encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ChildError("the challenge child is gone") from exc

    async def expect(self, key: str, timeout: float) -> dict[str, Any]:
        """The child's next line (a JSON object that has ``key``), within ``timeout`` seconds."""
        assert self.process.stdout is not None
        with trio.move_on_after(timeout) as scope:
            while b"\n" not in self._buffer:
                chunk = await self.process.stdout.receive_some(1 << 20)
                if not chunk:
                    raise ChildError("the challenge child exited")
                self._buffer += chunk
                if len(self._buffer) > MAX_LINE:
                    raise ChildError("the challenge child printed too long a line")
        if scope.cancelled_caught:
            raise ChildError(f"the challenge child did not answer {key!r} within {timeout:.0f} s")
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            got = json.loads(line)
        except ValueError as exc:
            raise ChildError("the challenge child printed something that is not JSON") from exc
        if not isinstance(got, dict) or key not in got:
            raise ChildError(f"the challenge child did not say {key!r}")
        return got

    async def close(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()


async def lent_kind(offer: Callable[[], Awaitable[Offer]]) -> str:
    """The device kind this daemon lends (its measured offer's, cached since it joined or led the job): a
    challenge is solved where this device's jobs run, not on a GPU its ``devices`` key keeps them off."""
    try:
        return (await offer()).kind
    except RequestError as exc:
        raise ChildError(f"this device is not measured: {exc}") from exc


async def check_blocks_in_child(request: bytes) -> tuple[int, bytes, bytes]:
    """``python -m arceusd.worker.speed_challenge verify`` on ``request`` (warm where it can be): exit code, stdout,
    stderr."""
    return await warm_starts().run(MODULE, ["verify"], request)


__all__ = ["MAX_LINE", "MODULE", "ChallengeChild", "ChildError", "check_blocks_in_child", "lent_kind"]
