"""The systemd unit and the launchd plist the service module installs."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

from arceusd.daemon import service


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    command = service.daemon_command(tmp_path / "state", tmp_path / "state" / "arceusd.log", ["--peer", "h:1"])
    unit = tmp_path / service.UNIT_NAME
    unit.write_text(service.render_systemd_unit(command))
    text = unit.read_text()
    assert "@" not in text.split("[Unit]", 1)[1]  # every placeholder filled
    assert "--foreground" in text and "--peer h:1" in text
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == 0


def test_launchd_plist_parses_and_has_the_keys_launchd_needs(tmp_path: Path) -> None:
    state, log = tmp_path / "state", tmp_path / "state" / "arceusd.log"
    command = service.daemon_command(state, log, [])
    plist = plistlib.loads(service.render_launchd_plist(command, state, log))
    assert plist["Label"] == service.LABEL
    assert plist["ProgramArguments"] == command
    assert plist["ProgramArguments"][-3:] == ["--foreground", "--log-file", str(log)]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == str(log)
    assert plist["WorkingDirectory"] == str(state)
    with (service.template_dir("launchd") / f"{service.LABEL}.plist").open("rb") as fh:
        assert plistlib.load(fh)["Label"] == service.LABEL  # the template itself is a valid plist
