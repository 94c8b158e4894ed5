"""A newcomer's machine: this checkout ``git clone``d into an empty temporary folder (nothing beside it, so no
shared data folder and no sibling checkout), and the demo run there with a short ``--steps``, as a person at a
terminal runs it (a pseudo-terminal). It must train, save the model and print a sample, and show rich's progress
bar with the steps done and an ETA. The current interpreter runs it with PYTHONPATH at the clone (the clone's own
code, not this checkout's), and an audit hook (``sys.addaudithook``, installed in every process of the run through a
``sitecustomize`` module: the demo, its daemons, their workers) records every file opened inside this checkout or
in a folder beside it; there must be none. (The terminal and the bare clone were two tests, two demos: 52 s and
34 s of the suite; one demo holds both tests' checks.)"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


AUDIT_HOOK = """
import os, sys

_OUTSIDE = tuple(p for p in os.environ.get("ARCEUS_AUDIT_OUTSIDE", "").split(os.pathsep) if p)
_OPENED = os.environ.get("ARCEUS_AUDIT_OPENED", "")
_ALLOWED = tuple(p for p in os.environ.get("ARCEUS_AUDIT_ALLOWED", "").split(os.pathsep) if p)


def _hook(event, args):
    if event != "open" or not args or isinstance(args[0], int) or not _OPENED:
        return
    try:
        path = os.path.abspath(os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    if path.startswith(_OUTSIDE) and not path.startswith(_ALLOWED):
        with open(_OPENED, "a") as fh:
            fh.write(f"{os.getpid()} {path}\\n")


if _OPENED:
    with open(os.environ["ARCEUS_AUDIT_STARTED"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    sys.addaudithook(_hook)
"""


def run_in_terminal(command: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT) -> tuple[int, str]:
    """Run ``command`` with a pseudo-terminal as its stdout and stderr (what a person at a terminal sees)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait(timeout=30)
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", errors="replace")


def test_demo_runs_in_a_bare_clone_at_a_terminal(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "arceus"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=120)
    assert [p.name for p in empty.iterdir()] == ["arceus"]  # nothing beside the clone
    assert (clone / "data" / "tinyshakespeare" / "input.txt").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("ARCEUS_STATE_DIR", "ARCEUSD_SWARM_PROFILE")}
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "sitecustomize.py").write_text(AUDIT_HOOK)
    opened, started = tmp_path / "outside.txt", tmp_path / "processes.txt"
    env["PYTHONPATH"] = os.pathsep.join([str(clone), str(audit)])
    env["ARCEUS_AUDIT_OUTSIDE"] = os.pathsep.join([str(ROOT) + os.sep, str(ROOT.parent) + os.sep])
    env["ARCEUS_AUDIT_OPENED"], env["ARCEUS_AUDIT_STARTED"] = str(opened), str(started)
    # the interpreter and its packages may live beside the checkout (/work/venv) or inside it (.venv in CI)
    prefixes = {sys.prefix, sys.base_prefix, os.path.realpath(sys.prefix), str(tmp_path)}
    env["ARCEUS_AUDIT_ALLOWED"] = os.pathsep.join(p.rstrip(os.sep) + os.sep for p in prefixes)
    env.update(COLUMNS="120", TERM="xterm")
    code, out = run_in_terminal(
        [sys.executable, "-m", "arceusd", "demo", "--steps", "20", "--dir", str(tmp_path / "swarm")], env, 360, clone
    )
    assert code == 0, out[-4000:]
    assert "model saved to" in out and "a sample from the trained model" in out, out[-4000:]
    assert "Traceback" not in out and "NumPy" not in out, out[-4000:]
    assert "ETA" in out and re.search(r"\b\d+/20\b", out), out[-4000:]  # rich's bar: steps done of 20, the ETA
    assert "20/20" in out and "tok/s" in out, out[-4000:]
    processes = started.read_text().split()
    assert len(processes) >= 4, processes  # the demo, its daemons and their workers all ran the hook
    assert not opened.exists(), opened.read_text()[:4000]  # nothing outside the clone was read
    assert (
        str(clone)
        in subprocess.run(
            [sys.executable, "-c", "import arceusd; print(arceusd.__file__)"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    )
