"""The quote that holds (issue 31): the forecast's time follows the planner's step prediction over the devices
that would take the job, its range holds the point, the owner's device is not billed, and ``submit --quote
--json`` gives the same figures; a running job's spend and cost to finish, as status and ``--watch`` show them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from arceusd.cli.commands import cli
from arceusd.jobs.plans.planning import Offer, make_job_plan
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.jobs.spec.schema import load_spec
from arceusd.market.admission import Spend
from arceusd.market.forecast import (
    CHECKPOINT_S,
    END_S,
    FIRST_JOB_S,
    START_S,
    UNBILLED_START_S,
    count_checkpoints,
    count_evals,
    end_seconds,
    forecast,
    step_factor,
)
from arceusd.market.needs import pay
from arceusd.market.progress import cost_progress
from partitioner import Link
from tests.unit.test_jobspec import EXAMPLES

OWNER, PEER = "owner", "peer"
FAST = 60e9


def gpt() -> JobSpec:
    return load_spec(EXAMPLES / "shakespeare-gpt.toml")


def offer(peer: str, flops: float = FAST) -> Offer:
    return Offer(peer, "", flops, 8 << 30, "cpu", 0.7, 5e-4, 1e-9, 1e-9)


def test_the_time_is_the_planners_step_time_times_the_steps_plus_the_measured_overheads() -> None:
    spec = gpt()
    offers = [offer(OWNER)]
    f = forecast(spec, offers, OWNER)
    _, rp = make_job_plan(spec, offers, {}, leader=OWNER)
    assert f.predicted_step_s == rp.predicted_step_time_s
    t = spec.training
    expected = START_S + t.steps * f.step_s + f.checkpoints * CHECKPOINT_S + f.evals * f.eval_s + end_seconds(spec)
    assert f.seconds == pytest.approx(expected)
    assert f.checkpoints == 8 and f.evals == 8  # 2000 steps, checkpoints and evals every 250
    assert f.step_s == pytest.approx(rp.predicted_step_time_s * step_factor(spec)) and step_factor(spec) > 1
    assert f.seconds > t.steps * rp.predicted_step_time_s  # not the old perfect-pipeline lower bound


def test_a_slower_device_or_a_slower_link_raises_the_time() -> None:
    spec = gpt()
    base = forecast(spec, [offer(OWNER), offer(PEER)], OWNER)
    slow_device = forecast(spec, [offer(OWNER, FAST / 4), offer(PEER, FAST / 4)], OWNER)
    assert slow_device.seconds > 2 * base.seconds
    assert len(base.devices) == 2  # the planner gives the peer work over the default links
    slow = {(OWNER, PEER): Link(0.2, 1e5, 0.0)}  # 200 ms, 100 kB/s: the peer no longer pays its way
    slow_link = forecast(spec, [offer(OWNER), offer(PEER)], OWNER, links=slow)
    assert slow_link.seconds > base.seconds
    assert (
        slow_link.predicted_step_s
        == make_job_plan(spec, [offer(OWNER), offer(PEER)], {}, slow, OWNER)[1].predicted_step_time_s
    )


def test_the_range_holds_the_point_and_the_owners_device_is_not_billed() -> None:
    spec = gpt()
    f = forecast(spec, [offer(OWNER), offer(PEER)], OWNER)
    assert f.low_s < f.seconds < f.high_s and f.low_usd < f.usd < f.high_usd
    assert [p.peer_id for p in f.paid] == [PEER]
    price = pay(FAST, 0.0)
    assert f.usd == pytest.approx((f.seconds - UNBILLED_START_S - end_seconds(spec)) * price / 3600.0)
    first = forecast(spec, [offer(OWNER), offer(PEER)], OWNER, first_job=True)  # its wait is before the book starts
    assert first.seconds == pytest.approx(f.seconds + FIRST_JOB_S) and first.usd == pytest.approx(f.usd)
    alone = forecast(spec, [offer(OWNER)], OWNER)
    assert alone.paid == () and alone.usd == 0.0 and alone.high_usd == 0.0


def test_checkpoints_and_evals_are_counted_as_the_worker_takes_them() -> None:
    for steps, ci, ei in [(310, 50, 31), (150, 50, 50), (300, 100, 0), (7, 0, 3), (10, 0, 0), (12, 5, 4)]:
        ckpt = {s for s in range(1, steps + 1) if s == steps or (ci and s % ci == 0)}
        evals = ckpt | {s for s in range(1, steps + 1) if ei and s % ei == 0}
        assert count_checkpoints(steps, ci) == len(ckpt), (steps, ci)
        assert count_evals(steps, ci, ei) == len(evals), (steps, ci, ei)


def test_submit_quote_json_gives_the_forecast(tmp_path: Path) -> None:
    runner = CliRunner()
    spec = str(EXAMPLES / "shakespeare-gpt.toml")
    out = runner.invoke(cli, ["--state-dir", str(tmp_path), "submit", spec, "--members", "2", "--quote", "--json"])
    assert out.exit_code == 0, out.output
    body = json.loads(out.stdout)
    assert body["devices"] == 2 and body["forecast"]["steps"] == 2000
    assert body["low_s"] < body["seconds"] < body["high_s"] and body["low_usd"] <= body["usd"] <= body["high_usd"]
    assert body["seconds"] == body["forecast"]["seconds"] > body["lower_bound"]["seconds"]
    text = runner.invoke(cli, ["--state-dir", str(tmp_path), "submit", spec, "--quote"])
    assert text.exit_code == 0 and "time " in text.stdout and "predicted" in text.stdout and " to " in text.stdout
    refused = runner.invoke(cli, ["--state-dir", str(tmp_path), "submit", spec, "--json"])
    assert refused.exit_code != 0 and "--json goes with --quote" in refused.output


def test_a_running_jobs_cost_to_finish_is_its_measured_cost_per_step_times_the_steps_left() -> None:
    p = cost_progress(Spend(0.002, 0.00001), 0.01, 100, 300, 40.0, running=True)
    assert p.spent_usd == 0.002 and p.remaining_budget_usd == pytest.approx(0.008)
    assert p.to_finish_usd == pytest.approx(0.002) and p.at_finish_usd == pytest.approx(0.004)
    assert p.to_finish_s == pytest.approx(40.0 + END_S)
    assert "spent $0.002000" in p.line() and "$0.008000 left" in p.line() and "$0.002000 more" in p.line()
    unpaid = cost_progress(Spend(0.0, 0.0), 0.0, 10, 300, None, running=True)
    assert unpaid.to_finish_usd is None and unpaid.remaining_budget_usd is None and unpaid.to_finish_s is None
    assert "unknown until a checkpoint is paid" in unpaid.line() and "no budget set" in unpaid.line()
    free = cost_progress(Spend(0.0, 0.0), 0.0, 100, 300, 40.0, running=True, committed=True)  # no paid device
    assert free.to_finish_usd == 0.0 and "$0.000000 more" in free.line()
    done = cost_progress(Spend(0.004, 0.00001), 0.0, 300, 300, None, running=False)
    assert done.to_finish_usd == 0.0 and done.at_finish_usd == pytest.approx(0.004)


def test_status_and_watch_show_the_leaders_cost_figures() -> None:
    from rich.console import Console

    from arceusd.dashboard.watch import render_job as rich_job
    from arceusd.jobs.record.view import render_job

    p = cost_progress(Spend(0.002, 0.00001), 0.01, 100, 300, 40.0, running=True)
    job: dict[str, Any] = {
        "job_id": "ab" * 16,
        "name": "g",
        "model": "gpt",
        "data": "text",
        "state": "running",
        "term": 1,
        "epoch": 1,
        "role": "owner",
        "step": 100,
        "total_steps": 300,
        "cost": {**asdict(p), "line": p.line()},
    }
    assert f"  cost     {p.line()}" in render_job(job).splitlines()
    console = Console(width=200, record=True)
    console.print(rich_job(job))
    assert "spent $0.002000" in console.export_text()
    assert "cost " not in render_job({**job, "cost": None})


def test_the_job_method_gives_the_cost_figures_on_the_leader_only() -> None:
    from types import SimpleNamespace

    from arceusd.jobs.record.throughput import Speed
    from arceusd.market.progress import job_cost

    class Market:
        def __init__(self) -> None:
            self.books: dict[str, object] = {}

        def spend(self, _job: object) -> Spend:
            return Spend(0.001, 0.00002)

    job = SimpleNamespace(
        job_id="j1",
        leader="me",
        state="running",
        step=50,
        total_steps=150,
        spec=SimpleNamespace(needs=SimpleNamespace(budget_usd=0.01), model=None),
        speed=lambda: Speed(eta_s=30.0),
    )
    node = SimpleNamespace(market=Market(), identity=SimpleNamespace(peer_id="me"))
    cost = job_cost(node, job)
    assert cost is not None and cost["to_finish_usd"] == pytest.approx(0.002) and cost["spent_usd"] == 0.001
    assert cost["remaining_budget_usd"] == pytest.approx(0.009) and cost["to_finish_s"] == pytest.approx(30 + END_S)
    assert job_cost(SimpleNamespace(market=Market(), identity=SimpleNamespace(peer_id="other")), job) is None
    assert job_cost(SimpleNamespace(market=None, identity=SimpleNamespace(peer_id="me")), job) is None
