"""The leader's reading of the first replica's shards at a DiLoCo witness dispute (issue #29 item 6).

With DiLoCo a replica's witness is the digest of its outer anchor and momentum, not of its shard's bytes; where
two replicas' witnesses differ at a place the leader does not hold, :func:`arceusd.jobs.witnesses.judge` leaves
the place open (``Verdict.unsettled``). The leader then copies the first replica's device's checkpoint shard of
that step (its name and at most its size from the device's report, as a commit would; the bytes must match the
sha256 it reported) and rebuilds, without torch, the witness its outer tensors give
(:func:`arceusd.files.outer_witness.from_shard`). Judged again with those, the dispute is settled; a shard that
could not be copied or read leaves it word against word (the job replans, nobody is excluded). Nothing copied
here is written anywhere: the disputed step is never committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from arceusd.files import outer_witness
from arceusd.files.checkpoint import ShardRecord, matches
from arceusd.files.safetensors_image import ImageError
from arceusd.jobs import witnesses
from arceusd.jobs.commits import fetch_deadline
from arceusd.jobs.job import Job
from arceusd.jobs.manager_base import JobContext

log = logging.getLogger(__name__)


async def outer_witnesses(ctx: JobContext, job: Job, step: int, peers: Sequence[str]) -> dict[str, str]:
    """peer -> the witness its reported checkpoint shard of ``step`` holds (``""``: not copied in time, not what
    it reported, or not readable)."""
    out: dict[str, str] = {}
    for peer in peers:
        try:
            out[peer] = await _outer_witness(ctx, job, step, peer)
        except Exception:  # whatever went wrong: that place stays word against word, the step is never left waiting
            log.exception("job %s: reading the shard of %s for step %d failed", job.job_id, peer[:12], step)
            out[peer] = ""
    return out


async def _outer_witness(ctx: JobContext, job: Job, step: int, peer: str) -> str:
    """:func:`outer_witnesses` for one device (``""``: not copied as reported, or not readable)."""
    shard = job.leading.commits.reports.get(step, {}).get(peer)
    place = witnesses.place(job, peer)
    if shard is None or place is None:
        return ""
    record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))  # checked at its report
    data = None
    with trio.move_on_after(fetch_deadline(record.size)):
        data = await ctx.transfers.fetch_shard(job, peer, step, record)
    if data is None or not matches(data, record):
        log.warning(
            "job %s: the shard of %s for step %d could not be copied as reported; the witnesses stay word against word",
            job.job_id,
            peer[:12],
            step,
        )
        return ""
    try:
        return await trio.to_thread.run_sync(outer_witness.from_shard, data, step, *place)
    except ImageError as exc:
        log.warning("job %s: the shard of %s for step %d is unreadable: %s", job.job_id, peer[:12], step, exc)
        return ""


__all__ = ["outer_witnesses"]
