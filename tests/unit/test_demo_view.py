"""The demo's view: a progress bar with the step count, an ETA and the job's figures; and its default run
(two daemons, 1,000 steps: measured to end within 5 minutes on a 2-core machine at validation loss <= 1.9)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from arceusd.cli import demo
from arceusd.cli.commands import demo as demo_command


def test_progress_bar_shows_steps_eta_and_figures() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = demo._progress_bar(console)
    job = {"loss": 1.7234, "val_loss": 1.8312, "tokens_per_s": 16211.4}
    task = bar.add_task("training", total=1000, stats=demo._stats(job))
    bar.update(task, completed=250)
    text = "".join(seg.text for seg in console.render(bar.get_renderable()))  # one frame
    assert "250/1000" in text and "ETA" in text, text
    assert "loss 1.72" in text and "val 1.83" in text and "16211 tok/s" in text, text
    assert demo._stats({"loss": None, "val_loss": None, "tokens_per_s": None}) == "loss - val - - tok/s"


def test_default_demo_is_two_daemons_and_1000_steps(tmp_path: Path) -> None:
    defaults = {p.name: p.default for p in demo_command.params}
    assert defaults["size"] == 2 and defaults["steps"] == 1000
    spec = demo.demo_spec(tmp_path, 1000).read_text()
    assert re.search(r"(?m)^steps = 1000$", spec) and re.search(r"(?m)^lr = 2e-3$", spec)
    data = re.search(r'path = "([^"]+)"', spec)
    assert data is not None and Path(data.group(1)).is_file()  # the repository's data/, made absolute
