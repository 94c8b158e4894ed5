"""Slow first answers say why (issue 31): a command that waits while the daemon measures this device (the first
``market``, ``submit``, ``submit --quote`` or ``join`` on a fresh daemon: about 20 s) says so before it waits,
and a quote's device guess never tells the user to start a daemon that is running and measuring."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import click
import pytest
from click.testing import CliRunner

from arceusd.base.control import ControlError
from arceusd.cli.commands import cli
from arceusd.cli.context import Context
from arceusd.device.profile import (
    CACHE_FILE,
    CACHE_VERSION,
    MEASURING_NOTE,
    DeviceMeasurement,
    fresh_measurements,
    is_measured,
    measuring_note,
)
from arceusd.market.estimate import MEASURED, Estimate, device_guess, unmeasured_source
from tests.integration.test_recovery import write_spec


def write_cache(state: Path, measured_at: float, version: int = CACHE_VERSION, threads: int = 2) -> None:
    m = DeviceMeasurement("cpu", 5e10, 8 << 30, threads, "cpu", measured_at)
    state.mkdir(parents=True, exist_ok=True)
    (state / CACHE_FILE).write_text(
        json.dumps({"version": version, "measured_at": measured_at, "devices": [asdict(m)]})
    )


def test_the_note_is_said_only_while_a_running_daemon_has_a_measurement_to_make() -> None:
    assert measuring_note(measured=False, daemon_running=True) == MEASURING_NOTE
    assert measuring_note(measured=True, daemon_running=True) is None
    assert measuring_note(measured=False, daemon_running=False) is None  # nothing waits without a daemon
    assert measuring_note(measured=True, daemon_running=False) is None


def test_a_measurement_counts_while_the_daemon_would_use_it(tmp_path: Path) -> None:
    now = time.time()
    assert not is_measured(tmp_path / "none")
    write_cache(tmp_path, now - 60)
    assert is_measured(tmp_path, now)
    assert not is_measured(tmp_path, now + 25 * 3600)  # a day old: the daemon measures again
    write_cache(tmp_path, now - 60, version=1)
    assert not is_measured(tmp_path, now)
    (tmp_path / CACHE_FILE).write_text("{not json")
    assert not is_measured(tmp_path, now)
    data: Any
    for data in ([], {"version": CACHE_VERSION}, {"version": CACHE_VERSION, "measured_at": "x", "devices": []}):
        assert fresh_measurements(data, now) is None
    write_cache(tmp_path, now)
    data = json.loads((tmp_path / CACHE_FILE).read_text())
    assert fresh_measurements(data, now, threads=2) and fresh_measurements(data, now, threads=4) is None


def test_the_quote_says_the_daemon_is_measuring_not_to_start_it(tmp_path: Path) -> None:
    running, stopped = device_guess(tmp_path, daemon_running=True), device_guess(tmp_path, daemon_running=False)
    assert "start the daemon" not in running.source and "the daemon is measuring it now" in running.source
    assert running.source == unmeasured_source(True) and "start the daemon" in stopped.source
    write_cache(tmp_path, time.time())
    assert device_guess(tmp_path, daemon_running=True).source == MEASURED
    # what the devices lend, unknown: the daemon was measuring when asked, or there is none
    measuring = SimpleNamespace(need=SimpleNamespace(mib=11), lent=None, daemon_running=True)
    (line,) = Estimate.memory_lines(cast(Estimate, measuring))
    assert "still measuring this device" in line and "start the daemon" not in line, line
    (line,) = Estimate.memory_lines(cast(Estimate, SimpleNamespace(**{**vars(measuring), "daemon_running": False})))
    assert "start the daemon" in line, line


@pytest.mark.parametrize("command", ["market", "join", "submit", "quote"])
def test_a_command_that_waits_on_the_measurement_says_so_before_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Before the call that waits (the daemon measures first), the note is on stderr: it is the first thing the
    command says, so it comes within a second whatever the measurement takes. Once measured, nothing is said."""
    state = tmp_path / "state"
    state.mkdir()
    events: list[tuple[str, str]] = []
    real_echo = click.echo

    def echo(message: Any = None, *args: Any, **kwargs: Any) -> None:
        events.append(("say", str(message)))
        real_echo(message, *args, **kwargs)

    def waits(*_args: Any, **_kwargs: Any) -> Any:
        events.append(("wait", ""))
        raise click.ClickException("the daemon did not answer")

    def waits_control(*_args: Any, **_kwargs: Any) -> Any:
        events.append(("wait", ""))
        raise ControlError("no answer in time")

    monkeypatch.setattr(click, "echo", echo)
    monkeypatch.setattr(Context, "call", waits)
    monkeypatch.setattr("arceusd.market.estimate.call", waits_control)
    monkeypatch.setattr("arceusd.cli.context.daemon_answers", lambda _path: True)
    monkeypatch.setattr("arceusd.market.estimate.daemon_answers", lambda _path: True)
    spec = write_spec(tmp_path, steps=10, interval=5)
    args = {
        "market": ["market"],
        "join": ["join", "ab" * 16],
        "submit": ["submit", str(spec)],
        "quote": ["submit", str(spec), "--quote"],
    }[command]
    result = CliRunner().invoke(cli, ["--state-dir", str(state), *args])
    assert events[:2] == [("say", MEASURING_NOTE), ("wait", "")], (events, result.output)
    if command == "quote":  # it went on with a typical laptop, saying the daemon measures this device
        assert result.exit_code == 0 and "the daemon is measuring it now" in result.output, result.output
        assert "start the daemon" not in result.output, result.output
    events.clear()
    write_cache(state, time.time())
    CliRunner().invoke(cli, ["--state-dir", str(state), *args])
    assert ("say", MEASURING_NOTE) not in events and ("wait", "") in events, events
