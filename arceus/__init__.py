"""Arceus from Python: the local daemon's client, for notebooks and scripts (the ``arceusd`` CLI's twin).

::

    import arceus

    client = arceus.connect()                        # the daemon of the default state directory
    job = client.submit("examples/llama-shakespeare.toml", members=1)
    for p in job.progress(poll_s=2, timeout_s=3600):
        print(p.step, p.total_steps, p.loss)
    model = job.load()                               # AutoModelForCausalLM of the export

``client.submit_model(model, tokenizer, "data.txt", training={"steps": 200})`` trains a stock transformers
model object (gpt2, llama, qwen2, mistral) from its weights; ``arceus.quote(spec)`` is ``submit --quote``.

Client-side only: importing ``arceus`` imports neither torch nor transformers (a model object's weights are
written with safetensors when one is given; ``Job.load`` imports transformers). The daemon receives a
declarative spec file's path, never code or pickles.
"""

from __future__ import annotations

import os

from arceus.client import Client, connect
from arceus.errors import (
    ArceusError,
    DaemonError,
    JobEndedError,
    JobTimeoutError,
    NoDaemonError,
    NotExportedError,
    SpecError,
    UnsupportedModelError,
)
from arceus.job import Job
from arceus.model_job import ModelChoices, ModelJob
from arceus.specs import SpecInput
from arceus.status import JobState, JobStatus, Progress
from arceusd.market.estimate import Estimate


def quote(
    spec: SpecInput,
    *,
    members: int = 1,
    state_dir: str | os.PathLike[str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Estimate:
    """The estimate for ``spec`` (a path or a dict) on ``members`` devices like this one, as ``arceusd submit
    SPEC --quote`` prints it (``Estimate.lines()``); nothing is announced and no daemon is needed."""
    return Client(state_dir).quote(spec, members=members, base_dir=base_dir)


def submit(
    spec: SpecInput,
    *,
    members: int = 1,
    state_dir: str | os.PathLike[str] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Job:
    """Submit ``spec`` to the daemon of ``state_dir`` (default: the CLI's); see :meth:`Client.submit`."""
    return Client(state_dir).submit(spec, members=members, base_dir=base_dir)


__all__ = [
    "ArceusError",
    "Client",
    "DaemonError",
    "Estimate",
    "Job",
    "JobEndedError",
    "JobState",
    "JobStatus",
    "JobTimeoutError",
    "ModelChoices",
    "ModelJob",
    "NoDaemonError",
    "NotExportedError",
    "Progress",
    "SpecError",
    "SpecInput",
    "UnsupportedModelError",
    "connect",
    "quote",
    "submit",
]
