"""Typed views of what the daemon says about a job: :class:`JobStatus` (``arceusd status JOB``) and
:class:`Progress` (one snapshot of a run, as ``Job.progress`` yields them).

States are the daemon's own :class:`arceusd.jobs.core.JobState` (a string enum: ``JobState.DONE == "done"``).
Both are built from the JSON the ``job`` and ``jobs`` control methods answer; a field the answer lacks (the
``jobs`` list carries fewer than ``job``) is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arceusd.jobs.core.states import TERMINAL, JobState


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object, default: int = 0) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default


@dataclass(frozen=True)
class JobStatus:
    """A job as this device's daemon knows it."""

    job_id: str
    name: str
    state: JobState
    step: int
    total_steps: int
    loss: float | None
    val_loss: float | None
    error: str
    """What went wrong last, or why the job waits ("" when nothing to say)."""
    role: str
    """This device's part: ``owner``, ``member`` or ``seen``."""
    owner: str
    leader: str
    members: tuple[str, ...]
    model_path: Path | None
    """The exported model file once the job is done (``.../export/model.safetensors`` for a transformers model)."""
    committed_step: int | None = None
    tokens_per_s: float | None = None
    lr: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The daemon's whole answer (the plan, contributions, recoveries, the loss history...)."""

    @classmethod
    def from_summary(cls, d: Mapping[str, Any]) -> JobStatus:
        """Read one job of the ``job`` or ``jobs`` control methods' answer."""
        members = d.get("members")
        path = d.get("model_path")
        committed = d.get("committed_step")
        return cls(
            job_id=str(d.get("job_id", "")),
            name=str(d.get("name", "")),
            state=JobState(str(d.get("state"))),
            step=_int(d.get("step")),
            total_steps=_int(d.get("total_steps")),
            loss=_float(d.get("loss")),
            val_loss=_float(d.get("val_loss")),
            error=str(d.get("error") or ""),
            role=str(d.get("role", "")),
            owner=str(d.get("owner", "")),
            leader=str(d.get("leader", "")),
            members=tuple(str(m) for m in members) if isinstance(members, list) else (),
            model_path=Path(path) if isinstance(path, str) and path else None,
            committed_step=_int(committed) if committed is not None else None,
            tokens_per_s=_float(d.get("tokens_per_s")),
            lr=_float(d.get("lr")),
            raw=dict(d),
        )

    @property
    def ended(self) -> bool:
        """Whether the job is over (``done``, ``failed`` or ``cancelled``)."""
        return self.state in TERMINAL

    @property
    def fraction(self) -> float:
        """Steps done of all, 0..1."""
        return _fraction(self.step, self.total_steps)


@dataclass(frozen=True)
class Progress:
    """One snapshot of a job's run: where it is and how fast it goes."""

    job_id: str
    state: JobState
    step: int
    total_steps: int
    loss: float | None
    val_loss: float | None
    tokens_per_s: float | None
    elapsed_s: float
    """Seconds since the progress loop began."""

    @classmethod
    def of(cls, status: JobStatus, elapsed_s: float) -> Progress:
        return cls(
            status.job_id,
            status.state,
            status.step,
            status.total_steps,
            status.loss,
            status.val_loss,
            status.tokens_per_s,
            elapsed_s,
        )

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    @property
    def fraction(self) -> float:
        return _fraction(self.step, self.total_steps)


def _fraction(step: int, total_steps: int) -> float:
    return min(1.0, step / total_steps) if total_steps > 0 else 0.0


__all__ = ["JobState", "JobStatus", "Progress"]
