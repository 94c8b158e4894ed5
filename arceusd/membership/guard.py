"""Who may claim what about whom: the membership core's admission rules for gossiped updates (pure functions).

Owns :class:`Drop` (why an update was dropped, counted by the core) and :func:`check_update`, applied by
:class:`~arceusd.membership.swim.Membership` to every update that arrives from the network, before the state
table (:mod:`.state`) sees it. The driver has already checked signatures; these rules are about meaning:

* **Origin.** ALIVE and LEFT are made only by their subject (``origin == peer``). SUSPECT and DEAD are made by
  a member about another member (SWIM: any member may suspect): the origin is not the subject, and it is
  ourselves or a member in our table (tombstones included: a member that was verified once). A key that only
  said hello, or a member still pending, is not a member.
* **Incarnation range.** Incarnations are ``0 .. MAX_INCARNATION``; a SUSPECT/DEAD/LEFT claim must be below
  ``MAX_INCARNATION`` so the subject can always refute it with ``claim + 1`` without leaving the range (the
  wire and the codec carry 64-bit unsigned integers; 2**62 keeps every refutation far inside).
* **Incarnation window.** About a member we know at incarnation ``j`` (ourselves included), an update above
  ``j + INCARNATION_WINDOW`` is dropped. Honest incarnations move by one refutation at a time, so a claim far
  above anything the subject announced was made up; without the window one forged SUSPECT would push the
  subject's incarnation to the top of the range in a single step. A member that really refuted a million
  times while we were not listening is learned again once its tombstone (or our record) is gone.

Members that are new to us are a separate bound (pending verification, per source): see ``swim.Membership``.
"""

from __future__ import annotations

import enum

from arceusd.membership.events import Update, UpdateKind

MAX_INCARNATION = 2**62
INCARNATION_WINDOW = 2**20


class Drop(enum.Enum):
    """Why the core dropped an update or a message (the values are the counter names in ``status``)."""

    NOT_SELF_ORIGINATED = "alive_or_left_not_from_subject"
    SELF_ACCUSATION = "suspect_or_dead_about_its_origin"
    ORIGIN_NOT_MEMBER = "claim_from_non_member"
    INCARNATION_RANGE = "incarnation_out_of_range"
    INCARNATION_WINDOW = "incarnation_beyond_window"
    PENDING_PER_SOURCE = "new_member_over_source_bound"
    PENDING_TOTAL = "new_member_over_pending_bound"
    PER_HOST = "new_member_over_host_bound"
    TABLE_FULL = "new_member_table_full"


def check_update(update: Update, known_incarnation: int | None, origin_is_member: bool) -> Drop | None:
    """``None`` when ``update`` may be applied; otherwise why not.

    ``known_incarnation``: our record of the subject (None if unknown); ``origin_is_member``: the origin is
    ourselves or a member in our table.
    """
    kind = update.kind
    if kind in (UpdateKind.ALIVE, UpdateKind.LEFT):
        if update.origin != update.peer:
            return Drop.NOT_SELF_ORIGINATED
    else:
        if update.origin == update.peer:
            return Drop.SELF_ACCUSATION
        if not origin_is_member:
            return Drop.ORIGIN_NOT_MEMBER
    ceiling = MAX_INCARNATION if kind is UpdateKind.ALIVE else MAX_INCARNATION - 1
    if not 0 <= update.incarnation <= ceiling:
        return Drop.INCARNATION_RANGE
    if known_incarnation is not None and update.incarnation > known_incarnation + INCARNATION_WINDOW:
        return Drop.INCARNATION_WINDOW
    return None


def refuted_incarnation(current: int, claimed: int) -> int:
    """The incarnation that refutes ``claimed`` (a checked claim: at most ``MAX_INCARNATION - 1`` unless it is
    an ALIVE of ours from a previous life), never above ``MAX_INCARNATION``."""
    return min(max(current, claimed) + 1, MAX_INCARNATION)


def host_of(address: str) -> str:
    """The host part of ``host:port`` (the whole string when there is no port); the per-host member bound."""
    host, sep, port = address.rpartition(":")
    return host if sep and port.isdigit() else address
