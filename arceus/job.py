"""A handle on one job of the local daemon: its status, its progress until it ends, its exported model.

Every method is one or more blocking control calls (:class:`arceus.connection.Connection`); every wait is
bounded by its ``timeout_s``. Loading the model imports ``transformers`` (and torch) only when asked to.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from arceus.connection import Connection
from arceus.errors import JobEndedError, JobTimeoutError, NotExportedError
from arceus.status import JobState, JobStatus, Progress

DEFAULT_TIMEOUT_S = 24 * 3600.0
"""How long :meth:`Job.progress` and :meth:`Job.wait` wait unless told: a day."""


class Job:
    """The job ``job_id`` (its full id, or a unique prefix) on the daemon behind ``connection``."""

    def __init__(self, connection: Connection, job_id: str) -> None:
        self.connection = connection
        self.job_id = job_id

    def status(self) -> JobStatus:
        """The job now: state, step of total, loss, validation loss, error... (``arceusd status JOB``)."""
        return JobStatus.from_summary(self.connection.call("job", {"job_id": self.job_id}))

    def progress(self, poll_s: float = 1.0, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[Progress]:
        """Snapshots of the run until it ends: one each time the state or the step changes (polled every
        ``poll_s`` seconds), the first at once and the last in an ended state.

        Error handling: :class:`JobTimeoutError` when the job has not ended within ``timeout_s`` (it goes on);
        :class:`arceus.errors.NoDaemonError` when the daemon stops meanwhile.
        """
        if poll_s <= 0 or timeout_s < 0:
            raise ValueError(f"poll_s must be > 0 and timeout_s >= 0, got {poll_s} and {timeout_s}")
        start = time.monotonic()
        last: tuple[JobState, int] | None = None
        while True:
            status = self.status()
            elapsed = time.monotonic() - start
            if last != (status.state, status.step):
                last = (status.state, status.step)
                yield Progress.of(status, elapsed)
            if status.ended:
                return
            if elapsed >= timeout_s:
                raise JobTimeoutError(
                    f"job {self.job_id[:12]} did not end within {timeout_s:g} s (it is "
                    f"{status.state} at step {status.step} of {status.total_steps}; it goes on)"
                )
            time.sleep(min(poll_s, max(0.0, timeout_s - elapsed)))

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S, poll_s: float = 1.0, check: bool = True) -> JobStatus:
        """Wait until the job ends and return its status.

        Error handling: :class:`JobEndedError` when it ended ``failed`` or ``cancelled`` (unless ``check`` is
        false), :class:`JobTimeoutError` after ``timeout_s``.
        """
        for _ in self.progress(poll_s=poll_s, timeout_s=timeout_s):
            pass
        status = self.status()
        if check and status.state != JobState.DONE:
            why = f": {status.error}" if status.error else ""
            raise JobEndedError(
                f"job {self.job_id[:12]} ended {status.state} at step {status.step} of {status.total_steps}{why}",
                status,
            )
        return status

    def export_path(self) -> Path:
        """The folder of the exported model (``config.json``, ``model.safetensors`` and the tokenizer files for a
        transformers model; ``model.safetensors`` + ``model.json`` for a built-in one).

        Error handling: :class:`NotExportedError` until the job is done.
        """
        status = self.status()
        if status.state != JobState.DONE or status.model_path is None:
            hint = "; job.wait() first" if not status.ended else ""
            raise NotExportedError(
                f"job {self.job_id[:12]} has no exported model: it is {status.state} at step "
                f"{status.step} of {status.total_steps}{hint}"
            )
        return status.model_path.parent

    def load(self) -> Any:
        """The exported model: ``AutoModelForCausalLM.from_pretrained`` of :meth:`export_path` when it is a
        transformers model and ``transformers`` is importable; otherwise the folder itself (a :class:`Path`)."""
        folder = self.export_path()
        if not (folder / "config.json").is_file() or importlib.util.find_spec("transformers") is None:
            return folder
        from transformers import AutoModelForCausalLM  # transformers: only for a stock model

        return AutoModelForCausalLM.from_pretrained(str(folder))

    def cancel(self) -> JobState:
        """Stop the job everywhere (its owner or leader only); the state it is in now."""
        return JobState(str(self.connection.call("cancel", {"job_id": self.job_id}, timeout=60.0)["state"]))

    def __repr__(self) -> str:
        return f"Job({self.job_id!r})"


__all__ = ["DEFAULT_TIMEOUT_S", "Job"]
