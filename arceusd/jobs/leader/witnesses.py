"""Data-parallel replicas at a checkpoint: what the leader takes from each replica's witness, and its verdict.

Only the first replica's devices write checkpoint shards; with replicas every device's worker also sends a
``witness`` at each checkpoint step (:class:`arceusd.worker.protocol.WitnessEvent`): the sha256 of the state all
replicas hold alike at its place (stage, rank): the bytes of its checkpoint shard (the whole stage state, what
the first replica writes) when gradients are averaged every step, the outer anchor and momentum with DiLoCo.
The leader takes a witness (a :class:`protocol.job_wire.JobReport` of kind ``WITNESS``) only from a device of the
plan's replicas, for one of the job's checkpoint steps, as 64 hex characters (:func:`check_witness`), and once
every device of the plan reported (shards and witnesses) it compares them place by place (:func:`judge`):

- all alike: the commit goes on, and every device of the other replicas counts as having reported the step
  (its receipts in the market, like the shard writers');
- three or more replicas, one differs: it is excluded (named under ``excluded``, like a bad shard) and the job
  replans from the last commit; when the first replica's device is the odd one, its shard is not committed;
- two replicas that differ where the leader holds one of the places itself: its own worker's witness is what it
  computed, so the other replica's device is the odd one and is excluded like one outvoted (issue #29 item 6: a
  member sending a wrong witness used to fail every job of two replicas, never named);
- two replicas that differ at a place the leader does not hold, gradients averaged every step: the first
  replica's witness is a commitment the leader can check, the other's is not. The first replica's device also
  reported its checkpoint shard's sha256 (the bytes the leader fetches, checks against that digest and the
  plausibility bound before it commits them), and its witness is that very digest. A first-replica device whose
  witness differs from its own shard's digest contradicts itself and is the odd one (with any number of
  replicas, all alike included: its shard is not what it witnessed, so it is never committed); else the other replica's
  device, whose witness disagrees with the state the leader holds the bytes of, is the odd one (issue #29 item 6:
  the dispute is settled as a job of one replica would trust that shard, and the job replans from the last
  commit without the odd device; nothing of the disputed interval is committed);
- with DiLoCo (the witness is the outer anchor and momentum, not the shard's bytes) two replicas that differ at a
  place the leader does not hold are first left open (:attr:`Verdict.unsettled` names the first replica's device
  there): the leader fetches that device's checkpoint shard of the step (checked against the digest and size it
  reported) and rebuilds, without torch, the witness its outer tensors give
  (:func:`arceusd.files.outer_witness.from_shard`, :mod:`arceusd.jobs.leader.witness_shards`); judged again with those
  (``outer``), the place is settled by the same rule as a shard's digest above: a first-replica device whose
  witness is not what its own shard holds is the odd one, else the other replica's device is;
- a place still split (DiLoCo, the shard could not be fetched or read) is word against word: the job replans from
  the last commit without excluding anyone (counted under ``refused_reports`` as ``replica_witness``).

Pure functions over the job record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from arceusd.jobs.leader.shard_checks import ReportProblem, ReportRefused
from arceusd.jobs.record.job import Job
from partitioner.replicas import ReplicaSyncMode
from protocol.job_wire import JobReport

_HEX = frozenset("0123456789abcdef")


def replicated(job: Job) -> bool:
    """Whether the job's current plan has two or more data-parallel replicas."""
    return job.plan is not None and job.replica_plan is not None and len(job.replica_plan.replicas) > 1


def check_witness(job: Job, peer: str, report: JobReport) -> tuple[int, str]:
    """The step and digest of ``peer``'s witness report (its typed fields, as the codec bounded them);
    :class:`ReportRefused` names what is wrong."""
    if not replicated(job) or job.replica_plan is None or job.replica_plan.replica_of(peer) is None:
        raise ReportRefused(ReportProblem.NOT_IN_PLAN, f"{peer[:12]} holds no place in the plan's replicas")
    step = report.step
    interval = job.spec.checkpoint.interval_steps
    if (
        step is None
        or not 0 < step <= job.total_steps
        or (step != job.total_steps and (not interval or step % interval))
    ):
        raise ReportRefused(
            ReportProblem.STEP, f"witness step {str(step)[:40]!r} is not one of the job's checkpoint steps"
        )
    digest = report.digest
    if len(digest) != 64 or not set(digest) <= _HEX:
        raise ReportRefused(ReportProblem.DIGEST, "the witness digest is not 64 lowercase hex characters")
    return step, digest


@dataclass(frozen=True)
class Verdict:
    """``alike``: the devices of the other replicas that hold what the first replica holds; ``odd``: devices
    named as differing; ``reason``: why the step is not committed (empty: commit); ``unsettled``: with DiLoCo,
    the first replica's devices at split places whose shard (not yet read) can settle them."""

    alike: frozenset[str]
    odd: tuple[str, ...]
    reason: str
    unsettled: tuple[str, ...] = ()


def place(job: Job, peer: str) -> tuple[int, int] | None:
    """``peer``'s place (stage, rank) in the plan's replicas (places are cut alike in every replica), or None."""
    if job.replica_plan is None:
        return None
    for replica in job.replica_plan.replicas:
        for s, stage in enumerate(replica.stages):
            for r, share in enumerate(stage.shares):
                if share.peer_id == peer:
                    return s, r
    return None


def shard_digests(job: Job, step: int) -> dict[str, str]:
    """The sha256 each first-replica device reported for its checkpoint shard of ``step`` (checked by
    :func:`arceusd.jobs.leader.shard_checks.check_checkpoint_report`: 64 hex characters)."""
    return {peer: str(shard["sha256"]) for peer, shard in job.leading.commits.reports.get(step, {}).items()}


def judge(
    job: Job,
    step: int,
    digests: Mapping[str, str],
    me: str = "",
    shards: Mapping[str, str] | None = None,
    outer: Mapping[str, str] | None = None,
) -> Verdict:
    """Compare the replicas' witnesses of ``step`` place by place (see the module docstring); ``me``: the leader,
    whose own witness settles a place it holds; ``shards``: the first replica's reported shard digests
    (:func:`shard_digests`), which settle a place the leader does not hold when gradients are averaged every
    step; ``outer``: with DiLoCo, the witness the leader rebuilt from a first-replica device's shard (its outer
    anchor and momentum), which settles that device's place the same way."""
    rp = job.replica_plan
    if rp is None:
        raise ValueError("judging witnesses needs a plan with replicas (a bug: checked by replicated())")
    diloco = rp.sync_mode is ReplicaSyncMode.DILOCO
    backing = (outer if diloco else shards) or {}  # what the first replica's shard says it witnessed
    first = rp.replicas[0]
    alike: set[str] = set()
    odd: list[str] = []
    split: list[str] = []
    unsettled: list[str] = []
    by_shard = False
    for s, stage in enumerate(first.stages):
        for r in range(len(stage.shares)):
            members = [replica.stages[s].shares[r].peer_id for replica in rp.replicas]  # cut alike: same places
            held = backing.get(members[0], "")
            votes = Counter(digests.get(p, "") for p in members)
            top, count = votes.most_common(1)[0]
            if held and digests.get(members[0]) != held:  # its witness contradicts its own shard: it is the odd one
                odd.append(members[0])
                by_shard = True
            elif count == len(members):
                alike.update(members[1:])
            elif len(members) >= 3 and count * 2 > len(members) and top:
                odd.extend(p for p in members if digests.get(p) != top)
                alike.update(p for p in members[1:] if digests.get(p) == top)
            elif me in members and digests.get(me):  # the leader's own computation settles its place
                odd.extend(p for p in members if digests.get(p) != digests[me])
                alike.update(p for p in members[1:] if digests.get(p) == digests[me])
            elif held:  # the first replica's shard, whose bytes the leader holds, settles the place
                by_shard = True
                odd.extend(p for p in members[1:] if digests.get(p) != held)
                alike.update(p for p in members[1:] if digests.get(p) == held)
            else:
                split.append(f"stage {s} rank {r}")
                if diloco:  # its shard, once read, settles it
                    unsettled.append(members[0])
    if split:
        reason = (
            f"the replicas hold different states at step {step} ({', '.join(split)}); "
            "planning again from the last commit"
        )
    elif odd:
        reason = f"member(s) {', '.join(p[:12] for p in odd)} diverged from the other replicas at step {step}"
        if by_shard and diloco:
            reason += " (settled by the first replica's shard, whose outer anchor and momentum the leader read)"
        elif by_shard:
            reason += " (settled by the first replica's shard, whose bytes the leader holds)"
    else:
        reason = ""
    return Verdict(frozenset(alike), tuple(odd), reason, tuple(unsettled))


__all__ = ["Verdict", "check_witness", "judge", "place", "replicated", "shard_digests"]
