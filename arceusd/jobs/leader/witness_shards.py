"""The leader's reading of the first replica's shards at a DiLoCo witness dispute (issue #29 item 6).

With DiLoCo a replica's witness is the digest of its outer anchor and momentum, not of its shard's bytes; where
two replicas' witnesses differ at a place the leader does not hold, :func:`arceusd.jobs.leader.witnesses.judge` leaves
the place open (``Verdict.unsettled``). The leader then copies the first replica's device's checkpoint shard of
that step (its name and at most its size from the device's report, as a commit would; the bytes must match the
sha256 it reported) and rebuilds, without torch, the witness its outer tensors give
(:func:`arceusd.files.outer_witness.from_shard`). Judged again with those, the dispute is settled; a shard that
could not be copied or read leaves it word against word (the job replans, nobody is excluded then). A shard not
served as reported also counts as a failure of that device's shard serving, as at a commit (twice in a row with
no commit between exclude it): a first-replica member that lies and withholds its shard no longer spends the
job's restarts. Nothing copied here is written anywhere: the disputed step is never committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from arceusd.files import outer_witness
from arceusd.files.checkpoint import ShardRecord, matches
from arceusd.files.safetensors_image import ImageError
from arceusd.jobs.common.ports import FetchShard
from arceusd.jobs.leader import witnesses
from arceusd.jobs.leader.commits import fetch_deadline
from arceusd.jobs.record.job import Job

log = logging.getLogger(__name__)


class Withheld(Exception):
    """The device did not serve the shard it reported (nothing within its size and time, or other bytes)."""


@dataclass(frozen=True)
class Read:
    """``witnesses``: peer -> the witness its reported shard holds (``""``: not known); ``withheld``: peer -> why
    its shard counts as not served (the leader blames its serving: ``arceusd.jobs.core.events.ShardWithheld``)."""

    witnesses: dict[str, str]
    withheld: dict[str, str]


async def outer_witnesses(fetch_shard: FetchShard, job: Job, step: int, peers: Sequence[str]) -> Read:
    """The witness each of ``peers``' reported checkpoint shard of ``step`` holds (``""``: not copied in time,
    not what it reported, or not readable), and which of them withheld it."""
    out: dict[str, str] = {}
    withheld: dict[str, str] = {}
    for peer in peers:
        out[peer] = ""
        try:
            out[peer] = await _outer_witness(fetch_shard, job, step, peer)
        except Withheld as exc:
            log.warning("job %s: %s; the witnesses stay word against word", job.job_id, exc)
            withheld[peer] = str(exc)
        except Exception:  # whatever went wrong: that place stays word against word, the step is never left waiting
            log.exception("job %s: reading the shard of %s for step %d failed", job.job_id, peer[:12], step)
    return Read(out, withheld)


async def _outer_witness(fetch_shard: FetchShard, job: Job, step: int, peer: str) -> str:
    """:func:`outer_witnesses` for one device (``""``: no report or place, or not readable); raises
    :class:`Withheld`."""
    shard = job.leading.commits.reports.get(step, {}).get(peer)
    place = witnesses.place(job, peer)
    if shard is None or place is None or peer not in job.members:
        return ""
    record = ShardRecord(str(shard["name"]), str(shard["sha256"]), int(shard["size"]))  # checked at its report
    data = None
    with trio.move_on_after(fetch_deadline(record.size)):
        data = await fetch_shard(job, peer, step, record)
    if data is None or not matches(data, record):
        raise Withheld(
            f"the shard {record.name} of step {step} was not served by {peer[:12]} as it reported it (within "
            f"{fetch_deadline(record.size):.0f} s and its {record.size} bytes, of its sha256)"
        )
    try:
        return await trio.to_thread.run_sync(outer_witness.from_shard, data, step, *place)
    except ImageError as exc:
        log.warning("job %s: the shard of %s for step %d is unreadable: %s", job.job_id, peer[:12], step, exc)
        return ""


__all__ = ["Read", "Withheld", "outer_witnesses"]
