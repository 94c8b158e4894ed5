"""The leader's copy of a first-replica device's shard at a DiLoCo witness dispute
(``arceusd.jobs.leader.witness_shards``), against a fake transfer: the witness rebuilt from the bytes it served when
they are what it reported; ``""`` (word against word) when they are not or nothing came (its serving blamed:
``withheld``), or when copying failed here."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any, cast

import torch
import trio

from arceusd.files import outer_witness
from arceusd.files.safetensors_io import save_bytes
from arceusd.jobs.leader import witness_shards, witnesses
from arceusd.jobs.record.job import Job
from tests.unit.test_witnesses import _job, _peers

STEP = 50


def _shard(seed: float) -> bytes:
    return save_bytes(
        {
            "param.blocks.0.weight": torch.full((3, 2), seed),
            f"optim.blocks.0.weight.{outer_witness.OUTER_ANCHOR}": torch.full((3, 2), seed + 1),
            f"optim.blocks.0.weight.{outer_witness.OUTER_MOMENTUM}": torch.full((3, 2), seed + 2),
        },
        {"step": str(STEP)},
    )


def _setup(serve: Any) -> tuple[Any, Any, str, bytes, list[tuple[str, int, str, int]]]:
    job = _job(2, sync="diloco")
    first = _peers(job)[0]
    data = _shard(0.5)
    report = {"name": "stage0-rank0.safetensors", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    job.leading = SimpleNamespace(commits=SimpleNamespace(reports={STEP: {first: report}}))
    job.job_id = "j" * 32
    job.members = {first: object()}
    asked: list[tuple[str, int, str, int]] = []

    async def fetch_shard(j: Any, peer: str, step: int, record: Any) -> bytes | None:
        asked.append((peer, step, record.name, record.size))
        return cast(bytes | None, serve(data))

    ctx = SimpleNamespace(transfers=SimpleNamespace(fetch_shard=fetch_shard))
    return ctx, job, first, data, asked


def _read(ctx: Any, job: Any, peers: list[str]) -> witness_shards.Read:
    async def go() -> witness_shards.Read:
        return await witness_shards.outer_witnesses(ctx.transfers.fetch_shard, cast(Job, job), STEP, peers)

    return trio.run(go)


def test_the_witness_is_rebuilt_from_the_shard_it_reported_and_asked_for_by_its_report() -> None:
    ctx, job, first, data, asked = _setup(lambda d: d)
    place = witnesses.place(cast(Job, job), first)
    assert place is not None
    got = _read(ctx, job, [first])
    assert got.witnesses == {first: outer_witness.from_shard(data, STEP, *place)} and got.witnesses[first]
    assert got.withheld == {}
    assert asked == [(first, STEP, "stage0-rank0.safetensors", len(data))]  # the name and size it reported


def test_a_shard_not_served_as_reported_or_not_at_all_leaves_the_dispute_open() -> None:
    def boom(d: bytes) -> bytes:
        raise RuntimeError("the link broke")

    for serve in (lambda d: None, lambda d: _shard(9.0), lambda d: d[:-1]):  # its doing: its serving is blamed
        ctx, job, first, _, _ = _setup(serve)
        got = _read(ctx, job, [first])
        assert got.witnesses == {first: ""} and "was not served by" in got.withheld[first], got
    ctx, job, first, _, _ = _setup(boom)  # this side's trouble: open, nobody blamed
    assert _read(ctx, job, [first]) == witness_shards.Read({first: ""}, {})
    ctx, job, first, _, asked = _setup(lambda d: d)
    stranger = "f" * 32  # no report, no place: nothing is asked
    assert _read(ctx, job, [stranger]) == witness_shards.Read({stranger: ""}, {}) and asked == []
    job.members = {}  # it left the job: not asked, not blamed
    assert _read(ctx, job, [first]) == witness_shards.Read({first: ""}, {}) and asked == []
