"""Test harness: real ``arceusd`` daemons as separate processes with their own state directories.

Every wait is bounded in time. Daemons are started with the ``local`` preset on loopback; teardown sends SIGTERM,
then SIGKILL after a grace period, so a failing test never leaves processes behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def arceusd_cmd(state_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "arceusd", "--state-dir", str(state_dir), *args]


def run_cli(state_dir: Path, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(arceusd_cmd(state_dir, *args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def wait_for(predicate: Callable[[], T | None], timeout: float, interval: float = 0.05, what: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what or predicate} (last: {last!r})")


class Daemon:
    """One ``arceusd start --foreground`` process."""

    def __init__(
        self,
        state_dir: Path,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ):
        self.state_dir = state_dir
        self.extra_args = extra_args or []
        self.env = env
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. lower its open-files limit)
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = state_dir.parent / f"{state_dir.name}.stderr.log"

    def start(self, wait: bool = True, timeout: float = 30.0) -> Daemon:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {}), "PYTHONUNBUFFERED": "1"}
        self._log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            arceusd_cmd(self.state_dir, "start", "--foreground", "--preset", "local", *self.extra_args),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            preexec_fn=self.preexec_fn,
        )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.output()}")
            return self.try_status()

        return wait_for(ready, timeout, interval=0.1, what=f"daemon {self.state_dir} ready")

    def try_status(self) -> dict[str, Any] | None:
        from arceusd.base.control import ControlError, call

        try:
            result: dict[str, Any] = call(self.state_dir / "control.sock", "status", timeout=5.0)
        except (ControlError, OSError):
            return None
        return result

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        from arceusd.base.control import call

        return call(self.state_dir / "control.sock", method, params, timeout=timeout)

    def status(self) -> dict[str, Any]:
        result = self.call("status")
        assert isinstance(result, dict)
        return result

    def cli_json(self, *args: str) -> Any:
        proc = run_cli(self.state_dir, *args, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        try:
            return self.log_path.read_text()[-8000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            return None
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


@contextmanager
def daemons(tmp_path: Path, count: int, args: Callable[[int], list[str]] | None = None) -> Iterator[list[Daemon]]:
    """Start ``count`` daemons (state dirs ``tmp_path/d0``...) and always tear them down."""
    started: list[Daemon] = []
    try:
        for i in range(count):
            d = Daemon(tmp_path / f"d{i}", args(i) if args else None)
            d.start(wait=False)
            started.append(d)
        for d in started:
            d.wait_ready()
        yield started
    finally:
        for d in started:
            d.stop(timeout=10)
