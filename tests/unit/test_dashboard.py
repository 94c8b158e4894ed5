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
    job.update(steps_per_s=20.0, eta_s=100.0)  # the daemon's figures (arceusd.jobs.record.throughput): 2000 to go
    text = _text(render_job(job))
    assert "[bold red]evil[/] \\x1b[2J" in text  # neither rich markup nor a terminal escape
    assert "ETA 1m40s" in text and "300/2300" in text and "20.00 steps/s" in text
    assert all(p[:12] in text for p in PEERS)
    assert "0–3" not in text and "[0, 3]" in text  # the split stage's heads
    plan_rows = [[c.strip() for c in line.split("│")] for line in text.splitlines() if " / " in line]
    rows = [(c[c.index(p[:12]) - 2], c[c.index(p[:12]) - 1]) for p in PEERS for c in plan_rows if p[:12] in c]
    assert rows == [("0", "0-1"), ("1", "2"), ("1", "2"), ("2", "3-4")], (
        "blocks as the CLI writes them (arceusd.jobs.record.view.block_range), not the plan's [start, end)"
    )
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

    from arceusd.device.config import ConfigError, load_config

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


# --- issue 31: every number true (terms, prices, the wall clock, the machine) ----------------------------------------
def test_prices_and_counts_are_written_as_the_cli_writes_them() -> None:
    from arceusd.dashboard.data import earnings_view, market_view
    from arceusd.jobs.record.view import count, usd, usd_per_hour
    from arceusd.market.commands import _market_line

    assert usd_per_hour(0.002) == "$0.0020/h" and usd(0.0123456) == "$0.0123" and usd_per_hour(None) == "-"
    assert count(1.0) == "1" and count(3) == "3" and count(True) == "-" and count(float("nan")) == "-"
    row = {
        "job_id": JOB_ID,
        "name": "n",
        "owner": PEERS[1],
        "state": "running",
        "members": 1,
        "max_members": 4,
        "max_price_per_hour": 0.0,
        "price_per_hour": 0.002,
        "qualifies": True,
        "reasons": [],
    }
    view = market_view({"jobs": [row], "demand": {"jobs_wanting": 1, "idle_devices": 0}})
    assert view is not None
    shown = view["jobs"][0]
    assert (shown["price_shown"], shown["max_price_shown"], shown["members_shown"]) == ("$0.0020/h", "any", "1 / 4")
    assert view["demand_shown"] == {"jobs_wanting": "1", "idle_devices": "0"}
    cli_line = _market_line(row)  # `arceusd market` writes the same strings
    assert "$0.0020/h" in cli_line and "members 1/4" in cli_line
    e = earnings_view(
        {
            "total_usd": 0.002,
            "device_hours": 0.5,
            "receipts": 3,
            "by_job": {JOB_ID: 0.002},
            "by_day": {"2025-01-01": 0.002},
        }
    )
    assert e is not None
    assert (e["total_shown"], e["device_hours_shown"], e["receipts_shown"]) == ("$0.0020", "0.500", "3")
    assert e["by_job_shown"] == [[JOB_ID, "$0.0020"]]


def test_the_loss_csv_has_every_history_row_with_its_time() -> None:
    import csv
    import io
    from datetime import datetime

    from arceusd.dashboard.data import loss_csv

    job = synthetic_job(300)
    line = Timeline()
    line.observe({"step": 200, "val_loss": 1.75})
    rows = list(csv.DictReader(io.StringIO(loss_csv(job, line))))
    assert [(int(r["step"]), float(r["loss"])) for r in rows] == [tuple(p) for p in job["history"]]
    for r, at in zip(rows, job["history_at"], strict=True):
        assert abs(datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() - at) < 1e-3
    assert [r["val"] for r in rows if r["val"]] == ["1.75"] and rows[199]["val"] == "1.75"
    job_without_times = {**job, "history_at": []}
    assert all(r["time"] == "" for r in csv.DictReader(io.StringIO(loss_csv(job_without_times, Timeline()))))
    view = job_view(job, Timeline())
    assert view["history_at"] == job["history_at"]  # every drawn point carries its time


def test_the_machine_ring_is_bounded_and_reads_proc() -> None:
    from arceusd.dashboard.data import MachineSamples, cpu_percent, memory_percent

    assert cpu_percent((100, 1000), (150, 1100)) == 50.0 and cpu_percent(None, (1, 2)) is None
    assert cpu_percent((100, 1000), (100, 1000)) is None
    meminfo = "MemTotal:       16000000 kB\nMemFree: 1 kB\nMemAvailable:    4000000 kB\n"
    assert memory_percent(meminfo) == 75.0 and memory_percent("garbage") is None and memory_percent(None) is None
    ring = MachineSamples(limit=5)
    for i in range(8):
        ring.add(1000.0 + i, f"cpu {100 * i} 0 {100 * i} {800 * i} 0 0 0 0 0 0\n", meminfo, 13.861386138613861)
    rows = ring.rows()
    assert len(rows) == 5 and rows[0][0] == 1003.0 and rows[-1] == [1007.0, 20.0, 13.9, 75.0]
    ring.add(1008.0, None, None, None)
    assert ring.rows()[-1] == [1008.0, None, None, None]


def test_the_term_form_and_the_origin_are_checked() -> None:
    import pytest

    from arceusd.dashboard.app import origin_refusal, own_origins
    from arceusd.dashboard.data import term_form

    assert term_form(b"key=idle_minutes&value=10") == ("idle_minutes", "10")
    assert term_form(b"key=hours&value=%5B22%2C+7%5D") == ("hours", "[22, 7]")
    for body, said in (
        (b"key=probe_root&value=%2Ftmp", "not a term the page may change"),
        (b"key=idle_minutes&value=", "1 to 400 printable"),
        (b"key=idle_minutes&value=1%0Aw%3D2", "printable"),
        (b"key=idle_minutes&value=" + b"1" * 401, "1 to 400"),
        (b"key=a&key=b&value=1", "one key and one value"),
        (b"\xff", "URL-encoded"),
    ):
        with pytest.raises(ValueError, match=said):
            term_form(body)
    assert own_origins(("127.0.0.1", 8080)) == {"http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"}
    assert origin_refusal("http://127.0.0.1:8080", None, ("127.0.0.1", 8080)) is None
    assert origin_refusal(None, "http://localhost:8080/tok/owner", ("127.0.0.1", 8080)) is None
    assert "may not change" in str(origin_refusal("http://evil.example", None, ("127.0.0.1", 8080)))
    assert "may not change" in str(origin_refusal("http://127.0.0.1:8081", None, ("127.0.0.1", 8080)))
    assert "may not change" in str(origin_refusal("null", None, ("127.0.0.1", 8080)))
    assert "names no origin" in str(origin_refusal(None, None, ("127.0.0.1", 8080)))


def _post(url: str, body: bytes, origin: str | None) -> tuple[int, str]:
    headers = {"content-type": "application/x-www-form-urlencoded"} | ({"origin": origin} if origin else {})
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_term_is_changed_only_from_the_dashboards_own_origin_and_a_bad_value_changes_nothing() -> None:
    def check(origin: str, snapshots: Any) -> None:
        url = origin + "/tok-123/policy"
        assert _post(url, b"key=idle_minutes&value=10", "http://evil.example")[0] == 403
        assert _post(url, b"key=idle_minutes&value=10", None)[0] == 403
        assert _post(origin + "/policy", b"key=idle_minutes&value=10", origin)[0] == 403  # no token
        assert snapshots.policy.idle_minutes == 0.0
        status, line = _post(url, b"key=idle_minutes&value=-1", origin)
        assert status == 400 and line.count("\n") == 0
        assert "policy.idle_minutes: must be a number >= 0, got -1.0" in line and "nothing was changed" in line
        assert _post(url, b"key=max_cores&value=two", origin)[0] == 400
        assert snapshots.policy.idle_minutes == 0.0 and snapshots.policy.max_cores == 0
        assert _post(url, b"key=idle_minutes&value=10", origin) == (200, "saved: policy.idle_minutes = 10")
        assert snapshots.policy.idle_minutes == 10.0
        assert _get(url)[0] == 405  # reading never changes anything
        status, headers, body = _get(origin + f"/tok-123/job/{JOB_ID}/loss.csv")
        assert status == 200 and headers["content-type"].startswith("text/csv")
        assert headers["content-disposition"] == f'attachment; filename="loss-{JOB_ID[:12]}.csv"'
        assert body.decode().splitlines()[0] == "step,time,loss,val" and len(body.decode().splitlines()) == 301
        assert _get(origin + "/tok-123/job/ffff/loss.csv")[0] == 404

    _serve(check)


def test_a_finished_jobs_standby_is_not_syncing() -> None:
    """Issue 31: after the job ended the job page still wrote "(syncing)" beside the standby (nothing is synced
    after the end). The note is the view's (``job_view``'s ``standby_note``); the page writes it and has no rule
    of its own."""
    standby = "b" * 32
    running = {"job_id": JOB_ID, "state": "running", "standby": standby, "standby_ready": False, "history": []}
    assert job_view(running, Timeline())["standby_note"] == "syncing"
    assert job_view({**running, "standby_ready": True}, Timeline())["standby_note"] == "ready"
    for ended in ("done", "failed", "cancelled"):
        for ready in (False, True):
            view = job_view({**running, "state": ended, "standby_ready": ready}, Timeline())
            assert view["standby_note"] == "", (ended, ready)
    assert job_view({**running, "standby": ""}, Timeline())["standby_note"] == "", "no standby, no note"
    page = (Path(__file__).parents[2] / "arceusd" / "dashboard" / "static" / "app.js").read_text()
    assert "job.standby_note" in page and "syncing" not in page, "the page writes the view's note"
