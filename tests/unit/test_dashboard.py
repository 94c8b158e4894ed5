"""The dashboard's pure parts and its web app in-process (hypercorn on trio over real loopback HTTP, a synthetic
snapshot provider): history downsampling, the timeline, the token gate, escaping, JSON and server-sent events,
and the terminal's live view."""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import trio
from rich.console import Console

from arceusd.dashboard.app import build_app
from arceusd.dashboard.data import Timeline, downsample, job_view
from arceusd.dashboard.watch import fmt_eta, render_job, render_status


def _bench() -> ModuleType:
    """bench/dashboard.py: its synthetic snapshot provider (a job with a long history) serves these tests too."""
    path = Path(__file__).parents[2] / "bench" / "dashboard.py"
    spec = importlib.util.spec_from_file_location("dashboard_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dashboard_bench"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()
JOB_ID: str = bench.JOB_ID
PEERS: list[str] = bench.PEERS
SyntheticSnapshots = bench.SyntheticSnapshots
synthetic_job = bench.synthetic_job


def test_downsample_keeps_every_point_when_few() -> None:
    points = [[s, 1.0 / s] for s in range(1, 201)]
    assert downsample(points, 2000) == [[float(s), 1.0 / s] for s in range(1, 201)]


def test_downsample_bounds_a_long_history_and_keeps_its_extremes() -> None:
    points = [[s, 2.0 + (s % 7) / 10] for s in range(1, 10_001)]
    points[4321][1] = 9.0  # a spike
    points[777][1] = -1.0  # a dip
    out = downsample(points, 1000)
    assert len(out) <= 1001
    assert out[0] == [1.0, 2.1] and out[-1] == [10_000.0, points[-1][1]]
    assert [4322.0, 9.0] in out and [778.0, -1.0] in out
    assert [p[0] for p in out] == sorted(p[0] for p in out)


def test_downsample_drops_non_finite_losses() -> None:
    assert downsample([[1, 1.0], [2, float("nan")], [3, float("inf")], [4, 0.5]], 10) == [[1.0, 1.0], [4.0, 0.5]]


def test_timeline_records_validation_as_it_changes_and_checkpoints_come_from_the_job_record() -> None:
    line = Timeline()
    for step, val in ((10, None), (100, 2.0), (150, 2.0), (200, 1.5), (200, 1.5)):
        line.observe({"step": step, "val_loss": val, "committed_step": 0})
    assert list(line.val) == [(100, 2.0), (200, 1.5)]
    # the page opened late: the job record's checkpoints are drawn, whatever this dashboard saw change
    record = [{"step": 100, "at": 1.7e9}, {"step": 200, "at": 1.7e9 + 60}, {"step": "x", "at": 0}, {"step": True}, 3]
    view = job_view({"job_id": "j", "history": [[1, 2.0]], "committed_step": 200, "checkpoints": record}, line)
    assert view["val_history"] == [[100, 2.0], [200, 1.5]] and view["history_points"] == 1
    assert view["checkpoints"] == [{"step": 100, "at": 1.7e9}, {"step": 200, "at": 1.7e9 + 60}]
    assert job_view({"job_id": "j", "checkpoints": "junk"}, Timeline())["checkpoints"] == []


def _serve(check: Callable[[str, Any], None], steps: int = 300) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    snapshots = SyntheticSnapshots(steps)

    async def main() -> None:
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, build_app(snapshots, "tok-123"), config)
            origin = binds[0]
            await trio.to_thread.run_sync(check, origin, snapshots)
            nursery.cancel_scope.cancel()

    trio.run(main)


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_only_the_token_opens_the_dashboard() -> None:
    def check(origin: str, _s: Any) -> None:
        assert _get(origin + "/tok-123/")[0] == 200
        assert _get(origin + "/tok-123")[0] == 200  # redirected to the slash
        for path in ("/", "/api/swarm", "/tok-12/api/swarm", "/tok-1234/api/swarm", "/TOK-123/", "/x/tok-123/"):
            status, _, body = _get(origin + path)
            assert status == 403 and b"token" in body, path

    _serve(check)


def test_pages_escape_what_the_url_holds_and_forbid_other_hosts() -> None:
    def check(origin: str, _s: Any) -> None:
        status, headers, body = _get(origin + "/tok-123/job/%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
        assert status == 200
        assert b"<img" not in body and b'data-job="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"' in body
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "http" not in csp
        assert headers["referrer-policy"] == "no-referrer"
        for name in ("app.js", "style.css"):
            status, _, asset = _get(origin + f"/tok-123/static/{name}")
            assert status == 200 and b"http://" not in asset.replace(b"http://www.w3.org/2000/svg", b"")
            assert b"https://" not in asset
        assert _get(origin + "/tok-123/static/../data.py")[0] == 404

    _serve(check)


def test_the_job_endpoint_bounds_a_long_history() -> None:
    def check(origin: str, _s: Any) -> None:
        status, headers, body = _get(origin + f"/tok-123/api/job?id={JOB_ID}")
        view = json.loads(body)
        assert status == 200 and headers["cache-control"] == "no-store"
        assert view["history_points"] == 10_000 and 500 <= len(view["history"]) <= 2001
        assert view["history"][-1] == [10_000.0, synthetic_job(10_000)["history"][-1][1]]
        small = json.loads(_get(origin + f"/tok-123/api/job?id={JOB_ID}&points=100")[2])
        assert len(small["history"]) <= 101
        assert _get(origin + "/tok-123/api/job?id=ffff")[0] == 404
        assert _get(origin + "/tok-123/api/nothing")[0] == 404

    _serve(check, steps=10_000)


def test_events_push_a_new_step() -> None:
    def check(origin: str, snapshots: Any) -> None:
        with urllib.request.urlopen(origin + f"/tok-123/events/job?id={JOB_ID}", timeout=10) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            first = json.loads(resp.readline().decode().removeprefix("data: "))
            assert resp.readline() == b"\n"
            snapshots.advance(0.5)
            second = json.loads(resp.readline().decode().removeprefix("data: "))
        assert second["step"] == first["step"] + 1 and second["history"][-1] == [second["step"], 0.5]

    _serve(check)


def _text(renderable: Any) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_terminal_view_draws_the_job_with_a_progress_bar_and_eta() -> None:
    job = synthetic_job(300)
    job["name"] = "[bold red]evil[/] \x1b[2J"
    job.update(steps_per_s=20.0, eta_s=100.0)  # the daemon's figures (arceusd.jobs.throughput): 2000 to go
    text = _text(render_job(job))
    assert "[bold red]evil[/] \\x1b[2J" in text  # neither rich markup nor a terminal escape
    assert "ETA 1m40s" in text and "300/2300" in text and "20.00 steps/s" in text
    assert all(p[:12] in text for p in PEERS)
    assert "0–3" not in text and "[0, 3]" in text  # the split stage's heads
    plan_rows = [[c.strip() for c in line.split("│")] for line in text.splitlines() if " / " in line]
    rows = [(c[c.index(p[:12]) - 2], c[c.index(p[:12]) - 1]) for p in PEERS for c in plan_rows if p[:12] in c]
    assert rows == [("0", "0-1"), ("1", "2"), ("1", "2"), ("2", "3-4")], \
        "blocks as the CLI writes them (arceusd.jobs.view.block_range), not the plan's [start, end)"
    for i, p in enumerate(PEERS):  # every device's row: its measured compute / wait per step
        row = next(line for line in text.splitlines() if p[:12] in line and " / " in line)
        assert f"{(0.09 + 0.01 * i) * 1000:.1f} / {(0.03 - 0.005 * i) * 1000:.1f}" in row, row


def test_the_terminal_view_of_the_daemon_lists_peers_and_jobs() -> None:
    status = trio.run(SyntheticSnapshots(50).status)
    text = _text(render_status(status))
    assert all(p[:12] in text for p in PEERS[1:]) and "alive" in text and "ETA -" in text


def test_eta_formats() -> None:
    assert fmt_eta(None) == "ETA -" and fmt_eta(3725) == "ETA 1h02m" and fmt_eta(100.0) == "ETA 1m40s"


def test_the_dashboard_config_keys(tmp_path: Path) -> None:
    import pytest

    from arceusd.config import ConfigError, load_config

    assert (load_config(tmp_path).dashboard_host, load_config(tmp_path).dashboard_port) == ("127.0.0.1", 0)
    (tmp_path / "config.toml").write_text('dashboard_host = "0.0.0.0"\ndashboard_port = 8765\n')
    config = load_config(tmp_path)
    assert (config.dashboard_host, config.dashboard_port) == ("0.0.0.0", 8765)
    (tmp_path / "config.toml").write_text("dashboard_port = 70000\n")
    with pytest.raises(ConfigError, match=r"dashboard_port must be in 0\.\.65535"):
        load_config(tmp_path)
    (tmp_path / "config.toml").write_text('dashboard_port = "80"\n')
    with pytest.raises(ConfigError, match="dashboard_port must be int"):
        load_config(tmp_path)
