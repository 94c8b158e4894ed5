"""The Python client of the local daemon: submit jobs (a spec file, a dict, or a transformers model object) and
get :class:`arceus.job.Job` handles, over the control channel the ``arceusd`` command line uses.

Everything is checked here before anything is sent: the spec by :mod:`arceusd.jobs.spec.schema` (the CLI's and the
daemon's own checks), ``members`` as ``arceusd submit --members`` takes it (at least ``[needs] min_members``).
A dict spec or a model's files are written to a job folder the caller names, or to a new folder under the state
directory's ``submissions/``; the daemon reads the spec file from there, the same user on the same machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, Unpack, overload

from arceus.connection import Connection
from arceus.hf_files import model_type_of
from arceus.job import Job
from arceus.model_job import ModelChoices, ModelJob, default_name, prepare_model_job
from arceus.specs import SpecInput, spec_file, validate
from arceus.status import JobStatus
from arceusd.jobs.spec.schema import JobSpec
from arceusd.market.estimate import Estimate, estimate

MAX_MEMBERS = 256
SUBMISSIONS = "submissions"
"""The state directory's folder for job folders the caller did not name."""

PathArg = str | os.PathLike[str]


class Client:
    """The daemon of ``state_dir`` (None: the CLI's default, ``$ARCEUS_STATE_DIR`` or the platform's folder)."""

    def __init__(self, state_dir: PathArg | None = None) -> None:
        self.connection = Connection(state_dir)

    @property
    def state_dir(self) -> Path:
        return self.connection.state_dir

    def daemon_status(self) -> dict[str, Any]:
        """The daemon's ``arceusd status --json``: peer id, version, uptime, addresses, peers, jobs."""
        result: dict[str, Any] = self.connection.call("status")
        return result

    def quote(self, spec: SpecInput, *, members: int = 1, base_dir: PathArg | None = None) -> Estimate:
        """The estimate ``arceusd submit SPEC --quote`` prints (time, cost, the cloud's cost); announces nothing
        and needs no daemon (without one, the market's demand is taken as neutral)."""
        parsed = validate(spec, base_dir)
        return estimate(self.state_dir, parsed, _members(members, parsed))

    @overload
    def submit(
        self,
        spec: SpecInput,
        *,
        members: int = 1,
        quote: Literal[False] = False,
        base_dir: PathArg | None = None,
        folder: PathArg | None = None,
    ) -> Job: ...
    @overload
    def submit(
        self,
        spec: SpecInput,
        *,
        members: int = 1,
        quote: Literal[True],
        base_dir: PathArg | None = None,
        folder: PathArg | None = None,
    ) -> Estimate: ...
    def submit(
        self,
        spec: SpecInput,
        *,
        members: int = 1,
        quote: bool = False,
        base_dir: PathArg | None = None,
        folder: PathArg | None = None,
    ) -> Job | Estimate:
        """Submit ``spec`` (a spec file's path, or a dict in the spec's schema whose relative paths resolve from
        ``base_dir``, default the working folder): this device owns the job and announces it; it starts once
        ``members`` devices (this one included) joined. ``quote=True``: only the estimate, nothing announced.
        A dict is written as ``job.json`` into ``folder`` (default: a new folder under the state directory).

        Error handling: :class:`arceus.errors.SpecError` (one line per bad field, nothing sent),
        :class:`arceus.errors.NoDaemonError`, :class:`arceus.errors.DaemonError`.
        """
        asked_at = time.time()  # the job's start as its quote times it: from the call, as the CLI's submit
        parsed = validate(spec, base_dir)
        n = _members(members, parsed)
        if quote:
            return estimate(self.state_dir, parsed, n)
        self.daemon_status()  # no daemon: say so before writing anything
        if not isinstance(spec, Mapping):  # the daemon reads the file itself
            return self._send(Path(spec).expanduser(), n, asked_at)
        with self._job_folder(folder, parsed.name, keep=True) as where:
            return self._send(spec_file(spec, where, base_dir), n, asked_at)

    @overload
    def submit_model(
        self,
        model: Any,
        tokenizer: Any,
        data: PathArg,
        *,
        members: int = 1,
        quote: Literal[False] = False,
        folder: PathArg | None = None,
        **choices: Unpack[ModelChoices],
    ) -> Job: ...
    @overload
    def submit_model(
        self,
        model: Any,
        tokenizer: Any,
        data: PathArg,
        *,
        members: int = 1,
        quote: Literal[True],
        folder: PathArg | None = None,
        **choices: Unpack[ModelChoices],
    ) -> Estimate: ...
    def submit_model(
        self,
        model: Any,
        tokenizer: Any,
        data: PathArg,
        *,
        members: int = 1,
        quote: bool = False,
        folder: PathArg | None = None,
        **choices: Unpack[ModelChoices],
    ) -> Job | Estimate:
        """Train a stock transformers causal LM (``model_type`` gpt2, llama, qwen2 or mistral) from its current
        weights on ``data`` (a UTF-8 text file, or JSONL), tokenized with ``tokenizer`` (a
        ``tokenizers.Tokenizer`` or a transformers fast tokenizer). ``choices`` are the fields of
        :class:`arceus.model_job.ModelJob` (``name``, ``block_size``, ``training={"steps": ..., "lr": ...}``,
        ``checkpoint``, ``needs``, ``lora``, ``seed``, ``data_format``, ``text_field``, ``val_fraction``).

        The model's config.json, its weights (model.safetensors) and the tokenizer.json are written to
        ``folder`` (default: a new folder under the state directory) with the spec, ``job.json``; nothing is
        pickled and no code is sent. Keep the folder until the job ends: the daemons read the initial weights
        there (a default folder is left for you to remove).

        Error handling: :class:`arceus.errors.UnsupportedModelError` (another architecture, a slow tokenizer),
        :class:`arceus.errors.SpecError`, :class:`arceus.errors.NoDaemonError`, :class:`arceus.errors.DaemonError`.
        """
        asked_at = time.time()
        job = ModelJob(data=Path(data), **choices)
        if not quote:
            self.daemon_status()  # no daemon: say so before writing the weights
        prefix = job.name or default_name(model_type_of(model), job.data)  # another architecture: refused here
        with self._job_folder(folder, prefix, keep=not quote) as where:
            prepared = prepare_model_job(model, tokenizer, job, where, weights=not quote)
            n = _members(members, prepared.spec)
            if quote:
                return estimate(self.state_dir, prepared.spec, n)
            return self._send(prepared.spec_path, n, asked_at)

    def job(self, job_id: str) -> Job:
        """The job ``job_id`` (or a unique prefix of it) this daemon knows."""
        return Job(self.connection, JobStatus.from_summary(self.connection.call("job", {"job_id": job_id})).job_id)

    def jobs(self) -> list[JobStatus]:
        """Every job this daemon knows (owned, joined or announced), oldest first."""
        return [JobStatus.from_summary(j) for j in self.connection.call("jobs")]

    def _send(self, spec_path: Path, members: int, asked_at: float) -> Job:
        """Submit the spec file; ``asked_at``: when the caller asked (the job's start as the quote times it, as
        the CLI's submit sends it: the daemon takes it when at most a minute earlier than its own clock)."""
        result = self.connection.call(
            "submit",
            {"spec_path": str(spec_path.absolute()), "min_members": members, "asked_at": asked_at},
            timeout=120.0,
        )
        return Job(self.connection, str(result["job_id"]))

    @contextlib.contextmanager
    def _job_folder(self, folder: PathArg | None, name: str, keep: bool) -> Iterator[Path]:
        """``folder``, or a new one under ``<state dir>/submissions`` that is removed again when what was
        written there fails (or, ``keep=False``, in any case)."""
        if folder is not None:
            where = Path(folder).expanduser().absolute()
            where.mkdir(parents=True, exist_ok=True)
            yield where
            return
        root = self.state_dir / SUBMISSIONS
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        made = Path(tempfile.mkdtemp(prefix=f"{name[:40]}-", dir=root))
        try:
            yield made
        except BaseException:
            shutil.rmtree(made, ignore_errors=True)
            raise
        if not keep:
            shutil.rmtree(made, ignore_errors=True)


def _members(members: int, spec: JobSpec) -> int:
    """``members`` as ``arceusd submit --members`` takes it: 1..256, at least the spec's ``needs.min_members``."""
    if isinstance(members, bool) or not isinstance(members, int) or not 1 <= members <= MAX_MEMBERS:
        raise ValueError(f"members must be an integer 1..{MAX_MEMBERS}, got {members!r}")
    return max(members, spec.needs.min_members)


def connect(state_dir: PathArg | None = None) -> Client:
    """A client of the daemon of ``state_dir`` (default: the CLI's), checked to be running.

    Error handling: :class:`arceus.errors.NoDaemonError` when none runs there.
    """
    client = Client(state_dir)
    client.daemon_status()
    return client


__all__ = ["Client", "connect"]
