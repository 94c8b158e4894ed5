"""What goes wrong when Python talks to a daemon, as exceptions that say what to do (one line each, or one line
per problem of a job spec).

Every exception here is an :class:`ArceusError`; a few are also the builtin a caller may already catch
(``ValueError`` for bad input, ``TimeoutError`` for a bounded wait that ran out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arceusd.jobs.spec.fields import SpecProblem

if TYPE_CHECKING:  # a type only: status.py imports nothing from here
    from arceus.status import JobStatus


class ArceusError(Exception):
    """Anything the Python API refuses or the daemon answers with an error."""


class NoDaemonError(ArceusError):
    """No daemon runs for the state directory (start one with ``arceusd start``)."""


class DaemonError(ArceusError):
    """The daemon answered a call with an error; the message is the daemon's."""


class SpecError(ArceusError, ValueError):
    """A job spec is invalid; nothing was sent. ``problems`` holds each field's problem and its fix, the message
    one line per problem (the same text ``arceusd submit`` prints)."""

    def __init__(self, message: str, problems: tuple[SpecProblem, ...]) -> None:
        super().__init__(message)
        self.problems = problems

    @property
    def fields(self) -> list[str]:
        """The field paths with problems (``model.config.vocab_size``, ``training.steps``...), in report order."""
        return [p.path for p in self.problems]


class UnsupportedModelError(ArceusError, ValueError):
    """A model or tokenizer object Arceus cannot train from (another architecture, a slow tokenizer...)."""


class JobEndedError(ArceusError):
    """The job ended failed or cancelled (``status`` says how, and its ``error`` why)."""

    def __init__(self, message: str, status: JobStatus) -> None:
        super().__init__(message)
        self.status = status


class NotExportedError(ArceusError):
    """The job has no exported model (yet): it is still running, or it did not end ``done``."""


class JobTimeoutError(ArceusError, TimeoutError):
    """A bounded wait for a job ran out of time; the job goes on."""


__all__ = [
    "ArceusError",
    "DaemonError",
    "JobEndedError",
    "JobTimeoutError",
    "NoDaemonError",
    "NotExportedError",
    "SpecError",
    "UnsupportedModelError",
]
