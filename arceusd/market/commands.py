"""The marketplace's command line: ``arceusd policy``, ``market``, ``earnings``, ``bill``, ``verify-ledger``.

Registered on the ``arceusd`` group by :func:`register` (one line in ``arceusd.cli.commands``). Commands that need the
running daemon go through its control socket (``obj.call``); the policy and the ledgers are files and are read
without one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from arceusd.base.identity import IdentityError, key_path, load_or_create_identity
from arceusd.base.text_safety import safe_tree
from arceusd.jobs.record.view import count, usd_per_hour
from arceusd.market.ledger import LEDGER_FILE, bill, earnings, verify_file
from arceusd.market.policy import PolicyError, lend_reasons
from arceusd.market.policy_file import change_policy, load_policy
from arceusd.market.probes import Snapshot, probe_for

if TYPE_CHECKING:
    from arceusd.cli.context import Context


def _snapshot_line(snap: Snapshot) -> str:
    def show(v: object, fmt: str, unit: str = "") -> str:
        if v is None:
            return "unknown"
        return ("yes" if v else "no") if isinstance(v, bool) else format(v, fmt) + unit

    return (
        f"idle {show(snap.idle_s, '.0f', ' s')}, on mains {show(snap.on_ac, '')}, battery "
        f"{show(snap.battery_percent, '.0f', '%')}, owner's CPU {show(snap.owner_cpu_percent, '.0f', '%')}, "
        f"hour {snap.local_hour}"
    )


@click.command("policy")
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a key of [policy] in config.toml (repeatable), e.g. --set idle_minutes=10.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def policy_command(obj: Context, assignments: tuple[str, ...], as_json: bool) -> None:
    """Show this device's lending policy and whether it would lend now; --set changes it."""
    try:
        if assignments:
            obj.paths.ensure()
            policy = change_policy(obj.paths.config, list(assignments))
        else:
            policy = load_policy(obj.paths.config)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    probe = probe_for(policy.probe_root, own_pids=lambda: (os.getpid(),))
    probe.snapshot(time.time())  # CPU use is a rate: a first reading, then the one that counts
    time.sleep(0.5)
    snap = probe.snapshot(time.time())
    reasons = lend_reasons(policy, snap)
    if as_json:
        body = {
            "policy": asdict(policy),
            "machine": asdict(snap),
            "lends_now": not reasons,
            "reasons": [str(r) for r in reasons],
        }
        click.echo(json.dumps(body, indent=2, sort_keys=True))
        return
    if assignments:
        click.echo(f"saved [policy] in {obj.paths.config}")
    for key, value in asdict(policy).items():
        click.echo(f"  {key:<22} {json.dumps(list(value) if isinstance(value, tuple) else value)}")
    click.echo(f"machine: {_snapshot_line(snap)}")
    click.echo("lends now" if not reasons else "does not lend now: " + "; ".join(str(r) for r in reasons))


def register(group: click.Group) -> None:
    """Add the marketplace's commands to the ``arceusd`` group."""
    for command in (policy_command, market_command, earnings_command, bill_command, verify_ledger_command):
        group.add_command(command)


__all__ = ["register"]


def print_quote(obj: Context, spec: Any, members: int, as_json: bool = False) -> None:
    """``arceusd submit --quote``: the estimate for ``spec`` on ``members`` devices like this one (more when
    ``needs.memory_total_mib`` takes more of them), and what in ``[needs]`` it cannot meet
    (:func:`arceusd.market.estimate.estimate`, which ``arceus.quote`` asks too); ``as_json``: as one JSON object."""
    obj.note_measuring()  # what the devices lend is asked of the daemon, which measures this device first
    # the planner and the forecast: a quote's import, not every command's (0.13 s of each command's start)
    from arceusd.market.estimate import estimate

    est = estimate(obj.state_dir, spec, members)
    if as_json:
        click.echo(json.dumps(est.to_json(), indent=2, sort_keys=True))
        return
    for line in est.lines():
        click.echo(line)


def _market_line(row: dict[str, Any]) -> str:
    cap = f"max {usd_per_hour(row['max_price_per_hour'])}" if row["max_price_per_hour"] else "no max price"
    head = (
        f"{row['job_id'][:12]}  {row['name']:<16} {row['state']:<10} members {count(row['members'])}"
        f"{'/' + count(row['max_members']) if row['max_members'] else ''}  {usd_per_hour(row['price_per_hour'])}"
        f" ({cap})"
    )
    head += "  qualifies" if row["qualifies"] else "  does not qualify: " + "; ".join(row["reasons"])
    return head + "".join(f"\n    warning: {w}" for w in row.get("warnings", []))


@click.command("market")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def market_command(obj: Context, as_json: bool) -> None:
    """List announced jobs, this device's price for each, and whether it qualifies (and if not, why)."""
    obj.note_measuring()  # the daemon measures its device before it prices anything
    result = obj.call("market", timeout=60.0)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    result = safe_tree(result)  # announced jobs' names and reasons come from strangers: escaped
    d = result["device"]
    click.echo(
        f"this device: {d['kind']}, {d['flops_per_s'] / 1e9:.1f} GFLOP/s, lends {d['memory_bytes'] >> 20} MiB;"
        f" demand {result['demand']['jobs_wanting']} job(s) wanting, {result['demand']['idle_devices']} idle"
    )
    if not result["jobs"]:
        click.echo("no announced jobs")
    for row in result["jobs"]:
        click.echo(_market_line(row))


def _own_key(obj: Context) -> bytes | None:
    """This daemon's public key, when its state directory has one (its own ledger must be kept by it)."""
    if not key_path(obj.state_dir).exists():
        return None
    try:
        return load_or_create_identity(obj.state_dir).public_key_raw
    except IdentityError:
        return None


def _ledger_entries(obj: Context) -> list[Any]:
    path = obj.state_dir / LEDGER_FILE
    if not path.exists():
        return []
    verified = verify_file(path, _own_key(obj))
    if not verified.ok:
        raise click.ClickException(
            f"the ledger {path} does not verify: {verified.error}. "
            "It was changed outside Arceus; run `arceusd verify-ledger` on it and keep a copy."
        )
    return verified.entries


@click.command("earnings")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def earnings_command(obj: Context, as_json: bool) -> None:
    """What this device earned: its countersigned receipts by job, by day and in total, in dollars."""

    try:
        me = load_or_create_identity(obj.state_dir).peer_id
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from None
    result = earnings(_ledger_entries(obj), me)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    result = safe_tree(result)  # receipts' ids come from the network: escaped
    click.echo(
        f"earned ${result['total_usd']:.4f} for {result['device_hours']:.3f} device-hours "
        f"({result['flops']:.3g} FLOPs, {result['receipts']} receipt(s))"
    )
    for job, usd in result["by_job"].items():
        click.echo(f"  job {job[:12]}  ${usd:.4f}")
    for day, usd in result["by_day"].items():
        click.echo(f"  day {day}  ${usd:.4f}")


@click.command("bill")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def bill_command(obj: Context, job: str, as_json: bool) -> None:
    """What JOB (an id or a unique prefix) costs its owner: the devices' countersigned receipts (the owner's own
    device is not billed). The whole bill is in the owner's ledger; on another device it is that device's part
    only, and says so."""

    try:
        me = load_or_create_identity(obj.state_dir).peer_id
    except IdentityError as exc:
        raise click.ClickException(str(exc)) from None
    entries = _ledger_entries(obj)
    ids = sorted({s.receipt.job_id for s in entries if s.receipt.job_id.startswith(job)})
    if len(ids) != 1:
        raise click.ClickException(
            f"no receipts for a job {job!r} in this ledger"
            if not ids
            else f"{job!r} matches several jobs; give more of the id"
        )
    result = bill(entries, ids[0])
    result["complete"] = result["owner"] == me  # only the owner's ledger holds every device's receipts
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    result, ids = safe_tree(result), safe_tree(ids)  # receipts' ids come from the network: escaped
    if not result["complete"]:
        click.echo(
            f"job {ids[0]}: this device's part only (${result['total_usd']:.4f} for "
            f"{result['device_hours']:.3f} device-hours); the whole bill is in the owner's ledger: run "
            f"`arceusd bill {ids[0][:12]}` on {str(result['owner'])[:12]}"
        )
        return
    click.echo(f"job {ids[0]}: ${result['total_usd']:.4f} for {result['device_hours']:.3f} device-hours")
    for device, usd in result["by_device"].items():
        click.echo(f"  {device[:12]}  ${usd:.4f}")
    click.echo(f"  {str(result['owner'])[:12]}  own device, not billed")  # (market.receipts.billed)
    if result["unaccepted_receipts"]:
        click.echo(f"  ({result['unaccepted_receipts']} receipt(s) not countersigned by their device: not owed)")


@click.command("verify-ledger")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_obj
def verify_ledger_command(obj: Context, file: Path) -> None:
    """Check a ledger FILE and its signed head: the hash chain, the keeper's signature of every line, every
    receipt's signatures, and that each receipt's leader is its job's owner or one the owner authorised."""
    own = file.resolve() == (obj.state_dir / LEDGER_FILE).resolve()
    verified = verify_file(file, _own_key(obj) if own else None)
    if not verified.ok:
        raise click.ClickException(f"{file}: {verified.error} ({verified.lines} line(s) before it verify)")
    signers = {s.receipt.leader for s in verified.entries} | {s.receipt.device for s in verified.entries}
    click.echo(
        f"{file}: {len(verified.entries)} receipt(s) verify, chain intact, kept by {verified.keeper[:12]}, "
        f"{len(signers)} signer(s), {len(verified.auths)} leader authorisation(s)"
    )
