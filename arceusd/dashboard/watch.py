"""``arceusd status --watch``: a live terminal view drawn with rich (tables, progress bars with an ETA).

Pure rendering (:func:`render_status`, :func:`render_job`: the control methods' JSON in, a rich renderable out)
and a thin loop (:func:`watch`) that asks the daemon every ``interval`` seconds and redraws in place. Every string
from the daemon goes through :func:`arceusd.base.text_safety.safe_tree` and into a ``rich.text.Text`` (never rich
markup), so a stranger's device or job name can neither drive the terminal nor style the view.

Steps/s, tokens/s and the ETA are the daemon's (:mod:`arceusd.jobs.record.throughput`: one rate over one window), the
same figures ``status``, the dashboard and the Python API show; this view computes none of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from arceusd.base.text_safety import safe_tree
from arceusd.jobs.record.view import block_range, standby_text

TERMINAL = ("done", "failed", "cancelled")


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA -"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"ETA {h}h{m:02d}m" if h else f"ETA {m}m{s:02d}s" if m else f"ETA {s}s"


def _t(value: Any, style: str = "") -> Text:
    return Text("-" if value is None else str(value), style=style)


def _num(value: Any, fmt: str) -> Text:
    return Text(format(value, fmt) if isinstance(value, int | float) and not isinstance(value, bool) else "-")


def _ms(seconds: Any) -> str:
    """Seconds as milliseconds, or ``-`` when unmeasured."""
    ok = isinstance(seconds, int | float) and not isinstance(seconds, bool)
    return f"{1000 * seconds:.1f}" if ok else "-"


STATE_STYLE = {
    "alive": "green",
    "running": "green",
    "done": "green",
    "suspect": "yellow",
    "recovering": "yellow",
    "paused": "yellow",
    "dead": "red",
    "failed": "red",
    "cancelled": "red",
}


def progress_line(job: dict[str, Any]) -> Table:
    """A job's progress bar with steps, percent, speed and ETA."""
    step, total = int(job.get("step") or 0), int(job.get("total_steps") or 0)
    per_s, eta = job.get("steps_per_s"), job.get("eta_s")
    per_s = float(per_s) if isinstance(per_s, int | float) and not isinstance(per_s, bool) else None
    eta = float(eta) if isinstance(eta, int | float) and not isinstance(eta, bool) else None
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        ProgressBar(total=max(total, 1), completed=min(step, max(total, 1)), width=40),
        Text(f"{step}/{total}"),
        Text(f"{100 * step / total:5.1f}%" if total else "  -  "),
        Text(f"{per_s:.2f} steps/s" if per_s else "- steps/s"),
        Text(fmt_eta(eta), style="cyan"),
    )
    return grid


def render_job(job: dict[str, Any]) -> RenderableType:
    """One job in detail: progress, figures, the plan, contributions and recoveries."""
    job = safe_tree(job)
    state = str(job.get("state"))
    head = Text.assemble(
        (str(job.get("name")), "bold"),
        "  ",
        (str(job.get("job_id", ""))[:12], "dim"),
        "  ",
        (state, STATE_STYLE.get(state, "")),
    )
    figures = Table.grid(padding=(0, 2))
    figures.add_row(
        Text("loss", style="dim"),
        _num(job.get("loss"), ".4f"),
        Text("val", style="dim"),
        _num(job.get("val_loss"), ".4f"),
        Text("tokens/s", style="dim"),
        _num(job.get("tokens_per_s"), ".0f"),
        Text("lr", style="dim"),
        _num(job.get("lr"), ".2e"),
    )
    figures.add_row(
        Text("epoch", style="dim"),
        _t(job.get("epoch")),
        Text("leader", style="dim"),
        _t(str(job.get("leader", ""))[:12]),
        Text("standby", style="dim"),
        _t(standby_text(job)),
        Text("checkpoint", style="dim"),
        _t(job.get("committed_step")),
    )
    parts: list[RenderableType] = [head, progress_line(job), figures]
    cost = job.get("cost")  # the leader's: spent, budget left, time and cost to finish (arceusd.market.progress)
    if isinstance(cost, dict) and isinstance(cost.get("line"), str):
        parts.append(Text(f"cost: {cost['line']}", style="cyan"))
    plan = job.get("plan")
    if isinstance(plan, dict):
        table = Table(
            title=Text(
                f"plan: {plan.get('schedule')}, {plan.get('micro_batches')} micro-batches"
                + (f" (at most {plan['in_flight_cap']} in flight, to fit memory)" if plan.get("in_flight_cap") else "")
                + ", "
                f"predicted {1000 * float(plan.get('predicted_step_time_s') or 0):.1f} ms/step"
            ),
            expand=False,
        )
        for col in ("stage", "blocks", "device", "heads", "MLP columns", "compute / wait ms"):
            table.add_column(
                col, no_wrap=col in ("device", "compute / wait ms"), min_width=12 if col == "device" else None
            )
        times = job.get("stage_times")
        times = times if isinstance(times, dict) else {}
        for stage in plan.get("stages", []):
            for d in stage.get("devices", []):
                split = len(stage.get("devices", [])) > 1
                t = times.get(str(d.get("peer_id")))
                t = t if isinstance(t, dict) else {}
                table.add_row(
                    _t(stage.get("index")),
                    _t(block_range(stage.get("blocks"))),
                    _t(str(d.get("peer_id"))[:12]),
                    _t(d.get("heads") if split else "all"),
                    _t(d.get("mlp_columns") if split else "all"),
                    Text(f"{_ms(t.get('compute_s'))} / {_ms(t.get('wait_s'))}"),
                )
        parts.append(table)
    timing = job.get("stage_timing")
    if isinstance(timing, dict):
        step_s = float(timing.get("step_time_s") or 0)
        wait = float(timing.get("wait_fraction") or 0)
        parts.append(Text(f"this device: {1000 * step_s:.1f} ms/step, {100 * wait:.0f}% waiting on links"))
    contributions = job.get("contributions") or []
    if contributions:
        table = Table(title=Text("contributions"))
        for col in ("device", "share", "steps", "TFLOP"):
            table.add_column(col)
        for c in contributions:
            table.add_row(
                _t(str(c.get("peer_id"))[:12]),
                _num(c.get("share"), ".3f"),
                _t(c.get("steps")),
                _num(c.get("tflop"), ".4f"),
            )
        parts.append(table)
    for r in job.get("recoveries") or []:
        parts.append(
            Text(
                f"recovery: {r.get('reason')} (lost step {r.get('lost_step')}, resumed from {r.get('resumed_step')})",
                style="yellow",
            )
        )
    if job.get("error"):
        parts.append(Text(str(job["error"]), style="red"))
    return Panel(Group(*parts), title="arceusd status", border_style="blue")


def render_status(status: dict[str, Any]) -> RenderableType:
    """The daemon: itself, its peers (state, incarnation, round trip) and its jobs with progress bars."""
    status = safe_tree(status)
    uptime = int(float(status.get("uptime_s") or 0))
    head = Text.assemble(
        ("arceusd ", "bold"),
        str(status.get("version")),
        "  peer ",
        (str(status.get("peer_id")), "bold"),
        f"  up {uptime} s  preset {status.get('preset')}",
    )
    parts: list[RenderableType] = [head]
    peers = status.get("peers") or []
    table = Table(title=Text(f"peers ({len(peers)})"), expand=False)
    for col in ("peer", "state", "inc", "round trip", "heard", "address", "device"):
        table.add_column(col)
    for p in peers:
        state = str(p.get("state"))
        table.add_row(
            _t(str(p.get("peer_id"))[:12]),
            _t(state, STATE_STYLE.get(state, "")),
            _t(p.get("incarnation")),
            Text(f"{p['rtt_ms']:.2f} ms" if isinstance(p.get("rtt_ms"), int | float) else "-"),
            Text(f"{p['last_heard_s']:.1f}s ago" if isinstance(p.get("last_heard_s"), int | float) else "never"),
            _t(p.get("address")),
            _t(p.get("device")),
        )
    parts.append(table)
    jobs = status.get("jobs") or []
    jt = Table(title=Text(f"jobs ({len(jobs)})"), expand=False)
    for col in ("job", "name", "state", "role", "loss", "progress"):
        jt.add_column(col)
    for j in jobs:
        state = str(j.get("state"))
        jt.add_row(
            _t(str(j.get("job_id"))[:12]),
            _t(j.get("name")),
            _t(state, STATE_STYLE.get(state, "")),
            _t(j.get("role")),
            _num(j.get("loss"), ".4f"),
            progress_line(j),
        )
    parts.append(jt)
    return Panel(Group(*parts), title="arceusd status", border_style="blue")


def watch(
    call: Callable[[str, dict[str, Any] | None], Any],
    job: str | None,
    interval: float,
    console: Console | None = None,
    rounds: int | None = None,
) -> None:
    """Redraw the daemon's status (or one job's) every ``interval`` seconds until Ctrl-C or the job ends
    (``rounds`` bounds the redraws, for tests). Piped (not a terminal), each drawing follows the last."""
    console = console or Console()
    if not console.is_terminal:
        _loop(call, job, interval, rounds, console.print)
        return
    with Live(console=console, auto_refresh=False) as live:
        _loop(call, job, interval, rounds, lambda r: live.update(r, refresh=True))


def _loop(
    call: Callable[[str, dict[str, Any] | None], Any],
    job: str | None,
    interval: float,
    rounds: int | None,
    draw: Callable[[RenderableType], None],
) -> None:
    done = 0
    while rounds is None or done < rounds:
        if job is not None:
            result = call("job", {"job_id": job})
            draw(render_job(result))
            if result.get("state") in TERMINAL:
                return
        else:
            result = call("status", None)
            draw(render_status(result))
        done += 1
        if rounds is None or done < rounds:
            time.sleep(interval)


__all__ = ["fmt_eta", "render_job", "render_status", "watch"]
