"""Issue 31: the quote planned every further device as fast as this one. It now plans them at the speeds this
daemon's past jobs ran its peers (offered, less what the leader measured them to run slower), and names the
figure as assumed only where it has none."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from click.testing import CliRunner

from arceusd.cli.commands import cli
from arceusd.jobs.core import JobCore, events
from arceusd.jobs.record.job import Job
from arceusd.jobs.service.driver import job_timing
from arceusd.market.estimate import DeviceGuess, offers_for, with_peers
from arceusd.market.forecast import forecast
from arceusd.market.timings import JobTiming, peer_speeds, read_timings, record_timing
from tests.unit.test_forecast import FAST, OWNER, PEER, gpt, offer
from tests.unit.test_jobspec import EXAMPLES

SLOW = FAST / 50


def test_a_finished_job_keeps_its_peers_speeds_as_its_plan_took_them(tmp_path: Path) -> None:
    spec = gpt()
    job = Job("ab" * 16, spec, b"", "h", OWNER, "", tmp_path, JobCore.owned(OWNER, 20), total_steps=20)
    job.created, job.first_step_at = 1000.0, 1003.0
    for step in range(1, 21):
        job.record_loss(step, 2.0, at=1003.0 + 0.01 * step)
    job.leading.commits.record_checkpoint(20, at=1004.0)
    third = replace(offer("third", SLOW), block_efficiency=1.05)  # (a block may beat the benchmark)
    job.offers = {OWNER: offer(OWNER), PEER: offer(PEER), "third": third}
    for peer in (PEER, "third"):
        job.core.handle(events.MemberJoined(peer, memory_ok=False), 0.0)  # the core's members
    job.leading.speed.discounts = {PEER: 2.0}  # the leader measured it twice as slow as it offered
    timing = job_timing(job, 1005.0)
    assert timing is not None
    assert timing.peers == ((PEER, FAST / 2, 0.7), ("third", SLOW, 1.05))
    record_timing(tmp_path, timing)
    record_timing(tmp_path, timing)  # (the file is read and rewritten: a block efficiency over 1 was dropped)
    assert [r.peers for r in read_timings(tmp_path)] == [timing.peers] * 2  # through the file
    older = JobTiming("GPTConfig", 1.0, 1.0, False, peers=((PEER, FAST, 0.7), ("fourth", FAST, 0.5)))
    assert peer_speeds([older, timing]) == [(PEER, FAST / 2, 0.7), ("third", SLOW, 1.05), ("fourth", FAST, 0.5)]


def test_the_quote_plans_its_peers_at_their_measured_speeds_and_names_the_rest_as_assumed() -> None:
    spec = gpt()
    device = DeviceGuess(FAST, 0.7, 8 << 30, "this device's measured profile", 5e-4, 1e-9, 1e-9)
    alike = offers_for(device, 2, None)
    assert [o.flops_per_s for o in alike] == [FAST, FAST]
    slow = offers_for(device, 3, None, [(PEER, SLOW, 0.5)])
    assert [(o.flops_per_s, o.block_efficiency) for o in slow] == [(FAST, 0.7), (SLOW, 0.5), (FAST, 0.7)]
    as_fast = forecast(spec, offers_for(device, 2, None), "this-device")
    measured = forecast(spec, offers_for(device, 2, None, [(PEER, SLOW, 0.7)]), "this-device")
    assert as_fast.devices == ("this-device", "peer-1")  # a peer as fast helps: planned and paid
    assert measured.devices == ("this-device",) and measured.usd == 0  # a peer 50x slower: a spare, unpaid
    assert "peers" in with_peers(as_fast, 1, 0).assumed
    named = with_peers(measured, 1, 1)
    assert "peers" not in named.assumed and any(line.startswith("peers     measured") for line in named.lines())
    partly = with_peers(measured, 2, 1)
    assert "peers" in partly.assumed and "assumed: 1 of 2 peer(s)" in dict(partly.sources)["peers"]


def test_submit_quote_reads_the_peers_this_daemon_measured(tmp_path: Path) -> None:
    spec = EXAMPLES / "shakespeare-gpt.toml"

    def quote() -> dict[str, Any]:
        out = CliRunner().invoke(
            cli, ["--state-dir", str(tmp_path), "submit", str(spec), "--members", "2", "--quote", "--json"]
        )
        assert out.exit_code == 0, out.output
        return cast(dict[str, Any], json.loads(out.stdout))

    assert "peers" in quote()["assumed"]
    record_timing(tmp_path, JobTiming("MLPConfig", 1.0, 1.0, False, peers=((PEER, 1e6, 0.5),)))
    body = quote()
    assert "peers" not in body["assumed"] and body["forecast"]["devices"] == ["this-device"], body["forecast"]
