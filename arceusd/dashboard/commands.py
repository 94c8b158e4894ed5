"""The ``arceusd dashboard`` command: ask the local daemon for the dashboard's URL, print it, maybe open it.

A browser is opened only when asked for implicitly at an interactive terminal with a display (never with
``--no-open``, never when stdout is not a terminal, never under CI), so tests and scripts only get the URL.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click


def _can_open() -> bool:
    if os.environ.get("CI") or not sys.stdout.isatty():
        return False
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@click.command("dashboard")
@click.option("--no-open", is_flag=True, help="Only print the URL; do not open a browser.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (url, host, port).")
@click.pass_obj
def dashboard_command(obj: Any, no_open: bool, as_json: bool) -> None:
    """Print the URL of this daemon's web dashboard (the swarm, jobs, this device, the market) and open it."""
    result = obj.call("dashboard", timeout=30.0)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(result["url"])
    if not no_open and _can_open():
        import webbrowser

        webbrowser.open(result["url"])


def register(group: click.Group) -> None:
    """Add ``dashboard`` to the ``arceusd`` group."""
    group.add_command(dashboard_command)


__all__ = ["dashboard_command", "register"]
