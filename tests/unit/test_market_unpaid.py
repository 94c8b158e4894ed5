"""Issue 29 part 5, the pure rule: a member counts the checkpoints its worker passed that no countersigned receipt
above $0 pays; a checkpoint is due once the next one passed and it passed GRACE_S ago; more than
policy.unpaid_checkpoints of them and it leaves, saying why. Steps before it first ran are not owed; a recovery
moves the mark back."""

from __future__ import annotations

import pytest

from arceusd.market.policy import Policy, PolicyError
from arceusd.market.unpaid import GRACE_S, MAX_TRACKED, PayWatch, leave_reason, unpaid

OWNER = "ab" * 16


def test_checkpoints_are_due_one_interval_and_the_grace_after_they_passed() -> None:
    w = PayWatch.start(20, 41)  # joined a job resumed at step 40: steps 20 and 40 are not owed
    for step, at in ((45, 0.0), (61, 1.0), (81, 2.0), (101, 3.0)):
        w.see(step, at)
    assert sorted(w.passed) == [60, 80, 100]
    assert unpaid(w, 0, 1.0 + GRACE_S - 0.1) == [], "60 is due GRACE_S after it passed"
    assert unpaid(w, 0, 2.0 + GRACE_S) == [60, 80], "100 is not due before the next checkpoint passed"
    assert unpaid(w, 0, 1000.0) == [60, 80]
    assert unpaid(w, 60, 100.0) == [80], "a receipt up to 60 pays 60"
    assert unpaid(w, 100, 100.0) == []


def test_an_honest_owner_is_never_left_and_a_withholding_one_is_left_after_the_limit() -> None:
    limit = Policy().unpaid_checkpoints
    assert limit == 2
    honest, withholding = PayWatch.start(10, 1), PayWatch.start(10, 1)
    for i in range(1, 200):
        now = i * 0.5  # 20 steps a second
        honest.see(10 * i // 5, now)
        withholding.see(10 * i // 5, now)
        paid_to = max(0, (10 * i // 5 - 10) // 10 * 10)  # its receipts arrive one interval late
        assert leave_reason(unpaid(honest, paid_to, now), limit, 0, OWNER) is None
    steps = unpaid(withholding, 0, 100.0)
    why = leave_reason(steps, limit, 0, OWNER)
    assert why and "no receipt came" in why and "policy.unpaid_checkpoints = 2" in why and OWNER[:12] in why
    assert "pay $0 (3 of them)" in str(leave_reason(steps, limit, 3, OWNER))
    assert leave_reason(steps[:2], limit, 0, OWNER) is None


def test_a_recovery_moves_the_mark_back_and_memory_is_bounded() -> None:
    w = PayWatch.start(10, 1)
    w.see(35, 1.0)
    w.see(21, 2.0)  # resumed from the commit at 20: the work past it was never committed
    assert sorted(w.passed) == [10, 20]
    w.see(45, 3.0)
    assert sorted(w.passed) == [10, 20, 30, 40] and w.passed[30] == 3.0, "passed again, at its new time"
    assert unpaid(w, 0, 3.0 + GRACE_S) == [10, 20, 30], "the committed ones stay owed"
    big = PayWatch.start(1, 1)
    big.see(10**9, 1.0)
    assert len(big.passed) == MAX_TRACKED


def test_the_policy_key() -> None:
    assert Policy(unpaid_checkpoints=0).unpaid_checkpoints == 0
    with pytest.raises(PolicyError, match="unpaid_checkpoints"):
        Policy(unpaid_checkpoints=-1)


def test_the_receipt_grace_is_the_policys() -> None:
    """``policy.receipt_grace_s`` says when a checkpoint's receipt is due: a shorter one makes it due sooner."""
    assert Policy().receipt_grace_s == GRACE_S
    w = PayWatch.start(10, 1)
    w.see(25, 1.0)
    assert unpaid(w, 0, 16.0, grace_s=15.0) == [10] and unpaid(w, 0, 16.0) == []
    for bad in (0, 4.9, 86401, float("nan"), True, "60"):
        with pytest.raises(PolicyError, match="receipt_grace_s"):
            Policy(receipt_grace_s=bad)  # type: ignore[arg-type]
