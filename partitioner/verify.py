"""Verification of a received plan: recompute it from the same inputs and compare hashes."""

from __future__ import annotations

from partitioner.canonical import inputs_hash, plan_hash
from partitioner.inputs import PlanInputs
from partitioner.plan import Plan, PlanError, PlanMismatch
from partitioner.search import plan as compute_plan


def verify(received: Plan, inputs: PlanInputs) -> None:
    """Return None if ``received`` is exactly the plan these inputs give; else raise ``PlanMismatch``.

    Error handling: ``PlanMismatch`` says whether the inputs hash or the plan itself differs (or that the
    inputs admit no plan at all). Refuse the plan and ask the leader for its inputs.
    """
    expected_inputs = inputs_hash(inputs)
    if received.inputs_hash != expected_inputs:
        raise PlanMismatch(
            f"plan was computed from inputs {received.inputs_hash[:16]}..., ours hash to {expected_inputs[:16]}..."
        )
    try:
        ours = compute_plan(inputs)
    except PlanError as exc:
        raise PlanMismatch(f"these inputs admit no plan ({exc}), yet a plan was received") from exc
    got, want = plan_hash(received), plan_hash(ours)
    if got != want:
        raise PlanMismatch(f"plan hash {got[:16]}... differs from the recomputed {want[:16]}...")
