"""Watching a victim process during an attack: RSS, threads and fds from /proc, and ``status`` latency over the
control socket, sampled in a background thread (every wait bounded).

``with Watch(daemon) as w: ...attack...`` then ``w.report`` holds the peaks; :func:`assert_healthy` checks
them against stated bounds, and :func:`hostile` runs one attack of :mod:`tests.adversarial.hostile_peer` in
its own process and returns its JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import ROOT, Daemon

#: A status answer slower than this counts as a failure of the attack's bound.
STATUS_BOUND_S = 1.0


def proc_stats(pid: int) -> dict[str, int]:
    """RSS (KiB), thread count and open fds of ``pid`` from /proc."""
    out = {"rss_kib": 0, "threads": 0, "fds": 0}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


@dataclass
class Report:
    samples: int = 0
    peak_rss_mib: float = 0.0
    max_threads: int = 0
    max_fds: int = 0
    status_max_s: float = 0.0
    status_failures: int = 0
    status_latencies: list[float] = field(default_factory=list)
    exited: bool = False

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.status_latencies)
        return {
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "max_threads": self.max_threads,
            "max_fds": self.max_fds,
            "status_max_s": round(self.status_max_s, 3),
            "status_p50_s": round(lat[len(lat) // 2], 4) if lat else None,
            "status_failures": self.status_failures,
            "exited": self.exited,
        }


class Watch:
    """Sample a daemon (and optionally other pids) until the block ends."""

    def __init__(self, daemon: Daemon | None, pids: tuple[int, ...] = (), interval: float = 0.1) -> None:
        self.daemon = daemon
        self.pids = (daemon.pid,) if daemon is not None else pids
        self.interval = interval
        self.report = Report()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        from arceusd.base.control import call

        r = self.report
        while not self._stop.is_set():
            for pid in self.pids:
                try:
                    st = proc_stats(pid)
                except (FileNotFoundError, ProcessLookupError):
                    r.exited = True
                    continue
                r.peak_rss_mib = max(r.peak_rss_mib, st["rss_kib"] / 1024)
                r.max_threads = max(r.max_threads, st["threads"])
                r.max_fds = max(r.max_fds, st["fds"])
            if self.daemon is not None:
                began = time.monotonic()
                try:
                    call(self.daemon.state_dir / "control.sock", "status", timeout=STATUS_BOUND_S * 3)
                    took = time.monotonic() - began
                    r.status_latencies.append(took)
                    r.status_max_s = max(r.status_max_s, took)
                except Exception:
                    r.status_failures += 1
                if self.daemon.proc is not None and self.daemon.proc.poll() is not None:
                    r.exited = True
            r.samples += 1
            self._stop.wait(self.interval)


def baseline(daemon: Daemon, seconds: float = 1.5) -> Report:
    with Watch(daemon) as w:
        time.sleep(seconds)
    return w.report


def assert_healthy(
    report: Report, base: Report, *, rss_extra_mib: float, threads_extra: int = 80, fds_extra: int = 200
) -> None:
    """No exit, every status answered within STATUS_BOUND_S, and RSS/threads/fds within stated bounds over the
    no-attack baseline measured just before."""
    s = report.summary()
    print(f"under attack: {s}; baseline: {base.summary()}")  # the figures, shown with pytest -s
    assert not report.exited, f"the daemon exited under attack: {s}"
    assert report.samples >= 3, s
    assert report.status_failures == 0, f"status failed under attack: {s}"
    assert report.status_max_s < STATUS_BOUND_S, f"status took {report.status_max_s:.3f} s under attack: {s}"
    assert report.peak_rss_mib < base.peak_rss_mib + rss_extra_mib, (
        f"peak RSS {report.peak_rss_mib:.0f} MiB over the bound {base.peak_rss_mib:.0f} + {rss_extra_mib} MiB: {s}"
    )
    assert report.max_threads < base.max_threads + threads_extra, s
    assert report.max_fds < base.max_fds + fds_extra, s


def hostile(attack: str, target: str, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run one attack in its own process; its JSON result line."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.adversarial.hostile_peer", attack, "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, f"hostile peer failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def peer_address(daemon: Daemon) -> str:
    address: str = daemon.status()["addresses"]["peer"]
    return address


def start_daemon(tmp_path: Path, name: str, *extra: str) -> Daemon:
    d = Daemon(tmp_path / name, ["--host", "127.0.0.1", "--port", "0", "--no-mdns", *extra])
    return d.start()


def hostile_background(attack: str, target: str, *args: str) -> subprocess.Popen[str]:
    """Start one attack in its own process without waiting; read its result with :func:`finish`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.adversarial.hostile_peer", attack, "--target", target, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"hostile peer failed ({proc.returncode}):\n{err[-4000:]}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def raw_call(target: str, payload: bytes = b"", timeout: float = 1.0) -> bytes:
    """One unary call over plain grpc (an empty request is answered with nothing: a call slot was free)."""
    import grpc

    from arceusd.transport import CALL_METHOD

    with grpc.insecure_channel(target) as channel:
        answer: bytes = channel.unary_unary(CALL_METHOD)(payload, timeout=timeout)
        return answer


class PeerViews:
    """What a real peer thinks of ``subject``, sampled every 0.1 s until the block ends (each call bounded):
    ``states`` holds one state per sample (``unknown`` when absent, ``observer_failed`` when the call failed)."""

    def __init__(self, observer: Daemon, subject: str) -> None:
        self.observer, self.subject = observer, subject
        self.states: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeerViews:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                views = self.observer.call("peers", timeout=2.0)
                self.states += [p["state"] for p in views if p["peer_id"] == self.subject] or ["unknown"]
            except Exception:
                self.states.append("observer_failed")
            self._stop.wait(0.1)
