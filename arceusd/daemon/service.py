"""Installs, loads and removes the background service: a launchd agent on macOS, a systemd user unit on Linux.

The service runs exactly ``arceusd start --foreground`` (with the state directory and log file), so what a user
tests in a terminal is what runs in the background. Templates live in the top-level ``systemd/`` and ``launchd/``
folders (installed as data files under ``<prefix>/share/arceus``); this module fills them in.

Where no service manager is reachable (containers, CI, a Linux without a user systemd session) the caller gets a
:class:`NoServiceManager` whose message points to ``--foreground`` and ``--detach``.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL = "org.arceus.arceusd"
UNIT_NAME = "arceusd.service"


class ServiceError(Exception):
    """The service manager refused; the message includes what it said."""


class NoServiceManager(ServiceError):
    """No launchd/systemd user session here; use ``--foreground`` or ``--detach``."""


def template_dir(kind: str) -> Path:
    """The folder holding the ``systemd`` or ``launchd`` templates (source tree first, then installed data)."""
    candidates = [Path(__file__).resolve().parents[2] / kind, Path(sys.prefix) / "share" / "arceus" / kind]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise ServiceError(f"the {kind} template folder is missing (looked in {', '.join(map(str, candidates))})")


def daemon_command(state_dir: Path, log_file: Path, extra_args: list[str]) -> list[str]:
    """The exact command line the service runs."""
    return [
        sys.executable,
        "-m",
        "arceusd",
        "--state-dir",
        str(state_dir),
        "start",
        "--foreground",
        "--log-file",
        str(log_file),
        *extra_args,
    ]


def render_systemd_unit(command: list[str]) -> str:
    template = (template_dir("systemd") / UNIT_NAME).read_text()
    # systemd's ExecStart quoting is close to the shell's for plain paths; % must be doubled.
    exec_start = " ".join(shlex.quote(part) for part in command).replace("%", "%%")
    return template.replace("@EXEC_START@", exec_start)


def render_launchd_plist(command: list[str], state_dir: Path, log_file: Path) -> bytes:
    with (template_dir("launchd") / f"{LABEL}.plist").open("rb") as fh:
        plist: dict[str, Any] = plistlib.load(fh)
    plist["ProgramArguments"] = command
    plist["WorkingDirectory"] = str(state_dir)
    plist["StandardOutPath"] = str(log_file)
    plist["StandardErrorPath"] = str(log_file)
    return plistlib.dumps(plist)


@dataclass(frozen=True)
class ServiceManager:
    kind: str  # "systemd" or "launchd"
    unit_path: Path


def detect() -> ServiceManager:
    """The service manager of this machine, or :class:`NoServiceManager` saying why there is none."""
    if sys.platform == "darwin":
        if shutil.which("launchctl") is None:
            raise NoServiceManager("launchctl was not found")
        return ServiceManager("launchd", Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist")
    if shutil.which("systemctl") is None:
        raise NoServiceManager("systemctl was not found (no systemd)")
    probe = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, text=True, timeout=10)
    if probe.returncode != 0:
        reason = (probe.stderr or probe.stdout).strip().splitlines()[:1]
        raise NoServiceManager(f"no systemd user session is reachable ({' '.join(reason) or 'unknown reason'})")
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return ServiceManager("systemd", config_home / "systemd" / "user" / UNIT_NAME)


def _run(args: list[str]) -> None:
    result = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise ServiceError(f"`{' '.join(args)}` failed: {(result.stderr or result.stdout).strip()}")


def install(state_dir: Path, log_file: Path, extra_args: list[str]) -> ServiceManager:
    """Write the unit/plist and start it now and at every login."""
    manager = detect()
    command = daemon_command(state_dir, log_file, extra_args)
    manager.unit_path.parent.mkdir(parents=True, exist_ok=True)
    if manager.kind == "systemd":
        _atomic_write(manager.unit_path, render_systemd_unit(command).encode())
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "enable", "--now", UNIT_NAME])
    else:
        _atomic_write(manager.unit_path, render_launchd_plist(command, state_dir, log_file))
        domain = f"gui/{os.getuid()}"
        subprocess.run(["launchctl", "bootout", f"{domain}/{LABEL}"], capture_output=True, timeout=30)
        _run(["launchctl", "bootstrap", domain, str(manager.unit_path)])
    return manager


def uninstall() -> ServiceManager | None:
    """Stop and remove the service if it is installed; None when there was none."""
    try:
        manager = detect()
    except NoServiceManager:
        return None
    if not manager.unit_path.exists():
        return None
    if manager.kind == "systemd":
        _run(["systemctl", "--user", "disable", "--now", UNIT_NAME])
        manager.unit_path.unlink()
        _run(["systemctl", "--user", "daemon-reload"])
    else:
        subprocess.run(["launchctl", "bootout", f"gui/{os.getuid()}/{LABEL}"], capture_output=True, timeout=30)
        manager.unit_path.unlink()
    return manager


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
