"""The daemon as a real process: status over the control socket, clean SIGTERM, side by side, key errors."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.harness import Daemon, daemons, run_cli, wait_for

pytestmark = pytest.mark.timeout(120)


def test_status_over_control_socket_matches_identity(tmp_path: Path) -> None:
    with daemons(tmp_path, 1) as (d,):
        expected_id = run_cli(d.state_dir, "id").stdout.strip()
        first = d.cli_json("status")
        assert first["peer_id"] == expected_id
        assert len(expected_id) == 32
        assert first["version"]
        assert first["addresses"]["control"] == str(d.state_dir / "control.sock")
        time.sleep(0.3)
        assert d.cli_json("status")["uptime_s"] > first["uptime_s"]
        human = run_cli(d.state_dir, "status")
        assert human.returncode == 0 and expected_id in human.stdout


def test_control_socket_is_private(tmp_path: Path) -> None:
    with daemons(tmp_path, 1) as (d,):
        mode = os.stat(d.state_dir / "control.sock").st_mode & 0o777
        assert mode == 0o600
        assert os.stat(d.state_dir / "identity.key").st_mode & 0o777 == 0o600


def test_sigterm_exits_zero_quickly_and_cleans_up(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "d0").start()
    try:
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 5.0
        assert not (d.state_dir / "control.sock").exists()
        assert not (d.state_dir / "arceusd.pid").exists()
    finally:
        d.kill()


def test_sigint_also_exits_zero(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "d0").start()
    try:
        d.signal(signal.SIGINT)
        assert d.wait(timeout=10) == 0
    finally:
        d.kill()


def test_two_daemons_side_by_side(tmp_path: Path) -> None:
    with daemons(tmp_path, 2) as (a, b):
        sa, sb = a.status(), b.status()
        assert sa["peer_id"] != sb["peer_id"]
        assert sa["addresses"]["control"] != sb["addresses"]["control"]
        assert sa["pid"] != sb["pid"]
        # Peer ports (when a transport listens) must not clash either.
        pa, pb = sa["addresses"].get("peer"), sb["addresses"].get("peer")
        assert pa is None or pa != pb


def test_second_daemon_on_same_state_dir_is_refused(tmp_path: Path) -> None:
    with daemons(tmp_path, 1) as (d,):
        twin = Daemon(d.state_dir).start(wait=False)
        try:
            assert twin.wait(timeout=30) != 0
            assert "already" in twin.output()
            assert d.status()["peer_id"]  # the first one is unharmed
        finally:
            twin.kill()


def test_key_readable_by_others_stops_daemon_with_fix(tmp_path: Path) -> None:
    state = tmp_path / "d0"
    assert run_cli(state, "id").returncode == 0
    key = state / "identity.key"
    before = key.read_bytes()
    key.chmod(0o644)
    proc = run_cli(state, "start", "--foreground", "--preset", "local")
    assert proc.returncode == 2
    assert "chmod 600" in proc.stderr and str(key) in proc.stderr
    assert key.read_bytes() == before


def test_corrupt_key_stops_daemon_and_is_not_overwritten(tmp_path: Path) -> None:
    state = tmp_path / "d0"
    state.mkdir(mode=0o700)
    key = state / "identity.key"
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    proc = run_cli(state, "start", "--foreground", "--preset", "local")
    assert proc.returncode == 2
    assert "corrupt" in proc.stderr
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\nnot a key")
    assert run_cli(state, "id").returncode != 0


def test_status_without_daemon_explains_and_fails(tmp_path: Path) -> None:
    proc = run_cli(tmp_path / "nobody", "status")
    assert proc.returncode == 3
    assert proc.stderr.strip().count("\n") == 0
    assert "no daemon is running" in proc.stderr


def test_detach_stop_and_logs(tmp_path: Path) -> None:
    state = tmp_path / "d0"
    started = run_cli(state, "start", "--detach", "--preset", "local")
    try:
        assert started.returncode == 0, started.stderr
        status = json.loads(run_cli(state, "status", "--json").stdout)
        pid = status["pid"]
        stopped = run_cli(state, "stop")
        assert stopped.returncode == 0, stopped.stderr
        wait_for(lambda: not _alive(pid), 10, what="detached daemon gone")
        logs = run_cli(state, "logs", "-n", "20")
        assert logs.returncode == 0 and "ready" in logs.stdout and "stopped" in logs.stdout
        assert run_cli(state, "stop").returncode == 3
    finally:
        pid_file = state / "arceusd.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_start_without_service_manager_points_to_foreground(tmp_path: Path) -> None:
    from arceusd.daemon import service

    try:
        service.detect()
    except service.NoServiceManager:
        proc = run_cli(tmp_path / "d0", "start")
        assert proc.returncode != 0
        assert "--foreground" in proc.stderr and "--detach" in proc.stderr
    else:
        pytest.skip("a real service manager is present; not installing a service from a test")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
