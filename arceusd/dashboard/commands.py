"""The ``arceusd dashboard`` command: ask the local daemon for the dashboard's URL, print it, maybe open it.

A browser is opened at an interactive terminal with a display (never with ``--no-open``, never when stdout is
not a terminal, never under CI, unless ``--open`` asks for it), so tests and scripts only get the URL. The
browser is given a 0600 page in the state directory that leads on to the URL, never the URL itself: a
command line is public to every local user, and the URL holds the dashboard's token
(:mod:`arceusd.dashboard.opener`).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from arceusd.dashboard.opener import open_in_browser, write_opener


def _can_open() -> bool:
    if os.environ.get("CI") or not sys.stdout.isatty():
        return False
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@click.command("dashboard")
@click.option("--no-open", is_flag=True, help="Only print the URL; do not open a browser.")
@click.option("--open", "force_open", is_flag=True, help="Open a browser even without a terminal or display.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (url, host, port).")
@click.pass_obj
def dashboard_command(obj: Any, no_open: bool, force_open: bool, as_json: bool) -> None:
    """Print the URL of this daemon's web dashboard (the swarm, jobs, this device, the market) and open it."""
    result = obj.call("dashboard", timeout=30.0)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(result["url"])
    if not no_open and (force_open or _can_open()):
        try:
            page = write_opener(obj.paths.root, result["url"])
        except OSError as exc:
            raise click.ClickException(f"cannot write the page that opens the dashboard: {exc}") from None
        if not open_in_browser(page):
            click.echo(f"no browser could be started; open {page} or the URL above", err=True)


def register(group: click.Group) -> None:
    """Add ``dashboard`` to the ``arceusd`` group."""
    group.add_command(dashboard_command)


__all__ = ["dashboard_command", "register"]
