"""Who may command a job, and what a leader does when its members follow someone else (pure: no I/O, no clock).

Owns the member's verdict on a leader command (:func:`judge_command`), the refusal that names the leader a
member follows (:class:`Refuse` with ``follows``, sent as the typed ``follows`` field of ``JobAck`` and
``JobStartReply`` and checked by :func:`followed_leader`), the leader's decision after a round of start
commands (:func:`start_outcome`), the election ranking a device stands with (:func:`own_ranking`) and when a
spare, which is in no election, follows the standby that took over (:func:`spare_may_follow`). The job
core (:mod:`arceusd.jobs.core`) and the manager's parts ask them.

Why refusals name the leader: membership may declare a live owner dead (a daemon stalled for a second under
load is enough with the ``local`` timings). Its standby then wins a newer election term with the other member
and takes the job over, and re-tracks the job's election without the owner, so the owner's election messages no
longer reach anyone and it never learns who leads. Before, the members answered its commands only "only the
job's leader may command it", and the owner, still believing it led, repartitioned again and again until the job
failed on it (while the standby finished it). Now the refusal says whom the member follows (a typed peer id,
not text to parse); the owner asks that peer to take it in as a member (its signed answer confirms it leads)
instead of commanding again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from protocol.validation import is_hex_id


@dataclass(frozen=True, slots=True)
class Accept:
    """Carry out the command (from our leader, not older than what we have)."""


@dataclass(frozen=True, slots=True)
class AskElection:
    """A newer term from another peer: accept (and follow it) only if the job's election made it leader."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the command saying ``reason``; ``follows``: the leader this member takes commands from, when the
    sender is not it (a replaced leader learns whom to join)."""

    reason: str
    follows: str = ""


Verdict = Accept | AskElection | Refuse


def refusal(leader: str, term: int) -> Refuse:
    """A member's refusal of a command because it follows ``leader`` (at ``term``)."""
    return Refuse(f"this device follows {leader[:12]} (term {term}): only the job's leader may command it", leader)


def followed_leader(follows: str) -> str | None:
    """The peer id a refusal's ``follows`` names, when it is one (32 lowercase hex characters), else None."""
    return follows if follows and is_hex_id(follows) else None


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
    return refusal(leader, our_term)


def spare_may_follow(sender: str, standby: str, spare: bool, leader_gone: bool) -> bool:
    """Whether a spare takes a newer term's commands from ``sender`` without the job's election's word.

    A spare is in no stage, so it takes part in no election (the election is the plan's devices') and learns of
    no new leader: the standby that took over was refused with "this device follows <the dead leader>", and the
    spare the old leader had accepted was lost to the job (issue 31). It is not taken on the sender's word:
    only the standby its leader's last start named can have been elected (the election ranks the leader first,
    the standby second, and members outside that ranking never lead), and only once the leader is gone from
    this device's view too (``leader_gone``: neither alive nor suspect), as the election itself requires."""
    return spare and leader_gone and bool(standby) and sender == standby


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


def start_outcome(me: str, refusals: Iterable[tuple[str, str, str]]) -> StartOutcome:
    """The leader ``me``'s next move after starting a plan, from ``(peer, reason, follows)`` of each member that
    refused or failed (``follows``: the leader it names, or ''). A member that names another leader wins over
    other failures: commanding again cannot succeed."""
    failed = list(refusals)
    if not failed:
        return Go()
    for _peer, _reason, follows in failed:
        leader = followed_leader(follows)
        if leader is not None and leader != me:
            return HandOver(leader)
    return Restart(
        "members refused or failed to start: " + "; ".join(f"{p[:12]}: {r}" if p else r for p, r, _ in failed)
    )


__all__ = [
    "Accept",
    "AskElection",
    "Go",
    "HandOver",
    "Refuse",
    "Restart",
    "StartOutcome",
    "Verdict",
    "followed_leader",
    "judge_command",
    "refusal",
    "spare_may_follow",
    "start_outcome",
]


def own_ranking(me: str, ranking: Iterable[str], ready_to_lead: bool) -> list[str]:
    """The election ranking this device tracks a job with: the job's (its leader, then its standby), less this
    device when it is ranked behind the leader but cannot lead yet (``ready_to_lead``: it holds no checked copy
    of the data, or of the initial weights a LoRA standby keeps, before the leader's first sync).

    Only the first live member of a device's own ranking campaigns, so a standby that cannot lead never stands:
    while its leader looks dead (a daemon stalled under load is enough), the job waits for the leader to be seen
    again. Elected anyway, it declined to lead (nothing to lead from) and kept the term, and the leader, which
    had stepped down for it, never stood again: the job stalled for good."""
    out = [p for p in ranking if p]
    if not ready_to_lead and me in out[1:]:
        out.remove(me)
    return out
