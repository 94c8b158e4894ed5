"""Where one job's files live on this device: every path under a job's folder is named here, once (issue 32: a
job's paths in one place). Pure and torch-free.

A job's folder is ``<state>/jobs/<job id>`` (:meth:`JobPaths.of`; the job id is 32 hex characters, checked
where it arrives, so it is a plain name). In it::

    spec.json                      the spec as signed (its canonical JSON)
    owner.json | member.json       this device's record of the job (restored / listed after a restart)
    checkpoints/step-NNNNNNNNNN/   committed checkpoints (:func:`arceusd.files.checkpoint.step_dir`)
    replicas/                      the other replicas' devices' checkpoint folders of this device's worker
    resume/epoch-NNNNNN/           the resume slices cut for a plan epoch (one file per stage and rank)
    data/                          the standby's checked copy of the data set
    weights/                       a member's slice of the initial weights; a standby's whole copy
    worker-<epoch>.json            the worker's configuration for a plan epoch
    worker.log                     the worker's log

Nothing from the network names a path here: file names come from the plan (stage, rank), the epoch and step
counters, or the constants below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPEC_FILE = "spec.json"
OWNER_FILE = "owner.json"
MEMBER_FILE = "member.json"
CHECKPOINTS_FOLDER = "checkpoints"
REPLICAS_FOLDER = "replicas"
RESUME_FOLDER = "resume"
DATA_FOLDER = "data"
WEIGHTS_FOLDER = "weights"
WEIGHTS_COPY_NAME = "model.safetensors"
WORKER_LOG = "worker.log"


@dataclass(frozen=True)
class JobPaths:
    """The paths of one job's files under its folder ``directory`` (see the module docstring)."""

    directory: Path

    @classmethod
    def of(cls, jobs_root: Path, job_id: str) -> JobPaths:
        """The folder of job ``job_id`` under this daemon's jobs folder."""
        return cls(jobs_root / job_id)

    @property
    def spec(self) -> Path:
        return self.directory / SPEC_FILE

    @property
    def owner_record(self) -> Path:
        return self.directory / OWNER_FILE

    @property
    def member_record(self) -> Path:
        return self.directory / MEMBER_FILE

    @property
    def checkpoints(self) -> Path:
        return self.directory / CHECKPOINTS_FOLDER

    @property
    def replicas(self) -> Path:
        return self.directory / REPLICAS_FOLDER

    def resume(self, epoch: int) -> Path:
        """The resume slices cut for plan epoch ``epoch``."""
        return self.directory / RESUME_FOLDER / f"epoch-{epoch:06d}"

    @property
    def data(self) -> Path:
        return self.directory / DATA_FOLDER

    @property
    def weights_copy(self) -> Path:
        """A standby's checked copy of the whole initial weights file."""
        return self.directory / WEIGHTS_FOLDER / WEIGHTS_COPY_NAME

    def weights_slice(self, start: int, end: int) -> Path:
        """A member's slice of the initial weights: the tensors of blocks ``start``..``end`` (its place)."""
        return self.directory / WEIGHTS_FOLDER / f"blocks-{start}-{end}.safetensors"

    def worker_config(self, epoch: int) -> Path:
        return self.directory / f"worker-{epoch}.json"

    @property
    def worker_log(self) -> Path:
        return self.directory / WORKER_LOG


__all__ = [
    "CHECKPOINTS_FOLDER",
    "DATA_FOLDER",
    "MEMBER_FILE",
    "OWNER_FILE",
    "REPLICAS_FOLDER",
    "RESUME_FOLDER",
    "SPEC_FILE",
    "WEIGHTS_COPY_NAME",
    "WEIGHTS_FOLDER",
    "WORKER_LOG",
    "JobPaths",
]
