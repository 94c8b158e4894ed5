"""The market's only entry points from the job manager (``arceusd.jobs``): one call each.

- :func:`may_auto_join`: before an automatic join; False keeps this device out of the job (the policy or the
  job's needs refuse it; the market service offers it again when they hold).
- :func:`on_commit`: the leader committed a checkpoint; receipts for it are issued (in the background); returns
  why the job stops there (its budget is spent: ``arceusd.market.admission.budget_stop``), or None.
- :func:`join_refusal`: the leader, before it admits a device: why not (the job's needs, its budget), or None.
- :func:`enough_memory`: the leader, before it plans: whether the members lend ``needs.memory_total_mib``
  (if not, the job's ``error`` says so while it waits).
- :func:`wants_timing`: the leader, after its own steps: whether a plan device not timed yet offers far more than
  an unmeasured device is paid for (``arceusd.market.paid_speed.beyond_cap``), so its speed check times the plan's
  devices although the job does not run slow (the device is paid what it measured from then on).

- :func:`job_receipts`: what this device's ledger holds of each job it took part in (a restarted daemon lists
  those jobs: ``arceusd.jobs.record.known``).

They do nothing when the market service is not running (``node.market`` is None); ``enough_memory`` needs no service.
"""

from __future__ import annotations

from typing import Any

from arceusd.market.admission import memory_shortfall
from arceusd.market.paid_speed import beyond_cap


async def may_auto_join(node: Any, job: Any) -> bool:
    market = getattr(node, "market", None)
    return True if market is None else bool(await market.admit(job))


def on_commit(node: Any, job: Any, step: int, term: int, epoch: int) -> str | None:
    """Call after the manifest of ``step`` is committed, while ``job.leading.commits.reports[step]`` still holds the
    devices' shard reports and ``job.committed_step`` is still the previous commit. A reason: fail the job with it."""
    market = getattr(node, "market", None)
    return None if market is None else market.on_commit(job, step, term, epoch)


async def join_refusal(node: Any, job: Any, offer: Any) -> str | None:
    """Call before the leader admits ``offer`` (a checked ``planning.Offer``); a reason: refuse the join with it.
    With a budget, the leader plans the rest of the job with ``offer`` (in a thread) to price it."""
    market = getattr(node, "market", None)
    return None if market is None else await market.join_refusal(job, offer)


def wants_timing(node: Any, job: Any) -> bool:
    """Whether the market wants ``job``'s untimed plan devices timed now (one offers more than the cap)."""
    if getattr(node, "market", None) is None:
        return False

    return bool(beyond_cap(job, node.identity.peer_id))


def enough_memory(job: Any, joining: Any = None) -> bool:
    """Whether the members lend the job's ``needs.memory_total_mib`` between them (sets ``job.error`` if not);
    ``joining``: the offer of a peer the core is about to take in, counted with them."""
    offers = dict(job.members) | ({} if joining is None else {joining.peer_id: joining})
    short = memory_shortfall(int(job.spec.needs.memory_total_mib), (int(o.memory_bytes) for o in offers.values()))
    if short is not None:
        job.error = short
    return short is None


def job_receipts(node: Any) -> dict[str, Any]:
    """Job id -> :class:`arceusd.market.ledger.JobReceipts` of the jobs this device's ledger holds receipts for
    (as their device or their owner); empty without the market service."""
    market = getattr(node, "market", None)
    if market is None:
        return {}
    return dict(market.ledger.job_receipts(node.identity.peer_id))
