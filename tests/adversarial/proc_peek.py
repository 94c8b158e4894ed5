"""Another local user's look at a daemon's secrets (issue 29: the dashboard's token was on a browser's command
line, the log mode 0644), shared by ``tests/adversarial/test_dashboard_token.py`` and ``bench/adversarial.py
--secrets``: while ``arceusd dashboard --open`` runs with a browser that stays open a few seconds, read every
process's command line and environment in /proc (as the same user, which sees more than another would), then
every file in the state directory that others may read, and the log's mode (:func:`peek_at_dashboard`)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from arceusd.dashboard.opener import OPENER_NAME
from tests.harness import ROOT, Daemon, arceusd_cmd


def proc_texts() -> dict[int, bytes]:
    """pid -> its command line and environment, for every process whose /proc entries we can read."""
    out: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        chunks = []
        for name in ("cmdline", "environ"):
            try:
                chunks.append(Path(f"/proc/{entry}/{name}").read_bytes())
            except OSError:
                continue  # gone, or not ours to read
        out[int(entry)] = b"\0".join(chunks)
    return out


@dataclass
class Peek:
    """What the look found. ``leaks``: pids whose command line or environment held the token (this process
    excluded); ``exposed``: files others may read that hold it; ``page_mode`` / ``log_mode``: the opener page's
    and the log's permission bits (None: no such file)."""

    url: str
    token: bytes
    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    scans: int = 0
    processes: int = 0
    browsers_seen: int = 0
    leaks: list[int] = field(default_factory=list)
    exposed: list[Path] = field(default_factory=list)
    page_mode: int | None = None
    page_has_url: bool = False
    log_mode: int | None = None
    log_has_token: bool = False


def peek_at_dashboard(daemon: Daemon, log: Path, browser_seconds: float = 3.0) -> Peek:
    """Run ``arceusd dashboard --open`` against ``daemon`` (whose log is ``log``) with a browser that sleeps
    ``browser_seconds``, scanning /proc every 0.05 s until the command ends (bounded: the browser's time + 10 s)."""
    url: str = daemon.cli_json("dashboard", "--no-open")["url"]
    seen = Peek(url, url.rstrip("/").rsplit("/", 1)[1].encode())
    browser = daemon.state_dir.parent / "browser"
    browser.write_text(f"#!/bin/sh\nsleep {browser_seconds}\n")
    browser.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    cli = subprocess.Popen(
        arceusd_cmd(daemon.state_dir, "dashboard", "--open"),
        cwd=ROOT,
        env={**env, "BROWSER": str(browser)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + browser_seconds + 10
        while cli.poll() is None and time.monotonic() < deadline:
            texts = proc_texts()
            seen.scans += 1
            seen.processes = max(seen.processes, len(texts))
            seen.browsers_seen += sum(str(browser).encode() in t for t in texts.values())
            seen.leaks += [pid for pid, t in texts.items() if seen.token in t and pid != os.getpid()]
            time.sleep(0.05)
        seen.stdout, seen.stderr = cli.communicate(timeout=10)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=10)
    seen.returncode = cli.returncode
    seen.leaks = sorted(set(seen.leaks))
    page = daemon.state_dir / OPENER_NAME
    if page.is_file():
        seen.page_mode = stat.S_IMODE(page.stat().st_mode)
        seen.page_has_url = url in page.read_text()
    for path in daemon.state_dir.rglob("*"):  # nothing else others may read holds it
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o044 and seen.token in path.read_bytes():
            seen.exposed.append(path)
    if log.is_file():
        seen.log_mode = stat.S_IMODE(log.stat().st_mode)
        seen.log_has_token = seen.token in log.read_bytes()
    return seen


__all__ = ["Peek", "peek_at_dashboard", "proc_texts"]
