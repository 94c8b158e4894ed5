"""Who may command a job, and what a leader does when its members follow someone else (pure: no I/O, no clock).

Owns the member's verdict on a leader command (:func:`judge_command`), the refusal that names the leader a
member follows (:func:`refusal`, parsed back by :func:`followed_leader`), and the leader's decision after a
round of start commands (:func:`start_outcome`). :class:`arceusd.jobs.manager.JobManager` feeds them what it
knows and carries the result out.

Why refusals name the leader: membership may declare a live owner dead (a daemon stalled for a second under
load is enough with the ``local`` timings). Its standby then wins a newer election term with the other member
and takes the job over, and re-tracks the job's election without the owner, so the owner's election messages no
longer reach anyone and it never learns who leads. Before, the members answered its commands only "only the
job's leader may command it", and the owner, still believing it led, repartitioned again and again until the job
failed on it (while the standby finished it). Now the refusal says whom the member follows; the owner asks that
peer to take it in as a member (whose signed answer confirms it leads) instead of commanding again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

HANDED_OVER = "handed over to "
"""Prefix of a member's refusal when it follows another leader, followed by that leader's peer id."""

_PEER = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class Accept:
    """Carry out the command (from our leader, not older than what we have)."""


@dataclass(frozen=True, slots=True)
class AskElection:
    """A newer term from another peer: accept (and follow it) only if the job's election made it leader."""


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


Verdict = Accept | AskElection | Refuse


def refusal(leader: str, term: int) -> str:
    """The reason a member gives when it refuses a command because it follows ``leader`` (at ``term``)."""
    return f"{HANDED_OVER}{leader} (term {term}): only the job's leader may command it"


def followed_leader(reason: str) -> str | None:
    """The peer id a refusal from :func:`refusal` (or a :data:`HANDED_OVER` announce answer) names, else None."""
    if not reason.startswith(HANDED_OVER):
        return None
    found = _PEER.match(reason, len(HANDED_OVER))
    return found.group(0) if found else None


def judge_command(
    sender: str, term: int, epoch: int, leader: str, our_term: int, our_epoch: int, epochs: bool = True
) -> Verdict:
    """A member's verdict on a leader command stamped ``(term, epoch)`` from ``sender``.

    ``leader``/``our_term``/``our_epoch`` are what this member follows; ``epochs=False`` compares terms only.
    A command from another peer than our leader with a newer term needs the election's word
    (:class:`AskElection`); anything else from another peer is refused with :func:`refusal`, which tells the
    sender whom we follow (so a replaced leader can step down instead of commanding again).
    """
    if sender == leader:
        if term < our_term or (epochs and term == our_term and epoch < our_epoch):
            return Refuse(f"stale command (term {term} epoch {epoch}; we are at {our_term}/{our_epoch})")
        return Accept()
    if term > our_term:
        return AskElection()
    return Refuse(refusal(leader, our_term))


@dataclass(frozen=True, slots=True)
class Go:
    """Every member started: send go."""


@dataclass(frozen=True, slots=True)
class HandOver:
    """A member follows ``leader``: this device was replaced; ask that leader to take it in as a member."""

    leader: str


@dataclass(frozen=True, slots=True)
class Restart:
    """Members failed to start for other reasons: repartition (bounded by the restart limit)."""

    reason: str


StartOutcome = Go | HandOver | Restart


def start_outcome(me: str, refusals: Iterable[tuple[str, str]]) -> StartOutcome:
    """The leader ``me``'s next move after starting a plan, from ``(peer, reason)`` of each member that refused
    or failed. A member that names another leader wins over other failures: commanding again cannot succeed."""
    failed = list(refusals)
    if not failed:
        return Go()
    for _peer, reason in failed:
        leader = followed_leader(reason)
        if leader is not None and leader != me:
            return HandOver(leader)
    return Restart("members refused or failed to start: " + "; ".join(f"{p[:12]}: {r}" if p else r for p, r in failed))


__all__ = ["HANDED_OVER", "Accept", "AskElection", "Go", "HandOver", "Refuse", "Restart", "StartOutcome",
           "Verdict", "followed_leader", "judge_command", "refusal", "start_outcome"]  # fmt: skip
