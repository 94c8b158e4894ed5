"""mDNS discovery across hosts: daemons in their own network namespaces on one virtual LAN, no seeds.

* 3 daemons (``--mdns --interface eth0 --host 0.0.0.0``) find each other through mDNS alone and converge (each
  sees the other two alive, at their LAN addresses).
* 2 daemons started from copies of one state directory (same ``identity.key``) on two hosts are reported as
  duplicates (status ``membership.duplicates`` or ``discovery.duplicates``) and never merged into one member.

The control socket is a unix socket in the state directory, so the test talks to every daemon from the root
namespace. Namespaces are always deleted and daemons always killed (also on failure).

Known limit (arceusd/network/discovery.py, not this test's to fix): when both copies start in the same instant,
neither reported the other in about 1 run of 6 under load. Likely cause: both pass zeroconf's name probe for
the shared instance name ``<peer id>._arceus._tcp.local.`` and each then resolves that name to its own record.
A per-boot instance name (``<peer id>-<boot id>``), with the id compared from the TXT record, would close it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from arceusd.base.control import ControlError, call
from arceusd.base.identity import KEY_FILE_NAME, load_or_create_identity
from tests.harness import ROOT, wait_for
from tests.netns.lan import Host, netns_available, virtual_lan

_REASON = netns_available()
pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}"),
]
PORT = 47946


def status(state: Path) -> dict[str, Any] | None:
    try:
        result: dict[str, Any] = call(state / "control.sock", "status", timeout=5.0)
    except (ControlError, OSError):
        return None
    return result


@contextmanager
def daemon_on(host: Host, state: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``arceusd start --foreground`` inside ``host``'s namespace; killed (SIGKILL after SIGTERM) on exit."""
    state.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "arceusd",
        "--state-dir",
        str(state),
        "start",
        "--foreground",
        "--preset",
        "local",
        "--mdns",
        "--interface",
        "eth0",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--log-file",
        str(state / "arceusd.log"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        host.wrap(cmd),
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def ready(proc: subprocess.Popen[bytes], state: Path) -> dict[str, Any] | None:
    if proc.poll() is not None:
        log = state / "arceusd.log"
        tail = log.read_text()[-4000:] if log.exists() else "(no log)"
        raise AssertionError(f"daemon in {state} exited with {proc.returncode}:\n{tail}")
    return status(state)


def alive_peers(state: Path) -> dict[str, str]:
    peers = call(state / "control.sock", "peers", timeout=5.0)
    return {p["peer_id"]: p["address"] for p in peers if p["state"] == "alive"}


def test_three_hosts_find_each_other_by_mdns_alone(tmp_path: Path) -> None:
    with virtual_lan(3, subnet=31) as hosts:
        states = [tmp_path / f"h{i}" for i in range(3)]
        with (
            daemon_on(hosts[0], states[0]) as p0,
            daemon_on(hosts[1], states[1]) as p1,
            daemon_on(hosts[2], states[2]) as p2,
        ):
            procs = [p0, p1, p2]
            infos: list[dict[str, Any]] = []
            for proc, state in zip(procs, states, strict=True):
                infos.append(wait_for(partial(ready, proc, state), 60, 0.2, f"daemon in {state} ready"))
            ids = [info["peer_id"] for info in infos]
            for info, host in zip(infos, hosts, strict=True):
                assert info["addresses"]["peer"] == f"{host.address}:{PORT}"
                assert not info["config"].get("peers"), "this test must run without seeds"

            def converged() -> bool:
                for i in range(3):
                    expected = {ids[j]: f"{hosts[j].address}:{PORT}" for j in range(3) if j != i}
                    if alive_peers(states[i]) != expected:
                        return False
                return True

            wait_for(converged, 90, 0.25, "3 hosts converge through mDNS")
            for state in states:
                s = status(state)
                assert s is not None
                assert not s["membership"]["duplicates"] and not s["discovery"]["duplicates"]


def test_copied_state_directory_is_reported_as_duplicate_not_merged(tmp_path: Path) -> None:
    original = tmp_path / "orig"
    original.mkdir(mode=0o700)
    identity = load_or_create_identity(original)
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    shutil.copy2(original / KEY_FILE_NAME, copy / KEY_FILE_NAME)
    # The copy starts once the original runs (as when a state directory is copied to a second machine).
    # Starting both in the same instant races in discovery (see the note at the top of this module).
    with virtual_lan(2, subnet=32) as hosts, daemon_on(hosts[0], original) as p0:
        a = wait_for(lambda: ready(p0, original), 60, 0.2, "original daemon ready")
        with daemon_on(hosts[1], copy) as p1:
            b = wait_for(lambda: ready(p1, copy), 60, 0.2, "copied daemon ready")
            assert a["peer_id"] == b["peer_id"] == identity.peer_id

            def reported() -> list[str]:
                found: list[str] = []
                for state in (original, copy):
                    s = status(state)
                    if s is not None:
                        found += s["membership"]["duplicates"] + s["discovery"]["duplicates"]
                return found

            wait_for(reported, 90, 0.25, "a duplicate identity reported")
            # Never merged: neither lists the other (nor itself) as a member.
            for state in (original, copy):
                assert identity.peer_id not in alive_peers(state)
                assert alive_peers(state) == {}
