"""The marketplace attacks of issue 29 beside a no-attack baseline (``python bench/adversarial.py --market``).

Each run is a fresh 3-daemon swarm on loopback training the small MLP job:

* ``none`` / ``overclaim 1000x``: member 2 honest, then offering 1,000 times its speed
  (``tests/adversarial/hostile_job.py``). Printed: what the owner's bill owes each member and the liar's ratio to
  the honest member on the same machine, and the speed the liar was paid for (``market`` status ``paid_speed``).
* ``none`` / ``withhold`` / ``zero`` (the owner's workers nap 0.5 s a step: a checkpoint every ~10 s): the owner
  honest, never sending receipts, or pricing them at $0 (``tests/adversarial/hostile_market.py``). Printed per
  member: whether it left, at which of its worker's steps, the checkpoints unpaid then, and what it was paid.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any


def _bill(s: Any, job_id: str) -> dict[str, Any]:
    from arceusd.market.ledger import bill, verify_file

    verified = verify_file(s.state_dir(0) / "ledger.jsonl")
    return bill(verified.entries, job_id) if verified.ok else {"by_device": {}, "error": verified.error}


def _settled(s: Any, job_id: str, devices: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    b = _bill(s, job_id)
    while time.monotonic() < deadline and (b.get("unaccepted_receipts") or not devices <= set(b["by_device"])):
        time.sleep(0.5)
        b = _bill(s, job_id)
    return b


def pay_attacks(quick: bool) -> None:
    from tests.adversarial.hostile_job import HostileSwarm
    from tests.integration.test_recovery import submit, wait_end, write_spec

    steps = 100 if quick else 160
    print(f"{'attack':<18} {'job s':>6} {'honest $':>10} {'member 2 $':>11} {'ratio':>6}  member 2 paid for")
    for attack, arg in (("none", ""), ("overclaim", "1000")):
        with tempfile.TemporaryDirectory(prefix="arceus-adv-market-") as tmp:
            spec = write_spec(Path(tmp), steps=steps, interval=20)
            s = HostileSwarm(Path(tmp) / "swarm", attack, arg, after=0)
            try:
                s.start()
                s.wait_converged()
                ids = [s.call(i, "status")["peer_id"] for i in range(3)]
                began = time.monotonic()
                job_id = submit(s, spec)
                end = wait_end(s, job_id, timeout=400)
                took = time.monotonic() - began
                owed = _settled(s, job_id, {ids[1], ids[2]})["by_device"]
                paid = s.call(0, "status")["market"]["paid_speed"].get(job_id, {}).get(ids[2], {})
            finally:
                s.close()
            honest, other = owed.get(ids[1], 0.0), owed.get(ids[2], 0.0)
            name = f"{attack} {arg}x" if arg else attack
            ratio = f"{other / honest:6.2f}" if honest else "     -"
            print(
                f"{name:<18} {took:6.1f} {honest:10.6f} {other:11.6f} {ratio}  {paid.get('paid_gflops')} of "
                f"{paid.get('offered_gflops')} GFLOP/s ({paid.get('basis')}); job {end['state']}",
                flush=True,
            )


def unpaid_attacks(quick: bool) -> None:
    from tests.adversarial.hostile_market import MarketSwarm
    from tests.integration.test_recovery import submit, wait_end, write_spec

    steps = 120 if quick else 160
    print(f"{'owner':<10} {'job s':>6}  per member: left at step / unpaid checkpoints / paid $")
    for attack in ("none", "withhold", "zero"):
        with tempfile.TemporaryDirectory(prefix="arceus-adv-market-") as tmp:
            spec = write_spec(Path(tmp), steps=steps, interval=20)
            s = MarketSwarm(Path(tmp) / "swarm", attack, nap=0.5)
            try:
                s.start()
                s.wait_converged()
                began = time.monotonic()
                job_id = submit(s, spec)
                end = wait_end(s, job_id, timeout=400)
                took = time.monotonic() - began
                rows = []
                for i in (1, 2):
                    market = s.call(i, "status")["market"]
                    left = [x for x in market["left_unpaid"] if x["job_id"] == job_id]
                    usd = market["pay"].get(job_id, {}).get("paid_usd", 0.0)
                    rows.append(
                        f"{left[0]['worker_step']} / {left[0]['unpaid_checkpoints']} / {usd:.6f}"
                        if left
                        else f"stayed / - / {usd:.6f}"
                    )
            finally:
                s.close()
            print(f"{attack:<10} {took:6.1f}  {' | '.join(rows)}; job {end['state']}", flush=True)


def market_attacks(quick: bool) -> int:
    pay_attacks(quick)
    unpaid_attacks(quick)
    return 0


__all__ = ["market_attacks", "pay_attacks", "unpaid_attacks"]
