"""Issue 29's attacks on what a daemon keeps to itself, against real daemons (``python bench/adversarial.py
--secrets``), each beside its no-attack control in the same run, one row each with pass/fail:

* ``dashboard --open``: another local user reads every process's command line and environment in /proc while
  ``arceusd dashboard --open`` runs with a browser that stays open (``tests/adversarial/proc_peek.py``), and every
  file in the state directory others may read; the daemon's log was left 0644. Control: a process holding the
  token URL on its command line (what the old opener started) is found by the same scan. Printed: in how many
  processes the token was found over how many scans, the opener page's and the log's modes.
* ledger forgeries (``tests/adversarial/ledger_forgeries.py``): an owner's honest ledger (the control: it
  verifies, ``bill`` owes $2.00 and a daemon started on it reports it ok), then each forgery on a copy of it, by a
  forger without the keeper's key (and, without ``--quick``, one holding it): ``arceusd verify-ledger`` and
  ``arceusd bill`` each refuse it with one error line naming the line and why, and a real daemon started on
  the copy reports its ledger as not verifying in ``status``. The keeper itself removing one of its own receipts
  and signing the rest again is the one forgery its own ledger cannot show (open; ``docs/threat-model.md``): its
  row says so rather than pass.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def dashboard_row(tmp: Path, quick: bool) -> bool:
    from tests.adversarial.proc_peek import peek_at_dashboard, proc_texts
    from tests.adversarial.victim import start_daemon

    log = tmp / "arceusd.log"
    log.write_text("")
    log.chmod(0o644)  # as an older daemon left it
    daemon = start_daemon(tmp, "dash", "--no-auto-join", "--log-file", str(log))
    try:
        seen = peek_at_dashboard(daemon, log, browser_seconds=2.0 if quick else 3.0)
        # the control: the same scan finds the token where the old opener put it, on a command line
        decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", seen.url])
        try:
            deadline, found = time.monotonic() + 10, 0
            while not found and time.monotonic() < deadline:
                found = sum(seen.token in t for t in proc_texts().values())
                time.sleep(0.05)
        finally:
            decoy.kill()
            decoy.wait(timeout=10)
    finally:
        daemon.stop()
    ok = (
        seen.returncode == 0
        and seen.browsers_seen >= 3
        and not seen.leaks
        and not seen.exposed
        and seen.page_mode == 0o600
        and seen.log_mode == 0o600
        and not seen.log_has_token
        and found >= 1
    )
    print(
        f"{'dashboard --open':<50} token in {len(seen.leaks)} of {seen.processes} processes over {seen.scans} "
        f"scans (browser open in {seen.browsers_seen}; control, a command line holding it: found in {found}); "
        f"{len(seen.exposed)} readable files hold it; opener page {oct(seen.page_mode or 0)}, "
        f"log 0o644 -> {oct(seen.log_mode or 0)}  {_verdict(ok)}",
        flush=True,
    )
    return ok


def _ledger_status(state: Path, tmp: Path, name: str) -> dict[str, object]:
    """The ``market.ledger`` part of ``status`` from a real daemon started on a copy of ``state``."""
    from tests.adversarial.victim import start_daemon

    shutil.copytree(state, tmp / name)
    daemon = start_daemon(tmp, name, "--no-auto-join")
    try:
        ledger: dict[str, object] = daemon.status()["market"]["ledger"]
        return ledger
    finally:
        daemon.stop()


def _refusals(state: Path, job: str) -> tuple[list[str], list[str]]:
    """The error lines ``verify-ledger`` and ``bill`` write on ``state``'s ledger (empty where one exited 0)."""
    from tests.harness import run_cli

    out = []
    for args in (("verify-ledger", str(state / "ledger.jsonl")), ("bill", job[:8])):
        done = run_cli(state, *args)
        out.append([ln for ln in done.stderr.splitlines() if ln.strip()] if done.returncode else [])
    return out[0], out[1]


def ledger_rows(tmp: Path, quick: bool) -> bool:
    from tests.adversarial.ledger_forgeries import FORGERIES, JOB, WHY, forge, keeper_can_hide, owners_ledger
    from tests.harness import run_cli

    honest = tmp / "owner"
    me = owners_ledger(honest)
    bill = json.loads(run_cli(honest, "bill", JOB[:8], "--json").stdout)
    verify = run_cli(honest, "verify-ledger", str(honest / "ledger.jsonl"))
    status = _ledger_status(honest, tmp, "honest")
    all_ok = ok = verify.returncode == 0 and status.get("ok") is True and abs(bill["total_usd"] - 2.0) < 1e-9
    print(
        f"{'ledger: honest (control)':<50} verify-ledger exit {verify.returncode}, bill ${bill['total_usd']:.2f}, "
        f"daemon status ok={status.get('ok')} receipts={status.get('receipts')}  {_verdict(ok)}",
        flush=True,
    )
    for keeper in (False,) if quick else (False, True):
        for k, name in enumerate(FORGERIES):
            state = tmp / f"forged-{int(keeper)}-{k}"
            shutil.copytree(honest, state)
            forge(state, me, name, keeper)
            verify_errors, bill_errors = _refusals(state, JOB)
            status = _ledger_status(state, tmp, f"daemon-{int(keeper)}-{k}")
            where, why = FORGERIES[name][1], WHY[name]
            label = f"ledger: {name}{' (keeper key)' if keeper else ''}"
            if keeper_can_hide(name, keeper):
                shown = bool(verify_errors or bill_errors) or status.get("ok") is False
                print(f"{label:<50} accepted (open: only the counterpart's copy shows it); shown={shown}", flush=True)
                continue
            ok = all(len(e) == 1 and where in e[0] and why in e[0] for e in (verify_errors, bill_errors))
            ok = ok and status.get("ok") is False
            all_ok = all_ok and ok
            said = (verify_errors or ["(accepted)"])[0].split(": ", 2)[-1]
            print(
                f"{label:<50} verify-ledger and bill refused ({len(verify_errors)}+{len(bill_errors)} lines), "
                f"daemon status ok={status.get('ok')}: {said[:110]}  {_verdict(ok)}",
                flush=True,
            )
    return all_ok


def secret_attacks(quick: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="arceus-adv-secrets-") as tmp:
        ok = dashboard_row(Path(tmp), quick)
        ok = ledger_rows(Path(tmp), quick) and ok
    return 0 if ok else 1


__all__ = ["dashboard_row", "ledger_rows", "secret_attacks"]
