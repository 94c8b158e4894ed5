"""The ``arceusd`` command line's context object: the state directory it acts on and the call to its daemon.

Its own module so the command groups registered on the CLI (``arceusd.market.commands``,
``arceusd.dashboard.commands``) name it without importing ``arceusd.cli.commands``, which registers them (issue 32:
that was an import cycle); they name it under ``TYPE_CHECKING`` only, since importing this module runs
``arceusd/cli/__init__.py``, which imports the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from arceusd.base.control import ControlError, NoDaemon, call, daemon_answers
from arceusd.base.paths import StatePaths
from arceusd.device.profile import is_measured, measuring_note

EXIT_NO_DAEMON = 3


class Context:
    def __init__(self, state_dir: Path, explicit: bool = False) -> None:
        self.state_dir = state_dir
        self.paths = StatePaths(state_dir)
        self.explicit = explicit  # given as ``arceusd --state-dir DIR ...`` (before the command's name)

    def use_state_dir(self, state_dir: Path) -> None:
        """``--state-dir`` given after the subcommand (``arceusd status --state-dir DIR``); given before it too,
        the two must name the same folder (a silent winner would act on a daemon the user did not mean)."""
        chosen = state_dir.expanduser().absolute()
        if self.explicit and chosen != self.state_dir:
            raise click.UsageError(
                f"--state-dir is given twice with different folders ({self.state_dir} and {chosen}); give it once"
            )
        self.state_dir = chosen
        self.paths = StatePaths(self.state_dir)

    def note_measuring(self) -> None:
        """Before a call that waits while the daemon measures this device (the first ``market``, ``submit``,
        ``submit --quote``, ``join`` of the day): say so at once, on stderr
        (:func:`arceusd.device.profile.measuring_note`)."""
        measured = is_measured(self.state_dir)
        note = measuring_note(measured, not measured and daemon_answers(self.paths.control_socket))
        if note is not None:
            click.echo(note, err=True)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
        try:
            return call(self.paths.control_socket, method, params, timeout=timeout)
        except NoDaemon:
            click.echo(f"arceusd: no daemon is running for {self.state_dir} (start one with `arceusd start`)", err=True)
            sys.exit(EXIT_NO_DAEMON)
        except ControlError as exc:
            raise click.ClickException(str(exc)) from None


__all__ = ["EXIT_NO_DAEMON", "Context"]
