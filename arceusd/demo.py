"""``arceusd demo``: the README's main job. Starts a local swarm of daemons and drives a job across them.

Until the job pipeline is wired in, the demo forms the swarm and shows every daemon's status; Ctrl-C (or the end
of the run) stops every child cleanly.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from arceusd.swarm import LocalSwarm


def run_demo(size: int, root: Path | None, keep_running: float) -> None:
    base = root or Path(tempfile.mkdtemp(prefix="arceus-demo-"))
    swarm = LocalSwarm(base, size)
    click.echo(f"starting a local swarm of {size} daemons in {base} ...")
    try:
        statuses = swarm.start()
        for i, status in enumerate(statuses):
            click.echo(f"  node{i}: peer {status['peer_id']}  addresses {status['addresses']}")
        deadline = time.monotonic() + keep_running
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        for i in range(size):
            peers = swarm.call(i, "status").get("peers")
            if isinstance(peers, list):
                alive = sum(1 for p in peers if p.get("state") == "alive")
                click.echo(f"  node{i} sees {alive} alive peers")
    except KeyboardInterrupt:
        click.echo("interrupted; stopping the swarm")
    finally:
        swarm.close()
        click.echo("swarm stopped")
