"""Wire messages asking a device what memory it lends (ids 100-101, append-only).

==== ============ ========== ===========================================================================
id   type         max_size   meaning
==== ============ ========== ===========================================================================
100  LendQuery    256        a daemon -> an alive peer: what do you lend jobs now? (asked at ``submit``)
101  LendReply    256        the answer: the memory its offer lends a job (bytes; 0: none now) and its kind
==== ============ ========== ===========================================================================

The answer is a stranger's word: the asker bounds it (``arceusd.jobs.judging.claims.check_offer_bounds``) and uses it
only to refuse a job that cannot fit on every device it sees (``arceusd.jobs.plans.memory_fit``); a device that says
more than it lends only lets a job be announced that then waits for members, as it would without the question.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import message


@message(100, max_size=256)
@dataclass(frozen=True)
class LendQuery:
    pass


@message(101, max_size=256)
@dataclass(frozen=True)
class LendReply:
    memory_bytes: int
    kind: str = field(default="cpu", metadata={"max_len": 16})


__all__ = ["LendQuery", "LendReply"]
