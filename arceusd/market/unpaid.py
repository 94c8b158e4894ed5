"""Nobody works unpaid without knowing: a member's account of the checkpoints its work in a job is owed for. Pure.

A member's worker writes a checkpoint every ``checkpoint.interval_steps``; once the leader commits it, the leader
issues this device a receipt for it and the device countersigns it (``arceusd.market.receipts``). An owner that
never sends receipts, or sends $0 ones, would get every step trained with the members saying nothing. So each
member keeps a :class:`PayWatch` per job: when its worker passed each checkpoint step (from the step it first
ran at: it is not owed for steps before it joined; a recovery forgets the uncommitted ones above the step it
resumed from), and the highest step its countersigned receipts with a
price above $0 pay up to. A checkpoint is *due* once the worker also passed the next one and it passed
:data:`GRACE_S` ago itself (``policy.receipt_grace_s``: an honest owner has an interval, at least that, to
commit it and pay); a due checkpoint no receipt pays is unpaid
(:func:`unpaid`). More than ``policy.unpaid_checkpoints`` unpaid checkpoints: the member leaves the job, says
why in ``status``, ``market`` and the dashboard, and does not offer itself to that job again
(:func:`leave_reason`; ``arceusd.market.service`` does the leaving).

Bounded: at most :data:`MAX_TRACKED` checkpoints are remembered per job, and one observation records at most
that many.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GRACE_S = 60.0
"""The default of ``policy.receipt_grace_s``: seconds after the worker passed a checkpoint by which its receipt
is due (and not before the next one): the worker trains on while the leader gathers and checks the step's
shards, commits and sends the receipts. That took up to about ten seconds on a loaded 2-core machine, and more
for a plan's first commit (its shapes are computed in a child process) and while members serve shards slowly; at
15 s honest members left an honest owner's job in a recovery benchmark on a busy machine. A minute keeps honest
owners clear; a withholding owner gets a minute's work more."""
MAX_TRACKED = 64


@dataclass
class PayWatch:
    """One job on one member: the checkpoints its worker passed (step -> when) since ``since_step``."""

    interval: int
    since_step: int
    last_step: int
    passed: dict[int, float] = field(default_factory=dict)

    @classmethod
    def start(cls, interval: int, step: int) -> PayWatch:
        return cls(max(0, interval), step, step)

    def see(self, step: int, now: float) -> None:
        """The worker is at ``step`` now: record the checkpoints it crossed since the last look. A step lower than
        before (a recovery resumed from the last commit) forgets the checkpoints above it: that work was never
        committed, so never owed, and they are recorded anew when the worker passes them again; the committed ones
        below it stay owed."""
        if self.interval <= 0:
            return
        if step < self.last_step:
            for above in [c for c in self.passed if c > step]:
                del self.passed[above]
        if step > self.last_step:
            top = step // self.interval * self.interval
            first = max(self.last_step // self.interval + 1, top // self.interval - MAX_TRACKED + 1) * self.interval
            for c in range(first, top + 1, self.interval):
                self.passed.setdefault(c, now)
            for old in sorted(self.passed)[:-MAX_TRACKED]:
                del self.passed[old]
        self.last_step = step


def unpaid(w: PayWatch, paid_to: int, now: float, grace_s: float = GRACE_S) -> list[int]:
    """The due checkpoints after ``paid_to`` (the highest step a paid receipt covers), oldest first: passed
    ``grace_s`` ago (``policy.receipt_grace_s``) and followed by the next."""
    out = []
    for c, at in sorted(w.passed.items()):
        if c > max(paid_to, w.since_step) and c + w.interval in w.passed and now - at >= grace_s:
            out.append(c)
    return out


def leave_reason(steps: list[int], limit: int, zero_receipts: int, owner: str) -> str | None:
    """Why the member leaves: more than ``limit`` unpaid checkpoints (``zero_receipts``: $0 receipts it got)."""
    if len(steps) <= limit:
        return None
    how = f"its receipts pay $0 ({zero_receipts} of them)" if zero_receipts else "no receipt came for them"
    shown = ", ".join(str(s) for s in steps[-4:])
    return (
        f"the owner {owner[:12]} left {len(steps)} checkpoint(s) of this device's work unpaid (steps "
        f"{'..., ' if len(steps) > 4 else ''}{shown}): {how}; more than policy.unpaid_checkpoints = {limit}, "
        "so this device left the job"
    )


__all__ = ["GRACE_S", "MAX_TRACKED", "PayWatch", "leave_reason", "unpaid"]
