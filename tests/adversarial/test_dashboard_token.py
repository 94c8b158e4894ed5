"""Issue 29 (b): ``arceusd dashboard`` opened the browser with the token URL as an argument, so another local
user read the token from the process table; the daemon's log was mode 0644. Now the browser is given a 0600
page in the state directory that leads on to the URL (``arceusd/dashboard/opener.py``) and the log is 0600
(``arceusd/base/logs.py``). The test plays the other user (``tests/adversarial/proc_peek.py``): while
``arceusd dashboard --open`` runs with a browser that stays open, it reads every process's command line and
environment in /proc (as the same user, which sees more than another would) and every file in the state
directory that others may read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.adversarial.proc_peek import peek_at_dashboard
from tests.adversarial.victim import start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_token_is_on_no_command_line_and_the_log_is_private(tmp_path: Path) -> None:
    log = tmp_path / "arceusd.log"
    log.write_text("")
    log.chmod(0o644)  # as an older daemon left it
    d0 = start_daemon(tmp_path, "d0", "--no-auto-join", "--log-file", str(log))
    try:
        seen = peek_at_dashboard(d0, log)
        assert len(seen.token) >= 24, seen.url
        assert seen.returncode == 0, seen.stderr
        assert seen.browsers_seen >= 3, (seen.browsers_seen, seen.scans)  # the scans ran while the browser was open
        assert not seen.leaks, f"the token is in the command line or environment of {seen.leaks}"
        assert seen.token in seen.stdout  # the user who asked is shown the URL
        assert seen.page_mode == 0o600 and seen.page_has_url, (seen.page_mode, seen.page_has_url)
        assert not seen.exposed, f"files others may read hold the token: {seen.exposed}"
        assert seen.log_mode == 0o600, oct(seen.log_mode or 0)
        assert log.stat().st_size > 0 and not seen.log_has_token
    finally:
        assert d0.stop() == 0
