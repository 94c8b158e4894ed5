"""Issue 29 (b): ``arceusd dashboard`` opened the browser with the token URL as an argument, so another local
user read the token from the process table; the daemon's log was mode 0644. Now the browser is given a 0600
page in the state directory that leads on to the URL (``arceusd/dashboard/opener.py``) and the log is 0600
(``arceusd/base/logs.py``). The test plays the other user: while ``arceusd dashboard --open`` runs with a browser
that stays open, it reads every process's command line and environment in /proc (as the same user, which
sees more than another would) and every file in the state directory that others may read."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from arceusd.dashboard.opener import OPENER_NAME
from tests.adversarial.victim import start_daemon
from tests.harness import ROOT, arceusd_cmd

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BROWSER_SECONDS = 3.0


def _proc_texts() -> dict[int, bytes]:
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


def test_the_token_is_on_no_command_line_and_the_log_is_private(tmp_path: Path) -> None:
    log = tmp_path / "arceusd.log"
    log.write_text("")
    log.chmod(0o644)  # as an older daemon left it
    d0 = start_daemon(tmp_path, "d0", "--no-auto-join", "--log-file", str(log))
    browser = tmp_path / "browser"
    browser.write_text(f"#!/bin/sh\nsleep {BROWSER_SECONDS}\n")
    browser.chmod(0o755)
    try:
        url: str = d0.cli_json("dashboard", "--no-open")["url"]
        token = url.rstrip("/").rsplit("/", 1)[1].encode()
        assert len(token) >= 24, url
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
        cli = subprocess.Popen(
            arceusd_cmd(d0.state_dir, "dashboard", "--open"),
            cwd=ROOT,
            env={**env, "BROWSER": str(browser)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        browsers_seen = scans = 0
        leaks: list[int] = []
        try:
            deadline = time.monotonic() + BROWSER_SECONDS + 10
            while cli.poll() is None and time.monotonic() < deadline:
                texts = _proc_texts()
                scans += 1
                browsers_seen += sum(str(browser).encode() in t for t in texts.values())
                leaks += [pid for pid, t in texts.items() if token in t and pid != os.getpid()]
                time.sleep(0.05)
            out, err = cli.communicate(timeout=10)
        finally:
            if cli.poll() is None:
                cli.kill()
        assert cli.returncode == 0, err
        assert browsers_seen >= 3, (browsers_seen, scans)  # the scans ran while the browser was open
        assert not leaks, f"the token is in the command line or environment of {sorted(set(leaks))}"
        assert token in out  # the user who asked is shown the URL
        page = d0.state_dir / OPENER_NAME
        assert stat.S_IMODE(page.stat().st_mode) == 0o600 and url in page.read_text()
        for path in d0.state_dir.rglob("*"):  # nothing else others may read holds it
            if path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o044:
                assert token not in path.read_bytes(), path
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert log.stat().st_size > 0 and token not in log.read_bytes()
    finally:
        assert d0.stop() == 0
