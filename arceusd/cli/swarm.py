"""A local swarm: several daemons on loopback, each a child process with its own state directory.

Used by ``arceusd demo`` (and handy for trying things by hand). Daemons get the ``local`` preset and each other
as static seeds, so the swarm forms without multicast. With :data:`PROFILE_ENV` set (the test suite sets it) the
daemons start with one shared measurement of the machine instead of each measuring it. Every wait is bounded;
:meth:`LocalSwarm.close` stops the children with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from arceusd.base.control import ControlError, call
from arceusd.worker.affinity import usable_cores

PROFILE_ENV = "ARCEUSD_SWARM_PROFILE"
"""A folder where swarms keep the one measurement of the machine their daemons share (its
``device_profile.json``, measured there by the first swarm that needs it). Unset, each daemon measures itself."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on loopback (bound and released; a small race is acceptable here)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_cpu_args(index: int, size: int, cores: list[int]) -> list[str]:
    """The ``--worker-cpus`` flag of daemon ``index`` of ``size`` on one machine with ``cores``: a core of its
    own, or no flag when the daemons outnumber the cores (pinned, two workers would share a core while the
    others idle; unpinned, the OS spreads them)."""
    if size > len(cores):
        return []
    return ["--worker-cpus", str(sorted(cores)[index])]


class LocalSwarm:
    def __init__(
        self,
        root: Path,
        size: int,
        extra_args: list[str] | None = None,
        preset: str = "local",
        env: dict[str, str] | None = None,
        pin_workers: bool = False,
    ) -> None:
        """``preset`` sets the timings: ``local`` (tens of ms, for membership tests) or ``lan`` (memberlist's,
        for swarms that also train: torch workers can starve a small machine's CPU for longer than ``local``
        tolerates). Either way the swarm stays on loopback with mDNS off. ``pin_workers``: each daemon's stage
        worker gets a core of its own (``--worker-cpus``) when there are enough (:func:`worker_cpu_args`)."""
        self.root = root
        self.preset = preset
        self.size = size
        self.extra_args = extra_args or []
        self.pin_workers = pin_workers
        self.env = {**os.environ, **(env or {})}
        shared = self.env.get(PROFILE_ENV, "")
        self.profile = Path(shared) / "device_profile.json" if shared else None
        """The shared measurement of this machine (:data:`PROFILE_ENV`): the daemons of one machine measured
        at once on its cores each measured a third of it, and paid a torch import and a benchmark each."""
        self.ports = free_ports(size)
        self.procs: list[subprocess.Popen[bytes]] = []

    def state_dir(self, i: int) -> Path:
        return self.root / f"node{i}"

    def start(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        self._measure_once()
        for i in range(self.size):
            self.procs.append(self._spawn(i))
        return [self.wait_ready(i, timeout) for i in range(self.size)]

    def _measure_once(self) -> None:
        """Measure the machine into :attr:`profile` unless it is there (at one torch thread, ``worker_threads``'
        default: a daemon configured with more measures itself again, its cache being of another thread count)."""
        if self.profile is None or self.profile.is_file():
            return
        self.profile.parent.mkdir(parents=True, exist_ok=True)
        # "1": worker_threads' default
        probe = [sys.executable, "-m", "arceusd.jobs.procs.probe", str(self.profile.parent), "1"]
        subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, env=self.env, timeout=300, check=True)

    def daemon_command(self, i: int, module: str = "arceusd") -> list[str]:
        """The command line that starts daemon ``i`` (``python -m module``, a stand-in for ``arceusd`` in the
        adversarial tests) on its port and state folder, seeded with the others' addresses."""
        seeds = [a for j, port in enumerate(self.ports) if j != i for a in ("--peer", f"127.0.0.1:{port}")]
        state = self.state_dir(i)
        state.mkdir(parents=True, exist_ok=True)
        return [
            sys.executable,
            "-m",
            module,
            "--state-dir",
            str(state),
            "start",
            "--foreground",
            "--preset",
            self.preset,
            "--host",
            "127.0.0.1",
            "--no-mdns",
            "--port",
            str(self.ports[i]),
            "--log-file",
            str(state / "arceusd.log"),
            *seeds,
            *self.extra_args,
        ]

    def share_profile(self, i: int) -> None:
        """Give daemon ``i`` the shared measurement of this machine unless it has a profile of its own."""
        mine = self.state_dir(i) / "device_profile.json"
        if self.profile is not None and self.profile.is_file() and not mine.exists():
            mine.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.profile, mine)

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        cmd = self.daemon_command(i)
        self.share_profile(i)
        if self.pin_workers:
            cmd += worker_cpu_args(i, self.size, usable_cores())
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env
        )

    def restart(self, i: int, timeout: float = 60.0) -> dict[str, Any]:
        """Start daemon ``i`` again (after it exited or was killed) with the same state directory and port."""
        if self.procs[i].poll() is None:
            raise RuntimeError(f"daemon {i} is still running")
        self.procs[i] = self._spawn(i)
        return self.wait_ready(i, timeout)

    def wait_ready(self, i: int, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(
                    f"daemon {i} exited with code {self.procs[i].returncode}; see {self.state_dir(i) / 'arceusd.log'}"
                )
            try:
                result: dict[str, Any] = self.call(i, "status")
                return result
            except ControlError:
                time.sleep(0.1)
        raise RuntimeError(f"daemon {i} did not become ready within {timeout:.0f} s")

    def __enter__(self) -> LocalSwarm:
        """Start every daemon and wait until they all see each other alive; leaving the block closes them."""
        try:
            self.start()
            self.wait_converged()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def converged(self) -> bool:
        """Whether every daemon sees every other one alive."""
        return all(sum(p["state"] == "alive" for p in self.call(i, "peers")) == self.size - 1 for i in range(self.size))

    def wait_converged(self, timeout: float = 30.0) -> None:
        """Wait until :meth:`converged`; ``TimeoutError`` naming what each daemon sees after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.converged():
            if time.monotonic() > deadline:
                seen = [sum(p["state"] == "alive" for p in self.call(i, "peers")) for i in range(self.size)]
                raise TimeoutError(
                    f"the swarm did not converge in {timeout:.0f} s: daemons see {seen} peers alive, "
                    f"expected {self.size - 1} each"
                )
            time.sleep(0.2)

    def call(self, i: int, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        return call(self.state_dir(i) / "control.sock", method, params, timeout=timeout)

    def signal(self, i: int, sig: signal.Signals) -> None:
        """Send ``sig`` to daemon ``i`` (tests: SIGKILL, SIGSTOP/SIGCONT)."""
        self.procs[i].send_signal(sig)

    def wait(self, i: int, timeout: float) -> int:
        return self.procs[i].wait(timeout=timeout)

    def close(self, grace: float = 10.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
