"""The command's start as the quote times a job: the process's own start, its imports included."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from arceusd.cli.began import MAX_AGE_S, began_from

ROOT = Path(__file__).resolve().parents[2]
STAT = (
    "4242 (python3 -m a) S 1 4242 4242 0 -1 4194560 900 0 0 0 80 9 0 0 20 0 3 0 {start} 1000 100 18446744073709551615"
)


def test_a_command_began_when_its_process_did_not_when_its_code_ran() -> None:
    """bench/quote.py timed each job from running ``arceusd submit``; the command took its start after its imports
    (about 1 s here), so every job measured that much shorter on the daemon than for its user."""
    code = "import time; time.sleep(0.6); from arceusd.cli.began import process_began as b; print(time.time() - b())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True)
    after = time.time()
    waited = float(out.stdout)
    assert 0.6 <= waited <= after - before + 0.05, (waited, after - before)  # (10 ms ticks)


def test_a_start_is_read_from_the_process_and_the_uptime_and_one_that_makes_no_sense_is_now() -> None:
    # started 1000.00 s after boot (100 ticks/s), the system up 1001.25 s at now: it began 1.25 s ago
    assert began_from(STAT.format(start=100000), "1001.25 5000.0", 100, 50.0) == pytest.approx(48.75)
    assert began_from(STAT.format(start=100000), "999.0 1.0", 100, 50.0) == 50.0  # after now: not believed
    old = 1000.0 + MAX_AGE_S + 1.0  # a notebook's process, not a command typed now
    assert began_from(STAT.format(start=100000), f"{old} 1.0", 100, 50.0) == 50.0
    with pytest.raises((ValueError, IndexError)):
        began_from("4242 (x) S 1", "1.0 1.0", 100, 50.0)
