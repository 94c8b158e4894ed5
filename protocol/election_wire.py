"""Wire messages of the per-job election driver, mapped one-to-one onto the election core's events.

Ids 60-69 (append-only, see the table in :mod:`protocol.messages`):

==== ===================== ========== ================================================================
id   type                  max_size   meaning
==== ===================== ========== ================================================================
60   ElectionVoteRequest   1 KiB      candidate asks for a (pre-)vote for ``job`` at ``term``
                                      (the unary call's response is the ElectionVoteReply)
61   ElectionVoteReply     1 KiB      a member's (pre-)vote, at the member's own ``term``; also the
                                      answer to a stale LeaderAnnounce (granted=False, newer term)
62   LeaderAnnounce        1 KiB      the leader's heartbeat: ``(job, term)``
==== ===================== ========== ================================================================

The envelope carries the same job id (the driver rejects a body whose ``job`` differs from the envelope's);
``term`` lives in the body because a pre-vote asks about a term the sender does not hold yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import message

_ID = {"max_len": 64}


@message(60, max_size=1024)
@dataclass(frozen=True)
class ElectionVoteRequest:
    job: str = field(metadata=_ID)
    term: int
    pre_vote: bool


@message(61, max_size=1024)
@dataclass(frozen=True)
class ElectionVoteReply:
    job: str = field(metadata=_ID)
    term: int
    granted: bool
    pre_vote: bool
    leader: str = field(default="", metadata=_ID)


@message(62, max_size=1024)
@dataclass(frozen=True)
class LeaderAnnounce:
    job: str = field(metadata=_ID)
    term: int
