"""The member table's record type and the merge rule for updates about OTHER members (memberlist's rules).

Owns :class:`Member` and :func:`decide`, the pure state table. Rules (``i`` = update incarnation, ``j`` =
ours):

================  =====================  =====================  ==================  ==================
current \\ update   ALIVE                  SUSPECT                DEAD                LEFT
================  =====================  =====================  ==================  ==================
unknown           apply (new member)     ignore                 ignore              ignore
alive             apply if i > j         apply if i >= j        apply if i >= j     apply if i >= j
suspect           apply if i > j         confirm if i >= j      apply if i >= j     apply if i >= j
dead              apply if i > j         ignore                 ignore              apply if i >= j
left              apply if i > j         ignore                 ignore              ignore
================  =====================  =====================  ==================  ==================

"confirm" leaves the member suspect and counts an independent confirmation toward shortening the suspicion.
Dead and left members stay in the table as tombstones for ``tombstone_ttl`` so an ALIVE with an old
incarnation cannot bring them back; only a strictly higher incarnation (the member really restarted or
refuted) does. A dead member's own LEFT at its incarnation or newer still applies: it is signed by the subject
and says more than an accuser's DEAD (a full-state sync can bring our DEAD claim before the subject's LEFT
arrives). Updates about the local member are not decided here (see ``swim.Membership._about_self``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from arceusd.membership.events import Address, MemberState, PeerId, UpdateKind


@dataclass(slots=True)
class Member:
    peer: PeerId
    state: MemberState
    incarnation: int
    address: Address
    public_key: bytes
    state_change: float


class Decision(enum.Enum):
    IGNORE = "ignore"
    APPLY = "apply"
    CONFIRM = "confirm"


_TARGET = {
    UpdateKind.ALIVE: MemberState.ALIVE,
    UpdateKind.SUSPECT: MemberState.SUSPECT,
    UpdateKind.DEAD: MemberState.DEAD,
    UpdateKind.LEFT: MemberState.LEFT,
}


def target_state(kind: UpdateKind) -> MemberState:
    return _TARGET[kind]


def decide(current: MemberState | None, current_incarnation: int, kind: UpdateKind, incarnation: int) -> Decision:
    """What to do with an update of ``kind`` at ``incarnation`` about a member we hold in ``current``."""
    if current is None:
        return Decision.APPLY if kind is UpdateKind.ALIVE else Decision.IGNORE
    if kind is UpdateKind.ALIVE:
        return Decision.APPLY if incarnation > current_incarnation else Decision.IGNORE
    if current is MemberState.DEAD and kind is UpdateKind.LEFT:
        return Decision.APPLY if incarnation >= current_incarnation else Decision.IGNORE
    if current in (MemberState.DEAD, MemberState.LEFT):
        return Decision.IGNORE
    if incarnation < current_incarnation:
        return Decision.IGNORE
    if kind is UpdateKind.SUSPECT and current is MemberState.SUSPECT:
        return Decision.CONFIRM
    return Decision.APPLY
