"""The market's only entry points from the job manager (``arceusd.jobs``): one call each.

- :func:`may_auto_join`: before an automatic join; False keeps this device out of the job (the policy or the
  job's needs refuse it; the market service offers it again when they hold).
- :func:`on_commit`: the leader committed a checkpoint; receipts for it are issued (in the background).

Both do nothing when the market service is not running (``node.market`` is None).
"""

from __future__ import annotations

from typing import Any


async def may_auto_join(node: Any, job: Any) -> bool:
    market = getattr(node, "market", None)
    return True if market is None else bool(await market.admit(job))


def on_commit(node: Any, job: Any, step: int, term: int, epoch: int) -> None:
    """Call after the manifest of ``step`` is committed, while ``job.reports[step]`` still holds the devices'
    shard reports and ``job.committed_step`` is still the previous commit."""
    market = getattr(node, "market", None)
    if market is not None:
        market.on_commit(job, step, term, epoch)
