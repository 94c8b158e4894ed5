"""Where a daemon keeps its state: the per-platform default state directory and the files inside it.

Linux: ``$XDG_STATE_HOME/arceus`` or ``~/.local/state/arceus``; macOS: ``~/Library/Application Support/Arceus``.
``--state-dir`` (or ``ARCEUS_STATE_DIR``) overrides. Every file the daemon writes lives under one state directory,
which is what lets several daemons run side by side on one machine.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


def default_state_dir() -> Path:
    env = os.environ.get("ARCEUS_STATE_DIR")
    if env:
        return Path(env).expanduser()
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "Arceus"
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else home / ".local" / "state"
    return base / "arceus"


@dataclass(frozen=True)
class StatePaths:
    """The files of one daemon's state directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def control_socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "arceusd.pid"

    @property
    def log_file(self) -> Path:
        return self.root / "arceusd.log"

    @property
    def terms(self) -> Path:
        return self.root / "terms.json"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def profile_cache(self) -> Path:
        return self.root / "profile.json"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
