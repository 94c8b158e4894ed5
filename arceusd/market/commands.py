"""The marketplace's command line: ``arceusd policy``, ``market``, ``earnings``, ``bill``, ``verify-ledger``.

Registered on the ``arceusd`` group by :func:`register` (one line in ``arceusd.cli``). Commands that need the
running daemon go through its control socket (``obj.call``); the policy and the ledgers are files and are read
without one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from arceusd.market.policy import PolicyError, lend_reasons
from arceusd.market.policy_file import load_policy, save_policy, set_values
from arceusd.market.probes import Snapshot, probe_for

if TYPE_CHECKING:
    from arceusd.cli import Context


def _snapshot_line(snap: Snapshot) -> str:
    def show(v: object, fmt: str, unit: str = "") -> str:
        if v is None:
            return "unknown"
        return ("yes" if v else "no") if isinstance(v, bool) else format(v, fmt) + unit

    return (f"idle {show(snap.idle_s, '.0f', ' s')}, on mains {show(snap.on_ac, '')}, battery "
            f"{show(snap.battery_percent, '.0f', '%')}, owner's CPU {show(snap.owner_cpu_percent, '.0f', '%')}, "
            f"hour {snap.local_hour}")  # fmt: skip


@click.command("policy")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Change a key of [policy] in config.toml (repeatable), e.g. --set idle_minutes=10.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def policy_command(obj: Context, assignments: tuple[str, ...], as_json: bool) -> None:
    """Show this device's lending policy and whether it would lend now; --set changes it."""
    try:
        policy = load_policy(obj.paths.config)
        if assignments:
            policy = set_values(policy, list(assignments))
            obj.paths.ensure()
            save_policy(obj.paths.config, policy)
    except PolicyError as exc:
        raise click.ClickException(str(exc)) from None
    probe = probe_for(policy.probe_root, own_pids=lambda: (os.getpid(),))
    probe.snapshot(time.time())  # CPU use is a rate: a first reading, then the one that counts
    time.sleep(0.5)
    snap = probe.snapshot(time.time())
    reasons = lend_reasons(policy, snap)
    if as_json:
        body = {"policy": asdict(policy), "machine": asdict(snap), "lends_now": not reasons,
                "reasons": [str(r) for r in reasons]}  # fmt: skip
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
    for command in (policy_command,):
        group.add_command(command)


__all__ = ["register"]
