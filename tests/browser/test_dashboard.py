"""The dashboard end to end: two real daemons train a job, a real headless Chromium (Debian's, driven by
Playwright) watches it through ``arceusd dashboard``'s URL.

What fails here when the feature breaks: the token check (403 without it), live updates (a new step drawn
without a reload within 2 s), the plan drawing (every device named, each with its measured compute and waiting),
the loss curve (its points are those of ``status JOB --json``'s history, read back from the SVG's coordinates),
the timeline (a mark for each checkpoint of the job's record, those committed before the page opened too), the
device page (each lending term and whether it holds; a term changed from the page is what ``arceusd policy``
shows, a bad value changes nothing; a cross-origin or token-less POST is refused; CPU and memory over time), the
market page's prices as ``arceusd market`` writes them, the loss chart's wall-clock axis and its CSV (the rows of
``status JOB --json``'s history), and every page drawing at all (a screenshot of each under the test's
temporary folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arceusd.cli.swarm import LocalSwarm, free_ports
from tests.harness import wait_for

CHROMIUM = "/usr/bin/chromium"
SPEC = Path(__file__).parent / "specs" / "mnist-dashboard.toml"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' installs Playwright")
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does)", allow_module_level=True)


def cli(state_dir: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arceusd", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CI": "1"},
    )


class Setup:
    def __init__(self, swarm: LocalSwarm, job_id: str, url: str, shots: Path, other_url: str = "") -> None:
        self.swarm, self.job_id, self.url, self.shots = swarm, job_id, url, shots
        self.other_url = other_url  # daemon 1's dashboard (a member: the job is announced to it by another)

    def job(self) -> dict[str, Any]:
        done = cli(self.swarm.state_dir(0), "status", self.job_id, "--json")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("dashboard")
    swarm = LocalSwarm(root, 2, ["--auto-join"], preset="lan")
    port = free_ports(1)[0]  # daemon 0's owner chose the dashboard's port in config.toml; daemon 1 takes any
    swarm.state_dir(0).mkdir(parents=True)
    (swarm.state_dir(0) / "config.toml").write_text(f"dashboard_port = {port}\n")
    try:
        swarm.start()
        assert swarm.call(0, "status")["dashboard"] == {"running": False, "host": "127.0.0.1", "port": None}
        swarm.wait_converged()
        submitted = cli(swarm.state_dir(0), "submit", str(SPEC), "--members", "2")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[2]
        shown = cli(swarm.state_dir(0), "dashboard", "--no-open")
        assert shown.returncode == 0, shown.stderr
        url = shown.stdout.strip()
        assert url.startswith(f"http://127.0.0.1:{port}/") and len(url.rstrip("/").rsplit("/", 1)[1]) >= 24, url
        assert swarm.call(0, "status")["dashboard"] == {"running": True, "host": "127.0.0.1", "port": port}
        other = json.loads(cli(swarm.state_dir(1), "dashboard", "--json").stdout)
        assert other["port"] not in (0, port) and other["url"].split("/")[-2] != url.split("/")[-2], "own token"
        wait_for(lambda: swarm.call(0, "job", {"job_id": job_id})["step"] >= 20 or None, 180, 0.5, "training steps")
        yield Setup(swarm, job_id, url, root / "screenshots", other["url"])
    finally:
        swarm.close()


@pytest.fixture(scope="module")
def browser(setup: Setup) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_request_without_the_token_is_refused(setup: Setup) -> None:
    origin = setup.url.split("/", 3)
    base = f"{origin[0]}//{origin[2]}"
    token = setup.url.rstrip("/").rsplit("/", 1)[1]
    assert _status(setup.url) == 200
    assert _status(setup.url + "api/swarm") == 200
    for path in (
        "/",
        "/api/swarm",
        f"/job/{setup.job_id}",
        "/static/app.js",
        "/events/swarm",
        "/" + token[:-1] + "/api/swarm",
        "/" + token.upper() + "/api/swarm",
        f"/x/{token}/api/swarm",
    ):
        assert _status(base + path) == 403, path


def test_a_new_step_appears_without_a_reload_within_2s(setup: Setup, browser: Any) -> None:
    page = browser.new_page()
    page.goto(setup.url + f"job/{setup.job_id}")
    page.wait_for_selector("#train-curve")
    page.evaluate("window.__sameDocument = true")
    first = page.inner_text("#step")
    t0 = time.monotonic()
    page.wait_for_function(
        "(first) => document.querySelector('#step') && document.querySelector('#step').textContent !== first",
        arg=first,
        timeout=2000,
    )
    assert time.monotonic() - t0 < 2.0
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1
    assert int(page.inner_text("#step").split("/")[0]) > int(first.split("/")[0])
    # the daemon's loop stays responsive while it streams the page and trains
    t0 = time.monotonic()
    for _ in range(5):
        setup.swarm.call(0, "status")
    assert (time.monotonic() - t0) / 5 < 0.5
    assert "torch" not in setup.swarm.call(0, "modules")["packages"], "serving the dashboard loaded torch"
    page.close()


def test_the_plan_drawing_names_every_device(setup: Setup, browser: Any) -> None:
    page = browser.new_page()
    page.goto(setup.url + f"job/{setup.job_id}")
    page.wait_for_selector("#plan")
    job = setup.job()
    placed = {d["peer_id"] for s in job["plan"]["stages"] for d in s["devices"]}
    members = {setup.swarm.call(i, "status")["peer_id"] for i in range(2)}
    assert placed == members
    names = page.eval_on_selector_all("#plan .device-name", "els => els.map(e => e.textContent)")
    assert sorted(names) == sorted(p[:12] for p in placed)
    assert page.inner_text("h1").startswith("dashboard-test")
    page.close()


def _checkpoint_marks(page: Any) -> list[int]:
    """The steps of the checkpoint marks on the loss chart's timeline."""
    marks = page.eval_on_selector_all("#loss-chart line.ckpt", "els => els.map(e => e.getAttribute('data-step'))")
    return [int(m) for m in marks]


def _timings(page: Any) -> dict[str, dict[str, Any]]:
    """Each device's compute/wait figure in the plan drawing, by its full peer id."""
    rows = page.eval_on_selector_all(
        "#plan .timing",
        "els => els.map(e => [e.getAttribute('data-peer'), "
        "e.getAttribute('data-compute-s'), e.getAttribute('data-wait-s'), "
        "e.querySelectorAll('rect.compute').length, e.textContent])",
    )
    return {r[0]: {"compute_s": r[1], "wait_s": r[2], "bars": r[3], "text": r[4]} for r in rows}


def test_the_timeline_has_every_recorded_checkpoint_and_the_plan_every_devices_compute_and_wait(
    setup: Setup, browser: Any
) -> None:
    """Checkpoints committed while no page was open are drawn (they come from the job's record, not from what
    the dashboard saw), and every device of the plan shows its measured compute against its waiting."""

    def ready() -> dict[str, Any] | None:
        job = setup.job()
        placed = {d["peer_id"] for s in job["plan"]["stages"] for d in s["devices"]}
        times = job.get("stage_times") or {}
        measured = all(isinstance((times.get(p) or {}).get("wait_s"), float) for p in placed)
        return job if len(job["checkpoints"]) >= 2 and measured else None

    before = wait_for(ready, 240, 1.0, "two checkpoints committed and every device measured")
    placed = {d["peer_id"] for s in before["plan"]["stages"] for d in s["devices"]}
    assert [c["step"] for c in before["checkpoints"]] == sorted({c["step"] for c in before["checkpoints"]})
    assert all(c["step"] % 100 == 0 and c["at"] > time.time() - 600 for c in before["checkpoints"])
    page = browser.new_page()
    page.goto(setup.url + f"job/{setup.job_id}")
    page.wait_for_selector("#loss-chart line.ckpt", state="attached")
    marks, timings = _checkpoint_marks(page), _timings(page)
    after = setup.job()
    page.close()
    assert {c["step"] for c in before["checkpoints"]} <= set(marks), (before["checkpoints"], marks)
    assert set(marks) <= {c["step"] for c in after["checkpoints"]}
    assert set(timings) == placed, (timings, placed)
    for peer, drawn in timings.items():
        seen = [(j["stage_times"][peer]["compute_s"], j["stage_times"][peer]["wait_s"]) for j in (before, after)]
        assert drawn["compute_s"] is not None and drawn["wait_s"] is not None, (peer, drawn)
        got = (float(drawn["compute_s"]), float(drawn["wait_s"]))
        # live figures move with each step (this device) or report (the others): the same quantity, not a copy
        # (they are compared exactly once the job is stopped, below)
        for g, v in ((got[0], [c for c, _ in seen]), (got[1], [w for _, w in seen])):
            assert min(v) / 4 <= g <= max(v) * 4 + 1e-3, (peer, got, seen)
        assert got[0] > 0 and drawn["bars"] == 1 and "compute" in str(drawn["text"]) and "wait" in str(drawn["text"])
    # the terminal's view shows them too
    shown = cli(setup.swarm.state_dir(0), "status", setup.job_id)
    assert shown.returncode == 0, shown.stderr
    assert all(f"{p[:12]} (stage" in shown.stdout and "waiting per step" in shown.stdout for p in placed), shown.stdout


def _curve(page: Any) -> list[tuple[float, float]]:
    """The drawn training curve read back as (step, loss), inverting the chart's scales."""
    box = page.eval_on_selector("#loss-chart", "e => Object.fromEntries([...e.attributes].map(a => [a.name, a.value]))")
    x0, x1, y0, y1 = (float(box[k]) for k in ("data-x0", "data-x1", "data-y0", "data-y1"))
    left, right, top, bottom = (float(box[k]) for k in ("data-left", "data-right", "data-top", "data-bottom"))
    points = page.get_attribute("#train-curve", "points").split()
    out = []
    for pair in points:
        px, py = (float(v) for v in pair.split(","))
        out.append((x0 + (px - left) / (right - left) * (x1 - x0), y1 - (py - top) / (bottom - top) * (y1 - y0)))
    return out


def _terms(page: Any) -> dict[str, tuple[str, str, str]]:
    """The device page's terms: key -> (what it asks, what the machine shows now, met / not met / per job)."""
    rows = page.eval_on_selector_all(
        "#terms tbody tr",
        "els => els.map(e => [e.getAttribute('data-key'), ...[...e.querySelectorAll('td')].map(td => td.textContent)])",
    )
    return {r[0]: (r[1], r[3], r[4]) for r in rows}


def _policy(setup: Setup) -> dict[str, Any]:
    shown = cli(setup.swarm.state_dir(0), "policy", "--json")
    assert shown.returncode == 0, shown.stderr
    policy: dict[str, Any] = json.loads(shown.stdout)["policy"]
    return policy


def _set_term(page: Any, key: str, value: str) -> str:
    """Change a term with the device page's form; the line the dashboard answered."""
    page.evaluate("document.querySelector('#term-result').textContent = ''")
    page.select_option("#term-key", key)
    page.fill("#term-value", value)
    page.click("#term-form button")
    page.wait_for_function("() => document.querySelector('#term-result').textContent !== ''", timeout=10_000)
    return str(page.inner_text("#term-result"))


def test_the_device_page_shows_each_term_whether_it_holds_and_changes_one_as_policy_set_does(
    setup: Setup, browser: Any
) -> None:
    """Issue 31: the lending terms, not raw readings; a term changed from the page is what `arceusd policy`
    then shows (the same checks: a bad value is refused in one line and changes nothing); the machine's CPU and
    memory over time. Daemon 0 owns the job, so its own hours do not take it off its job (owner_is_back leaves
    only jobs it is a member of); they are set back at the end."""
    from arceusd.dashboard.data import EDITABLE_TERMS

    page = browser.new_page()
    page.goto(setup.url + "owner")
    page.wait_for_selector('#terms tr[data-key="hours"]')
    terms = _terms(page)
    assert set(terms) == set(EDITABLE_TERMS), terms
    assert terms["hours"] == ("hours: any", terms["hours"][1], "met")
    cpu = terms["max_owner_cpu_percent"]
    assert cpu[0] == "owner's own CPU use at most 100%" and cpu[2] == "met", cpu
    assert cpu[1] == "not measured yet (passes)" or (cpu[1].startswith("owner CPU ") and cpu[1].endswith("% <= 100%"))
    assert terms["min_price_per_hour"][0] == "floor price $0.0000/h"
    text = page.inner_text("main")
    assert "owner cpu percent" not in text and "idle s" not in text and "null" not in text
    # the machine over time: several readings of all CPU use, the owner's own and memory (a bounded ring)
    page.wait_for_function(
        "() => Number(document.querySelector('#machine-chart').getAttribute('data-count')) >= 3", timeout=15_000
    )
    assert page.eval_on_selector("#machine-chart polyline.cpu-all", "e => Number(e.getAttribute('data-count'))") >= 2
    assert page.eval_on_selector("#machine-chart polyline.memory", "e => Number(e.getAttribute('data-count'))") >= 2
    # a term changed from the page: hours that exclude the present hour (for the next two hours at least)
    hour = time.localtime().tm_hour
    span = [(hour + 2) % 24, (hour + 3) % 24]
    try:
        assert _set_term(page, "hours", json.dumps(span)) == f"saved: policy.hours = {json.dumps(span)}"
        assert _policy(setup)["hours"] == span
        page.wait_for_function(
            "() => document.querySelector('#terms tr[data-key=\"hours\"] td.met').textContent === 'not met'",
            timeout=10_000,
        )
        now = _terms(page)["hours"]
        assert now[0] == f"hours {span[0]}-{span[1]} (local, end excluded)" and " not in " in now[1], now
        assert page.inner_text("#lends-now") == "no"
        # a bad value: one line saying what is wrong and what is allowed; nothing changes
        said = _set_term(page, "idle_minutes", "-1")
        assert said.count("\n") == 0 and "policy.idle_minutes: must be a number >= 0" in said, said
        assert "nothing was changed" in said and page.get_attribute("#term-result", "class") == "no"
        assert _policy(setup)["idle_minutes"] == 0.0 and _policy(setup)["hours"] == span
        said = _set_term(page, "max_cores", "two")
        assert "policy.max_cores must be an integer" in said and _policy(setup)["max_cores"] == 0
    finally:
        assert _set_term(page, "hours", "[]") == "saved: policy.hours = []"
    assert _policy(setup)["hours"] == []
    page.wait_for_function(
        "() => document.querySelector('#terms tr[data-key=\"hours\"] td.met').textContent === 'met'", timeout=10_000
    )
    page.close()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/x-www-form-urlencoded", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_cross_origin_or_token_less_post_changes_no_term(setup: Setup, browser: Any) -> None:
    origin = "/".join(setup.url.split("/", 3)[:3])  # http://127.0.0.1:PORT, the dashboard's own
    change = b"key=unpaid_checkpoints&value=7"
    before = _policy(setup)["unpaid_checkpoints"]
    for headers in (
        {"origin": "http://evil.example"},
        {"referer": "http://evil.example/page"},
        {"origin": "null"},
        {},
        {"origin": setup.other_url.rsplit("/", 2)[0]},
    ):
        status, line = _post(setup.url + "policy", change, headers)
        assert status == 403 and line.startswith("403: ") and "\n" not in line.strip(), (headers, status, line)
    status, line = _post(origin + "/policy", change, {"origin": origin})  # the right origin, no token
    assert status == 403 and "token" in line
    # a page of another origin in the browser: its POST carries that origin and is refused
    page = browser.new_page()
    page.goto("about:blank")
    page.evaluate(
        "(url) => fetch(url, {method: 'POST', mode: 'no-cors', body: new URLSearchParams("
        "{key: 'unpaid_checkpoints', value: '7'})}).catch(() => null)",
        setup.url + "policy",
    )
    page.close()
    assert _policy(setup)["unpaid_checkpoints"] == before != 7


def test_the_market_page_writes_prices_and_counts_as_the_cli(setup: Setup, browser: Any) -> None:
    """On daemon 1 the job is announced by another device: its price and members read as `arceusd market`."""
    page = browser.new_page()
    page.goto(setup.other_url + "market")
    page.wait_for_selector("td.price")
    for _ in range(5):  # the price follows the demand: the page and the CLI read at nearly the same time
        price = page.inner_text("td.price")
        shown = cli(setup.swarm.state_dir(1), "market")
        assert shown.returncode == 0, shown.stderr
        line = next(x for x in shown.stdout.splitlines() if x.startswith(setup.job_id[:12]))
        if f"  {price} (" in line:
            break
        page.wait_for_timeout(1000)
    assert f"  {price} (" in line, (price, line)
    assert price.startswith("$") and price.endswith("/h") and len(price.split(".")[1]) == 6, price  # $0.0020/h
    members = page.eval_on_selector_all("tbody tr td", "els => els.map(e => e.textContent)")[3]
    assert f"members {members.replace(' / ', '/')}" in line and "." not in members, (members, line)
    page.close()


def test_the_curve_has_the_points_of_status_json_history(setup: Setup, browser: Any) -> None:
    cancelled = cli(setup.swarm.state_dir(0), "cancel", setup.job_id)  # freeze the history to compare it whole
    assert cancelled.returncode == 0, cancelled.stderr
    job = setup.job()
    history = job["history"]
    assert len(history) >= 20
    page = browser.new_page()
    page.goto(setup.url + f"job/{setup.job_id}")
    page.wait_for_selector("#train-curve")
    drawn = _curve(page)
    y_span = max(p[1] for p in history) - min(p[1] for p in history) or 1.0
    assert len(drawn) == len(history)
    for (step, loss), (x, y) in zip(history, drawn, strict=True):
        assert round(x) == step and abs(y - loss) < 1e-3 * y_span, (step, loss, x, y)
    # every checkpoint of the job's record, and no other, is marked on the timeline
    assert job["checkpoints"] and sorted(_checkpoint_marks(page)) == [c["step"] for c in job["checkpoints"]]
    # every device of the plan: the compute and waiting drawn are those of the job's record
    timings = _timings(page)
    placed = {d["peer_id"] for s in job["plan"]["stages"] for d in s["devices"]}
    assert set(timings) == placed and set(job["stage_times"]) == placed
    for peer, t in job["stage_times"].items():
        assert float(timings[peer]["compute_s"]) == t["compute_s"] and float(timings[peer]["wait_s"]) == t["wait_s"]
    page.close()
    # the terminal's live view draws the same job: its plan, progress and ETA (one round: the job has ended)
    watched = cli(setup.swarm.state_dir(0), "status", setup.job_id, "--watch")
    assert watched.returncode == 0, watched.stderr
    assert "ETA" in watched.stdout and all(
        d["peer_id"][:12] in watched.stdout for s in job["plan"]["stages"] for d in s["devices"]
    )
    for peer, t in job["stage_times"].items():  # each device's row: its compute / wait in ms
        row = next(line for line in watched.stdout.splitlines() if peer[:12] in line)
        assert f"{t['compute_s'] * 1000:.1f} / {t['wait_s'] * 1000:.1f}" in row, (row, t)


def test_the_loss_chart_has_a_wall_clock_axis_and_its_csv_the_rows_of_status_json(
    setup: Setup, browser: Any, tmp_path: Path
) -> None:
    """After the job was cancelled (the history frozen): the CSV the page downloads holds every row of
    ``status JOB --json``'s history, each with the wall-clock time the daemon saw it; the chart's time axis
    shows those times."""
    import csv
    from datetime import datetime

    job = setup.job()
    assert job["state"] == "cancelled" and len(job["history_at"]) == len(job["history"]) >= 20
    page = browser.new_page()
    page.goto(setup.url + f"job/{setup.job_id}")
    page.wait_for_selector("#loss-chart text.time-tick")
    ticks = page.eval_on_selector_all(
        "#loss-chart text.time-tick",
        "els => els.map(e => [Number(e.getAttribute('data-step')), Number(e.getAttribute('data-at')), e.textContent])",
    )
    at = {int(p[0]): t for p, t in zip(job["history"], job["history_at"], strict=True)}
    assert len(ticks) == 6
    for step, when, shown in ticks:
        assert at[step] == when and shown == time.strftime("%H:%M:%S", time.gmtime(when)), (step, when, shown)
    with page.expect_download() as info:
        page.click("#loss-csv")
    saved = tmp_path / "loss.csv"
    info.value.save_as(saved)
    page.close()
    assert info.value.suggested_filename == f"loss-{setup.job_id[:12]}.csv"
    with saved.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["step", "time", "loss", "val"]
    assert [(int(r["step"]), float(r["loss"])) for r in rows] == [(s, v) for s, v in job["history"]]
    for r, when in zip(rows, job["history_at"], strict=True):
        assert abs(datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() - when) < 1e-3
    assert _status(setup.url.rsplit("/", 2)[0] + f"/job/{setup.job_id}/loss.csv") == 403  # token-checked


def test_a_screenshot_of_every_page(setup: Setup, browser: Any) -> None:
    setup.shots.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    for name, path, ready in (
        ("swarm", "", "#swarm-map"),
        ("job", f"job/{setup.job_id}", "#plan"),
        ("owner", "owner", "#earnings, .kv"),
        ("market", "market", "section"),
    ):
        page.goto(setup.url + path)
        page.wait_for_selector(ready)
        page.wait_for_timeout(300)
        shot = setup.shots / f"{name}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000, name
    page.close()
    assert sorted(p.name for p in setup.shots.iterdir()) == ["job.png", "market.png", "owner.png", "swarm.png"]


def test_a_replicated_job_draws_each_replica_and_how_they_sync(setup: Setup, browser: Any) -> None:
    from tests.integration.test_replica_jobs import _spec

    spec = _spec(setup.shots.parent, "dashboard-replicas", "every_step")
    submitted = cli(setup.swarm.state_dir(0), "submit", str(spec), "--members", "2")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    plan = wait_for(lambda: setup.swarm.call(0, "job", {"job_id": job_id})["plan"], 120, 0.5, "the replica plan")
    assert len(plan["replicas"]) == 2
    page = browser.new_page()
    page.goto(setup.url + f"job/{job_id}")
    page.wait_for_selector("#plan-replicas")
    assert "2 data-parallel replicas · gradients averaged across the replicas every step" in page.inner_text(
        "#plan-replicas"
    )
    for i, replica in enumerate(plan["replicas"]):
        svg = "#plan" if i == 0 else f"#plan-replica-{i}"
        names = page.eval_on_selector_all(f"{svg} .device-name", "els => els.map(e => e.textContent)")
        assert names == [d["peer_id"][:12] for st in replica["stages"] for d in st["devices"]]
    page.close()
