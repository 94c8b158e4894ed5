"""The market's file-only commands through the real CLI: earnings, bill, verify-ledger, policy."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from arceusd.base.identity import load_or_create_identity
from arceusd.cli.commands import cli
from arceusd.market.ledger import Ledger
from arceusd.market.receipts import countersign, sign_leader
from tests.unit.test_market_receipts import DEV_B, JOB, LEADER, receipt


def test_earnings_bill_and_verify(tmp_path: Path) -> None:
    state = tmp_path / "state"
    me = load_or_create_identity(state)
    ledger = Ledger.open(state)
    for i, dev in enumerate((me, DEV_B, me)):
        r = receipt(device=dev.peer_id, step_from=10 * i, step_to=10 * i + 10, device_seconds=3600.0)
        ledger.append(countersign(dev, sign_leader(LEADER, r)))
    runner = CliRunner()
    out = runner.invoke(cli, ["--state-dir", str(state), "earnings", "--json"])
    assert out.exit_code == 0, out.output
    mine = json.loads(out.output)
    assert mine["receipts"] == 2 and abs(mine["total_usd"] - 0.6) < 1e-9
    billed = runner.invoke(cli, ["--state-dir", str(state), "bill", JOB[:8], "--json"])
    assert billed.exit_code == 0 and abs(json.loads(billed.output)["total_usd"] - 0.9) < 1e-9
    assert json.loads(billed.output)["complete"] is False, "this device is not the job's owner"
    partial = runner.invoke(cli, ["--state-dir", str(state), "bill", JOB[:8]])
    assert partial.exit_code == 0 and "this device's part only" in partial.output, partial.output
    text = runner.invoke(cli, ["--state-dir", str(state), "earnings"])
    assert "earned $0.6000 for 2.000 device-hours" in text.output
    path = state / "ledger.jsonl"
    ok = runner.invoke(cli, ["verify-ledger", str(path)])
    assert ok.exit_code == 0 and "3 receipt(s) verify" in ok.output
    lines = path.read_text().splitlines(keepends=True)
    obj = json.loads(lines[1])
    obj["body"] = obj["body"][:-2] + ("00" if obj["body"][-2:] != "00" else "01")
    lines[1] = json.dumps(obj, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    bad = runner.invoke(cli, ["verify-ledger", str(path)])
    assert bad.exit_code != 0 and "line 2" in bad.output and "1 line(s) before it verify" in bad.output
    refused = runner.invoke(cli, ["--state-dir", str(state), "earnings"])
    assert refused.exit_code != 0 and "does not verify: line 2" in refused.output


def test_policy_set_and_show(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["--state-dir", str(tmp_path), "policy", "--set", "lend=false", "--json"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert shown["policy"]["lend"] is False and not shown["lends_now"]
    assert "lending is off" in shown["reasons"][0]
    bad = runner.invoke(cli, ["--state-dir", str(tmp_path), "policy", "--set", "idle_minutes=-3"])
    assert bad.exit_code != 0 and "idle_minutes" in bad.output
