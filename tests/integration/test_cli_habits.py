"""The command line as a newcomer meets it, as real processes (``python -m arceusd ...``).

``--state-dir`` before or after the command; every start-up and CLI failure is one line on stderr (what went
wrong, what to do) and a non-zero exit, with a traceback only at ``--log-level debug``: a taken port (the default
one falls back to a free port, a port given explicitly is refused naming it and the fix), an interface (``lo``
works for a one-machine swarm with mDNS, an unknown one is refused), an unwritable state directory, a corrupt
``config.toml``, key problems. No NumPy warning reaches the user.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT, Daemon, daemons, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def arceusd(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m arceusd ARGS`` exactly as typed (no --state-dir added)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "arceusd", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def assert_one_line_failure(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr and "Exception Group" not in proc.stderr, proc.stderr
    assert err.count("\n") == 0, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def test_state_dir_before_or_after_the_command(tmp_path: Path) -> None:
    state = tmp_path / "s"
    after = arceusd("id", "--state-dir", str(state))
    before = arceusd("--state-dir", str(state), "id")
    assert after.returncode == 0 and before.returncode == 0, (after.stderr, before.stderr)
    assert after.stdout.strip() == before.stdout.strip() and len(after.stdout.strip()) == 32
    assert (state / "identity.key").exists()
    # before and after naming different folders: refused, naming both (a silent winner acts on the wrong daemon)
    other = tmp_path / "other"
    both = arceusd("--state-dir", str(other), "status", "--state-dir", str(state))
    assert_one_line_failure(both, "--state-dir is given twice", str(other), str(state), "give it once")
    assert both.returncode == 2 and not other.exists()
    same = arceusd("--state-dir", str(state), "id", "--state-dir", str(state))
    assert same.returncode == 0 and same.stdout == after.stdout
    with daemons(tmp_path, 1) as (d,):
        for argv in (
            ("status", "--json", "--state-dir", str(d.state_dir)),
            ("--state-dir", str(d.state_dir), "status", "--json"),
            ("peers", "--state-dir", str(d.state_dir), "--json"),
        ):
            proc = arceusd(*argv)
            assert proc.returncode == 0, (argv, proc.stderr)
        status = json.loads(arceusd("status", "--json", "--state-dir", str(d.state_dir)).stdout)
        assert status["state_dir"] == str(d.state_dir)


def test_second_daemon_on_the_default_port_takes_a_free_one(tmp_path: Path) -> None:
    # Default flags (the lan preset's port 47070), on loopback and without mDNS so no traffic leaves the machine.
    args = ["--preset", "lan", "--host", "127.0.0.1", "--no-mdns"]
    with daemons(tmp_path, 1, lambda i: args) as (a,):
        b = Daemon(tmp_path / "d1", args).start()
        try:
            pa, pb = a.status()["addresses"]["peer"], b.status()["addresses"]["peer"]
            assert pa != pb and pb.startswith("127.0.0.1:")
            assert "Traceback" not in b.output() and "Exception Group" not in b.output()
            assert "is taken" in a.output() + b.output()  # whichever fell back says so in its log
        finally:
            b.stop()


def test_explicit_taken_port_is_one_line_naming_the_port_and_the_fix(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        argv = ["start", "--foreground", "--preset", "local", "--port", str(port), "--state-dir", str(tmp_path / "s")]
        proc = arceusd(*argv)
        err = assert_one_line_failure(proc, str(port), "--port 0", "config.toml")
        assert proc.returncode == 2, err
        detached = arceusd(*[a if a != "--foreground" else "--detach" for a in argv])
        assert_one_line_failure(detached, "exited at start", str(port), "--port 0")
        debug = arceusd(*argv, "--log-level", "debug")
        assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_interface_lo_makes_a_one_machine_swarm_over_mdns(tmp_path: Path) -> None:
    args = ["--mdns", "--interface", "lo"]  # no seeds: only mDNS on loopback can introduce them
    with daemons(tmp_path, 2, lambda i: args) as (a, b):
        assert a.status()["addresses"]["peer"].startswith("127.0.0.1:")

        def sees_other() -> bool:
            peers = a.cli_json("peers")
            return any(p["peer_id"] == b.status()["peer_id"] and p["state"] == "alive" for p in peers)

        wait_for(sees_other, 30, interval=0.5, what="the other daemon found over mDNS on lo")


def test_unknown_interface_is_one_line(tmp_path: Path) -> None:
    proc = arceusd(
        "start",
        "--foreground",
        "--preset",
        "local",
        "--mdns",
        "--interface",
        "nosuch0",
        "--state-dir",
        str(tmp_path / "s"),
    )
    assert_one_line_failure(proc, "nosuch0", "--interface", "--no-mdns")


def test_unwritable_state_directory_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        state = Path("/sys/arceus-test-state")  # root may write anywhere but sysfs
    else:
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o500)
        state = parent / "state"
    proc = arceusd("start", "--foreground", "--preset", "local", "--state-dir", str(state))
    assert_one_line_failure(proc, str(state), "--state-dir")
    assert_one_line_failure(arceusd("id", "--state-dir", str(state)), str(state))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for command in ("status", "jobs", "peers", "stop"):  # a state directory that cannot exist has no daemon
        assert_one_line_failure(arceusd(command, "--state-dir", str(blocker / "s")), "no daemon is running")


def test_corrupt_config_toml_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "config.toml").write_text("port = = 3\n")
    proc = arceusd("start", "--foreground", "--state-dir", str(state))
    assert_one_line_failure(proc, "config.toml", "not valid TOML", "fix that line")
    (state / "config.toml").write_text('port = "x"\n')
    assert_one_line_failure(arceusd("start", "--foreground", "--state-dir", str(state)), "port must be int", "fix")
    (state / "config.toml").write_text("prot = 3\n")
    assert_one_line_failure(arceusd("start", "--foreground", "--state-dir", str(state)), "unknown key 'prot'")


def test_key_problems_are_one_line(tmp_path: Path) -> None:
    state = tmp_path / "s"
    assert arceusd("id", "--state-dir", str(state)).returncode == 0
    key = state / "identity.key"
    key.chmod(0o644)
    start = ["start", "--foreground", "--preset", "local", "--state-dir", str(state)]
    assert_one_line_failure(arceusd(*start), "chmod 600", str(key))
    key.write_bytes(b"garbage")
    key.chmod(0o600)
    assert_one_line_failure(arceusd(*start), "corrupt")
    assert_one_line_failure(arceusd("id", "--state-dir", str(state)), "corrupt")


def test_no_numpy_warning_reaches_the_user(tmp_path: Path) -> None:
    # torch warns "Failed to initialize NumPy" on stderr when numpy is missing, from the first torch import of
    # any process that loads it: the daemon's profiling worker, the demo's sample, a stage worker.
    code = "import torch; from torch._subclasses import functional_tensor; torch.zeros(2).tolist()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and "NumPy" not in proc.stderr, proc.stderr
    with daemons(tmp_path, 1) as (d,):
        wait_for(lambda: "ready" in d.output(), 30, what="daemon ready")
        time.sleep(8)  # the device profile (a torch worker) runs right after start
        assert "NumPy" not in d.output() and "UserWarning" not in d.output(), d.output()


def test_usage_mistakes_are_one_line_pointing_at_help(tmp_path: Path) -> None:
    assert_one_line_failure(arceusd("status", "--bogus"), "--bogus", "arceusd status --help")
    assert_one_line_failure(arceusd("frob"), "frob", "arceusd --help")
    assert_one_line_failure(arceusd("submit", str(tmp_path / "none.toml")), "none.toml", "arceusd submit --help")
    ok = arceusd("--help")
    assert ok.returncode == 0 and "Usage:" in ok.stdout
