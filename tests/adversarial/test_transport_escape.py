"""Issue #19 item 10: ``arceusd peers`` once printed a stranger's ``device`` string raw, so its terminal escape
sequences reached the user's terminal. Every human view now escapes remote strings (arceusd/base/text_safety.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial.victim import (
    Watch,
    assert_healthy,
    baseline,
    finish,
    hostile_background,
    peer_address,
    start_daemon,
)
from tests.harness import run_cli, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FORBIDDEN = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def test_a_strangers_device_string_is_escaped_in_every_view(tmp_path: Path) -> None:
    d0 = start_daemon(tmp_path, "d0")
    try:
        target = peer_address(d0)
        base = baseline(d0)
        attack = hostile_background("device", target, "--seconds", "8")
        with Watch(d0) as watch:
            peers = wait_for(lambda: [p for p in d0.call("peers") if "owned" in p["device"]], 8, 0.1, "hostile")
            assert peers[0]["device"].startswith("linux\x1b]0;owned")  # stored as sent, shown escaped
            outputs = {
                name: run_cli(d0.state_dir, *args)
                for name, args in {"peers": ("peers",), "status": ("status",), "logs": ("logs", "-n", "200")}.items()
            }
            finish(attack)
        for name, proc in outputs.items():
            assert proc.returncode == 0 or name == "logs", (name, proc.stderr)
            for ch in FORBIDDEN:
                assert ch not in proc.stdout, f"{name} printed {ch!r} raw"
        assert "\\x1b]0;owned\\x07\\x1b[2J" in outputs["peers"].stdout
        assert "\\u202eevil\\x0d\\x0afake line" in outputs["peers"].stdout
        # JSON output is escaped by json.dumps and keeps the value exact.
        import json

        raw = run_cli(d0.state_dir, "peers", "--json")
        assert "\x1b" not in raw.stdout and any("\x1b]0;owned" in p["device"] for p in json.loads(raw.stdout))
        assert_healthy(watch.report, base, rss_extra_mib=64)
    finally:
        assert d0.stop() == 0
