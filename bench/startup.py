"""How soon a daemon answers ``status`` after its process starts, against a bare Python start on this machine.

Issue #18: a daemon must answer ``status`` within 1 s of its process start (it once imported torch on the way,
and the import starved the event loop). Measured here: the time from ``Popen`` of ``python -m arceusd start
--foreground --preset local`` (a fresh state directory each run) to its first answer to ``status`` over the
control socket, polled every 10 ms; the baseline is ``python -c pass`` started and waited for the same way, so
the ratio says how many bare interpreter starts a daemon start costs. Prints the median of each and the ratio.

    python bench/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from arceusd.base.control import ControlError, call  # noqa: E402


def bare_python_s() -> float:
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.monotonic() - began


def daemon_status_s(timeout: float = 30.0) -> float:
    """Seconds from the daemon's process start to its first ``status`` answer."""
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        began = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "arceusd", "--state-dir", str(state), "start", "--foreground", "--preset", "local"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while time.monotonic() - began < timeout:
                try:
                    call(state / "control.sock", "status", timeout=1.0)
                    return time.monotonic() - began
                except (ControlError, OSError):
                    time.sleep(0.01)
            raise RuntimeError(f"the daemon did not answer status within {timeout} s")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one run of each (make bench's smoke)")
    args = parser.parse_args()
    if args.quick:
        args.runs = 1
    bare = [bare_python_s() for _ in range(args.runs)]
    daemon = [daemon_status_s() for _ in range(args.runs)]
    b, d = statistics.median(bare), statistics.median(daemon)
    print(f"python -c pass          median {b * 1e3:7.1f} ms  (runs: {', '.join(f'{x * 1e3:.0f}' for x in bare)})")
    print(f"daemon answers status   median {d * 1e3:7.1f} ms  (runs: {', '.join(f'{x * 1e3:.0f}' for x in daemon)})")
    print(f"ratio daemon / bare python: {d / b:.1f}x; target: under 1 s ({'met' if d < 1.0 else 'NOT met'})")


if __name__ == "__main__":
    main()
