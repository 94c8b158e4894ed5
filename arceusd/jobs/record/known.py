"""Jobs a restarted daemon knows only from its own files: what ``arceusd jobs`` lists for them (issue 31).

A daemon holds a job in memory while it takes part; after a restart it restores only the jobs it owns that had
not ended (:func:`owned_to_resume`, from the owner's record), so a member forgot every job it earned
from, and an owner its finished jobs, although the ledger holds their receipts. So a member keeps a small record
of each job it joins (:data:`MEMBER_FILE` in the job's directory: name, owner, state, steps, members; rewritten
as the job's state changes here, :func:`member_record`), the owner's ``owner.json`` carries the same, and a
restarted daemon lists, beside the jobs it holds, one row per job those records or its ledger name
(:func:`known_jobs`): the state it last knew (a job that had not ended shows ``left``, with why: this device is
not in it any more) and what this device earned there. Nothing of it comes from the network; a job announced
again (or joined again) is held again and replaces its row. Records are read bounded and checked
(:func:`parse_record`): a record that does not parse is skipped, never half-listed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arceusd.files.checkpoint import committed_steps
from arceusd.jobs.core.states import TERMINAL, JobState, Role
from arceusd.jobs.plans.job_paths import JobPaths
from arceusd.jobs.record.job import Job
from arceusd.jobs.record.throughput import Speed
from arceusd.jobs.spec.schema import JobSpecError, parse_spec, spec_hash
from protocol.job_wire import JOB_MEMBERS_MAX
from protocol.validation import is_hex_id

if TYPE_CHECKING:
    from arceusd.market.ledger import JobReceipts

log = logging.getLogger(__name__)

"""A member's record of a job it joined, in the job's directory (``<state>/jobs/<job id>/``)."""
RECORD_MAX_BYTES = 64 * 1024
"""The most of a record file that is read (a longer one is not a record)."""
NAME_MAX = 200
"""Characters of a job's name kept in a record (a spec's name is shorter)."""
UNKNOWN_NAME = "-"


@dataclass(frozen=True)
class KnownJob:
    """A job this daemon no longer holds but its files name: the row ``arceusd jobs`` shows for it."""

    job_id: str
    owner: str
    role: Role
    state: JobState
    name: str = UNKNOWN_NAME
    step: int = 0
    total_steps: int = 0
    members: tuple[str, ...] = ()
    created: float = 0.0
    model_path: str = ""
    earned_usd: float = 0.0
    receipts: int = 0
    note: str = ""

    def summary(self) -> dict[str, Any]:
        """The row, with the keys of :meth:`arceusd.jobs.record.job.Job.summary` (nothing measured: no loss, no speed),
        what this device earned (``earned_usd``, ``receipts``) and ``restored``: it comes from this device's files."""
        return {
            "job_id": self.job_id,
            "name": self.name,
            "owner": self.owner,
            "role": self.role.value,
            "state": self.state.value,
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": None,
            "val_loss": None,
            "val_accuracy": None,
            "members": list(self.members),
            "error": self.note,
            "model_path": self.model_path,
            "spec_hash": "",
            "leader": "",
            **asdict(Speed()),
            "earned_usd": self.earned_usd,
            "receipts": self.receipts,
            "restored": True,
        }


def member_record(job: Job) -> dict[str, Any]:
    """What a member keeps of ``job`` (:data:`MEMBER_FILE`); the owner's ``owner.json`` carries these keys too."""
    return {
        "job_id": job.job_id,
        "owner": job.owner,
        "name": job.spec.name[:NAME_MAX],
        "state": job.state.value,
        "step": job.step,
        "total_steps": job.total_steps,
        "members": job.member_ids()[:JOB_MEMBERS_MAX],
        "created": round(job.created, 3),
        "model_path": job.model_path,
    }


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 2**63 else None


def parse_record(data: object, job_id: str, role: Role) -> KnownJob | None:
    """The job a record names (``owner.json`` with ``role`` owner, :data:`MEMBER_FILE` with member), or None when
    it is not one: not an object, another job's, or a field of the wrong type or out of bounds. Name, steps and
    members are optional (an ``owner.json`` written before they were kept has none)."""
    if not isinstance(data, dict) or data.get("job_id") != job_id or not is_hex_id(job_id):
        return None
    owner, state, name = data.get("owner"), data.get("state"), data.get("name", UNKNOWN_NAME)
    step, total = _count(data.get("step", 0)), _count(data.get("total_steps", 0))
    members, created, model_path = data.get("members", []), data.get("created", 0.0), data.get("model_path", "")
    if not isinstance(owner, str) or not is_hex_id(owner) or not isinstance(state, str) or state not in set(JobState):
        return None
    if not isinstance(name, str) or len(name) > NAME_MAX or step is None or total is None:
        return None
    if not isinstance(members, list) or len(members) > JOB_MEMBERS_MAX:
        return None
    if not all(isinstance(m, str) and is_hex_id(m) for m in members):
        return None
    if not isinstance(created, int | float) or isinstance(created, bool) or not math.isfinite(created):
        return None
    if not isinstance(model_path, str) or len(model_path) > 4096:
        return None
    return KnownJob(
        job_id,
        owner,
        role,
        JobState(state),
        name or UNKNOWN_NAME,
        step,
        total,
        tuple(sorted(set(members))),
        float(created),
        model_path,
    )


def known_jobs(
    records: Mapping[str, KnownJob], ledger: Mapping[str, JobReceipts], me: str, held: Collection[str]
) -> list[KnownJob]:
    """The rows of the jobs the records and the ledger (job id -> what it holds of the job) name that this daemon
    does not hold (``held``), oldest first. A job that had not ended when its record was last written shows
    ``left`` (this device is not in it since its restart), with the state it last knew; one the ledger alone
    names shows ``left`` too, with the last step its receipts reach."""
    out = []
    for job_id in sorted((set(records) | set(ledger)) - set(held)):
        record, paid = records.get(job_id), ledger.get(job_id)
        if record is None:
            if paid is None:
                continue
            record = KnownJob(
                job_id,
                paid.owner,
                Role.OWNER if paid.owner == me else Role.MEMBER,
                JobState.LEFT,
                note="known from this device's ledger only",
            )
        elif record.state not in TERMINAL:
            record = KnownJob(
                **{
                    **asdict(record),
                    "state": JobState.LEFT,
                    "note": f"this daemon restarted while the job was {record.state.value} here; it "
                    "is in the job again only if it joins again",
                }
            )
        if paid is not None:
            step = max(record.step, paid.last_step)
            step = min(step, record.total_steps) if record.total_steps else step
            record = KnownJob(
                **{**asdict(record), "step": step, "earned_usd": paid.earned_usd, "receipts": paid.receipts}
            )
        out.append(record)
    return sorted(out, key=lambda k: (k.created, k.job_id))


def read_records(root: Path) -> dict[str, KnownJob]:
    """Every record under the jobs directory ``root`` (blocking: a thread): members' :data:`MEMBER_FILE` and the
    owner's :data:`OWNER_FILE`; one that does not read or parse is skipped with a warning."""
    out: dict[str, KnownJob] = {}
    if not root.is_dir():
        return out
    for directory in sorted(root.iterdir()):
        paths = JobPaths(directory)
        for path, role in ((paths.owner_record, Role.OWNER), (paths.member_record, Role.MEMBER)):
            if not path.is_file():
                continue
            try:
                with path.open("rb") as f:
                    raw = f.read(RECORD_MAX_BYTES + 1)
                record = parse_record(json.loads(raw), directory.name, role) if len(raw) <= RECORD_MAX_BYTES else None
            except (OSError, ValueError) as exc:
                log.warning("not listing the job in %s: %s", directory, exc)
                continue
            if record is None:
                log.warning("not listing the job in %s: %s is not a job record", directory, path.name)
                continue
            out.setdefault(record.job_id, record)  # the owner's record first (it handed over: still its owner)
    return out


def owned_to_resume(root: Path, me: str, address: str, grace_s: float) -> list[Job]:
    """The jobs under the jobs directory ``root`` that this device (``me``, listening at ``address``) owns and that
    had not ended when it stopped (crash, reboot), from the owner's records (blocking: a thread): they resume from
    their newest committed checkpoint once members rejoin, waiting for them ``grace_s`` seconds. A job whose saved
    state does not verify is skipped with a warning, never half-restored."""
    restored: list[Job] = []
    if not root.is_dir():
        return restored
    for directory in sorted(root.iterdir()):
        paths = JobPaths(directory)
        if not paths.owner_record.is_file():
            continue
        try:
            saved = json.loads(paths.owner_record.read_bytes())
            spec_bytes = paths.spec.read_bytes()
            spec = parse_spec(json.loads(spec_bytes), base_dir=Path(saved["base_dir"]), source=str(paths.spec))
            if saved["job_id"] != directory.name or spec_hash(spec) != saved["spec_hash"]:
                raise ValueError("the saved spec does not match the job's id or hash")
            if saved["owner"] != me:
                raise ValueError("owned by another identity")
            if saved["state"] in TERMINAL:
                continue
            committed = committed_steps(paths.checkpoints)
            restored.append(
                Job.restored(
                    saved,
                    spec,
                    spec_bytes,
                    address,
                    paths,
                    committed_step=committed[-1] if committed else 0,
                    gather_until=time.monotonic() + grace_s,
                )
            )
        except (OSError, ValueError, KeyError, TypeError, JobSpecError) as exc:
            log.warning("not resuming the job in %s: %s", directory, exc)
    return restored


__all__ = ["KnownJob", "known_jobs", "member_record", "owned_to_resume", "parse_record", "read_records"]
