"""The daemon <-> stage-worker pipe protocol: the worker's config file, its stdout events, its stdin commands.

Owns: the JSON shapes exchanged between a daemon and the ``python -m arceusd.worker --config <path>`` child it
supervises, as frozen dataclasses with strict parsers (``WorkerProtocolError`` names the field and what was
wrong). One JSON object per line on both pipes.

- :class:`WorkerConfig`: the config file (``from_json`` / ``to_json``), incl. the plan's stages (a stage with
  one member has no tensor parallelism; with several, ``heads``/``columns`` give each rank's split).
- Events, worker -> daemon (stdout): :class:`Listening`, :class:`StepEvent`, :class:`EvalEvent`,
  :class:`CheckpointEvent`, :class:`WitnessEvent`, :class:`DoneEvent`, :class:`ErrorEvent`; ``event.to_line()`` and
  :func:`parse_event`.
- Commands, daemon -> worker (stdin): :class:`StartCommand` (every worker's transport address, sent once all
  said ``listening``) and :class:`StopCommand` (exit 0 at once); ``to_line()`` and :func:`parse_command`.

Who emits what: every worker emits ``step`` (the loss is all-reduced, so all agree), ``eval`` (the eval loss
and accuracy are all-reduced too; ``val_accuracy`` is null for text jobs), ``checkpoint`` for its own shard
(``cursor`` is the sampler cursor on the job owner's worker, null elsewhere; ``param_bytes`` /
``optimizer_bytes`` are measured from this worker's own tensors; only the first data-parallel replica writes
shards), ``witness`` at each checkpoint step when the plan has replicas (every replica) and ``done``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from arceusd.worker.affinity import AffinityError, check_cpus
from arceusd.worker.tp_split import TPSplit

SCHEDULES = ("gpipe", "1f1b")
REPLICA_MODES = ("allreduce", "diloco")
"""``ReplicaSyncConfig.mode``: gradients averaged every step, or DiLoCo's outer step every ``diloco_h`` steps."""
REPLICA_CODECS = ("raw", "fp16", "bf16", "int8")
"""Codecs of DiLoCo's pseudo-gradients (``arceusd.worker.replicas.ReplicaCodec``)."""
MAX_REPLICAS = 1024


class WorkerProtocolError(ValueError):
    """A config, event or command line does not have the agreed shape; the message names the field."""


# ---------------------------------------------------------------------------------------------- helpers


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise WorkerProtocolError(f"{where}: missing field {key!r}")
    value = d[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _tuple(kind))
    if not ok:
        names = "/".join(k.__name__ for k in _tuple(kind))
        raise WorkerProtocolError(f"{where}.{key}: expected {names}, got {type(value).__name__} {value!r}")
    return value


def _tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _int(d: Mapping[str, Any], key: str, where: str, minimum: int = 0) -> int:
    value = int(_get(d, key, int, where))
    if value < minimum:
        raise WorkerProtocolError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def _float(d: Mapping[str, Any], key: str, where: str) -> float:
    return float(_get(d, key, (int, float), where))


def _load_object(text: str, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkerProtocolError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise WorkerProtocolError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _line(d: Mapping[str, Any]) -> str:
    return json.dumps(d, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class MemberConfig:
    """One device of a stage; ``heads``/``columns`` are its tensor-parallel share (0 without TP)."""

    peer_id: str
    heads: int = 0
    columns: int = 0


@dataclass(frozen=True)
class StageConfig:
    """Blocks ``[start, end)`` held by ``members`` (rank = position in the list)."""

    start: int
    end: int
    members: tuple[MemberConfig, ...]
    micro_batch_s: float | None = None
    """The plan's predicted seconds per micro-batch (forward and backward) on this stage, when known: the
    workers replay the schedule with them to decide whether deferring weights' gradients pays."""

    def split(self) -> TPSplit | None:
        """The tensor-parallel split, or ``None`` for a one-member stage."""
        if len(self.members) == 1:
            return None
        return TPSplit(tuple(m.heads for m in self.members), tuple(m.columns for m in self.members))


@dataclass(frozen=True)
class ReplicaSyncConfig:
    """How the same stage of the job's replicas keeps in sync (``arceusd.worker.replicas``)."""

    mode: str = "allreduce"
    bucket_bytes: int = 4 << 20
    diloco_h: int = 50
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    codec: str = "int8"
    """DiLoCo's pseudo-gradient codec."""
    grad_codec: str = "raw"
    """All-reduce mode: the gradient buckets' codec (raw: exact)."""

    def __post_init__(self) -> None:
        if self.mode not in REPLICA_MODES:
            raise WorkerProtocolError(f"replica_sync.mode: expected one of {REPLICA_MODES}, got {self.mode!r}")
        for name, value in (("codec", self.codec), ("grad_codec", self.grad_codec)):
            if value not in REPLICA_CODECS:
                raise WorkerProtocolError(f"replica_sync.{name}: expected one of {REPLICA_CODECS}, got {value!r}")
        if not 4 <= self.bucket_bytes <= 1 << 30:
            raise WorkerProtocolError(f"replica_sync.bucket_bytes: must be in 4..2**30, got {self.bucket_bytes}")
        if not 1 <= self.diloco_h <= 1_000_000:
            raise WorkerProtocolError(f"replica_sync.diloco_h: must be in 1..1000000, got {self.diloco_h}")
        if not (math.isfinite(self.outer_lr) and 0 < self.outer_lr <= 10):
            raise WorkerProtocolError(f"replica_sync.outer_lr: must be in (0, 10], got {self.outer_lr}")
        if not (math.isfinite(self.outer_momentum) and 0 <= self.outer_momentum < 1):
            raise WorkerProtocolError(f"replica_sync.outer_momentum: must be in [0, 1), got {self.outer_momentum}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> ReplicaSyncConfig:
        return cls(
            mode=_get(d, "mode", str, where),
            bucket_bytes=_int(d, "bucket_bytes", where, 4),
            diloco_h=_int(d, "diloco_h", where, 1),
            outer_lr=_float(d, "outer_lr", where),
            outer_momentum=_float(d, "outer_momentum", where),
            codec=_get(d, "codec", str, where),
            grad_codec=_get(d, "grad_codec", str, where) if "grad_codec" in d else "raw",
        )


@dataclass(frozen=True)
class ResumeConfig:
    """Resume at ``step`` from a safetensors file holding exactly this worker's ``state_tensors()``."""

    step: int
    tensors_path: str
    cursor: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a stage worker needs (module docstring); ``spec`` is ``jobs.spec.to_dict``'s."""

    job_id: str
    term: int
    epoch: int
    spec: Mapping[str, Any]
    stages: tuple[StageConfig, ...]
    micro_batches: int
    schedule: str
    peer_id: str
    state_dir: str
    listen_host: str
    owner: str
    checkpoint_dir: str
    checkpoint_interval: int
    total_steps: int
    resume: ResumeConfig | None = None
    threads: int = 1
    device: str = "cpu"
    link_timeout_s: float = field(default=120.0)
    """Seconds a receive may wait for a peer before the worker gives up (a dead peer)."""
    cpus: tuple[int, ...] = ()
    """Cores the worker is pinned to (``affinity.py``); empty: the OS schedules it."""
    replicas: tuple[tuple[StageConfig, ...], ...] = ()
    """Data-parallel replicas: every replica's stages (``stages`` is this worker's own replica, one of them),
    all cut at the same blocks with the same tensor-parallel shares; empty: one pipeline. Replica r trains on
    the r-th equal share of each global batch."""
    replica_sync: ReplicaSyncConfig | None = None
    """How the replicas keep in sync; required with ``replicas``."""
    replica_slots: tuple[int, ...] = ()
    """The slot of each of ``replicas`` (its share of the batch, its place in the ring); empty: 0..R-1. A worker
    that rebuilds a dropped replica gets the plan's live slots and its own."""
    data_shares: int = 0
    """How many shares each global batch is split into (0: one per replica)."""
    ring_generation: int = 0
    """The generation of the replica ring this worker starts in (``ring_links.py``; more than 0 when it rebuilds a
    dropped replica)."""
    max_in_flight: int = 0
    """1F1B: at most this many micro-batches stashed at once on any stage (the plan's ``in_flight_cap``: the model
    fits its devices no other way); 0: the schedule's own."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise WorkerProtocolError(f"schedule: expected one of {SCHEDULES}, got {self.schedule!r}")
        if not self.stages:
            raise WorkerProtocolError("stages: a plan needs at least one stage")
        seen: set[str] = set()
        for s, st in enumerate(self.stages):
            if not st.members:
                raise WorkerProtocolError(f"stages[{s}]: a stage needs at least one member")
            if s and st.start != self.stages[s - 1].end:
                raise WorkerProtocolError(
                    f"stages[{s}]: starts at block {st.start}, the previous stage ends at {self.stages[s - 1].end}"
                )
            for m in st.members:
                if m.peer_id in seen:
                    raise WorkerProtocolError(f"stages[{s}]: peer {m.peer_id} holds two places in the plan")
                seen.add(m.peer_id)
        if self.peer_id not in seen:
            raise WorkerProtocolError(f"peer_id {self.peer_id} is not a member of any stage of the plan")
        if self.replicas:
            seen = self._check_replicas()
        if self.owner not in seen:
            raise WorkerProtocolError(
                f"owner {self.owner} must run a worker of the job (it serves the data); it is in no stage"
            )
        if self.total_steps < 1 or self.micro_batches < 1 or self.threads < 1:
            raise WorkerProtocolError("total_steps, micro_batches and threads must all be >= 1")
        if not 0 <= self.max_in_flight <= self.micro_batches:
            raise WorkerProtocolError(
                f"max_in_flight must be within 0..micro_batches ({self.micro_batches}), got {self.max_in_flight}"
            )
        if self.checkpoint_interval < 0:
            raise WorkerProtocolError("checkpoint_interval must be >= 0 (0: only at the end)")
        try:
            check_cpus(self.cpus, self.threads)
        except AffinityError as exc:
            raise WorkerProtocolError(f"cpus: {exc}") from None
        if self.resume is not None and not 0 <= self.resume.step <= self.total_steps:
            raise WorkerProtocolError(f"resume.step {self.resume.step} outside 0..total_steps")

    def _check_replicas(self) -> set[str]:
        """Validate ``replicas``; returns every peer of every replica."""
        if not 2 <= len(self.replicas) <= MAX_REPLICAS:
            raise WorkerProtocolError(f"replicas: 2..{MAX_REPLICAS} replicas (or none), got {len(self.replicas)}")
        if self.replica_sync is None:
            raise WorkerProtocolError("replica_sync: required when the plan has replicas")
        if self.stages not in self.replicas:
            raise WorkerProtocolError("replicas: this worker's own stages are not one of the replicas")
        shape = [(st.start, st.end, [(m.heads, m.columns) for m in st.members]) for st in self.stages]
        every: set[str] = set()
        for i, rep in enumerate(self.replicas):
            if [(st.start, st.end, [(m.heads, m.columns) for m in st.members]) for st in rep] != shape:
                raise WorkerProtocolError(
                    f"replicas[{i}]: cut differently from this worker's replica (every replica needs the same "
                    "blocks and tensor-parallel shares per stage)"
                )
            for st in rep:
                for m in st.members:
                    if m.peer_id in every:
                        raise WorkerProtocolError(f"replicas[{i}]: peer {m.peer_id} holds two places")
                    every.add(m.peer_id)
        slots = self.slots()
        if len(slots) != len(self.replicas) or list(slots) != sorted(set(slots)) or slots[-1] >= self.share_count():
            raise WorkerProtocolError(
                f"replica_slots: {len(self.replicas)} distinct increasing slots below "
                f"{self.share_count()} (data_shares), got {list(slots)}"
            )
        if not self.replica_count() <= self.share_count() <= MAX_REPLICAS or not 0 <= self.ring_generation <= 1024:
            raise WorkerProtocolError("data_shares must be in replicas..1024 and ring_generation in 0..1024")
        return every

    # -- plan queries ---------------------------------------------------------------------------------------

    def replica_count(self) -> int:
        return max(1, len(self.replicas))

    def share_count(self) -> int:
        """How many shares each global batch is split into (the plan's replicas, dropped ones included)."""
        return self.data_shares or self.replica_count()

    def slots(self) -> tuple[int, ...]:
        """The slot of each replica (``replica_slots``, or 0..R-1)."""
        return self.replica_slots or tuple(range(self.replica_count()))

    def slot_of(self, peer_id: str | None = None) -> int:
        """The slot (share of the batch) of the replica ``peer_id`` (default: this worker) works in."""
        return self.slots()[self.replica_of(peer_id)]

    def ring_slots(self) -> dict[int, str]:
        """This worker's ring by slot: the peer at its (stage, rank) in every replica."""
        return dict(zip(self.slots(), self.ring(), strict=True))

    def replica_of(self, peer_id: str | None = None) -> int:
        """Index of the replica ``peer_id`` (default: this worker) works in (0 without replicas)."""
        pid = self.peer_id if peer_id is None else peer_id
        for i, rep in enumerate(self.replicas):
            if any(m.peer_id == pid for st in rep for m in st.members):
                return i
        if not self.replicas and any(m.peer_id == pid for st in self.stages for m in st.members):
            return 0
        raise WorkerProtocolError(f"peer {pid} is in no replica of the plan")

    def ring(self) -> tuple[str, ...]:
        """This worker's ring: the peer at its (stage, rank) in every replica, in replica order."""
        if not self.replicas:
            return (self.peer_id,)
        s, r = self.position()
        return tuple(rep[s].members[r].peer_id for rep in self.replicas)

    def stage_members(self, stage: int) -> list[str]:
        """Every peer holding ``stage`` in any replica (the ones the owner serves inputs/targets to)."""
        reps = self.replicas or (self.stages,)
        return [m.peer_id for rep in reps for m in rep[stage].members]

    def workers(self) -> list[tuple[int, int, str]]:
        """Every worker of the job as ``(stage, rank, peer_id)`` in global order (stage, then rank)."""
        return [(s, r, m.peer_id) for s, st in enumerate(self.stages) for r, m in enumerate(st.members)]

    def position(self, peer_id: str | None = None) -> tuple[int, int]:
        """``(stage, rank)`` of ``peer_id`` (default: this worker)."""
        pid = self.peer_id if peer_id is None else peer_id
        for s, r, p in self.workers():
            if p == pid:
                return s, r
        raise WorkerProtocolError(f"peer {pid} is not in the plan")

    def peer(self, stage: int, rank: int) -> str:
        return self.stages[stage].members[rank].peer_id

    # -- JSON ---------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stages"] = [_stage_dict(st) for st in self.stages]
        d["spec"] = dict(self.spec)
        d["replicas"] = [[_stage_dict(st) for st in rep] for rep in self.replicas]
        d["replica_sync"] = asdict(self.replica_sync) if self.replica_sync is not None else None
        if self.resume is not None:
            r = self.resume
            d["resume"] = {
                "step": r.step,
                "tensors_path": r.tensors_path,
                "cursor": dict(r.cursor) if r.cursor is not None else None,
            }
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls.from_dict(_load_object(text, "worker config"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerConfig:
        w = "worker config"
        stages = _parse_stages(_get(d, "stages", list, w), f"{w}.stages")
        replicas: list[tuple[StageConfig, ...]] = []
        raw_replicas = d.get("replicas") or []
        if not isinstance(raw_replicas, list) or len(raw_replicas) > MAX_REPLICAS:
            raise WorkerProtocolError(f"{w}.replicas: expected a list of at most {MAX_REPLICAS} stage lists")
        for i, rep in enumerate(raw_replicas):
            if not isinstance(rep, list):
                raise WorkerProtocolError(f"{w}.replicas[{i}]: expected a list of stages")
            replicas.append(tuple(_parse_stages(rep, f"{w}.replicas[{i}]")))
        raw_sync = d.get("replica_sync")
        if raw_sync is not None and not isinstance(raw_sync, dict):
            raise WorkerProtocolError(f"{w}.replica_sync: expected an object or null")
        sync = ReplicaSyncConfig.from_dict(raw_sync, f"{w}.replica_sync") if raw_sync is not None else None
        resume = None
        raw_resume = d.get("resume")
        if raw_resume is not None:
            if not isinstance(raw_resume, dict):
                raise WorkerProtocolError(f"{w}.resume: expected an object or null")
            cursor = raw_resume.get("cursor")
            if cursor is not None and not isinstance(cursor, dict):
                raise WorkerProtocolError(f"{w}.resume.cursor: expected an object or null")
            resume = ResumeConfig(
                _int(raw_resume, "step", f"{w}.resume"),
                _get(raw_resume, "tensors_path", str, f"{w}.resume"),
                cursor,
            )
        return cls(
            job_id=_get(d, "job_id", str, w),
            term=_int(d, "term", w),
            epoch=_int(d, "epoch", w),
            spec=_get(d, "spec", dict, w),
            stages=tuple(stages),
            micro_batches=_int(d, "micro_batches", w, 1),
            schedule=_get(d, "schedule", str, w),
            peer_id=_get(d, "peer_id", str, w),
            state_dir=_get(d, "state_dir", str, w),
            listen_host=_get(d, "listen_host", str, w),
            owner=_get(d, "owner", str, w),
            checkpoint_dir=_get(d, "checkpoint_dir", str, w),
            checkpoint_interval=_int(d, "checkpoint_interval", w),
            total_steps=_int(d, "total_steps", w, 1),
            resume=resume,
            threads=_int(d, "threads", w, 1) if "threads" in d else 1,
            device=_get(d, "device", str, w) if "device" in d else "cpu",
            link_timeout_s=_float(d, "link_timeout_s", w) if "link_timeout_s" in d else 120.0,
            cpus=tuple(_get(d, "cpus", list, w)) if "cpus" in d else (),  # checked by __post_init__
            replicas=tuple(replicas),
            replica_sync=sync,
            replica_slots=tuple(_int_list(d, "replica_slots", w)),
            data_shares=_int(d, "data_shares", w) if "data_shares" in d else 0,
            ring_generation=_int(d, "ring_generation", w) if "ring_generation" in d else 0,
            max_in_flight=_int(d, "max_in_flight", w) if "max_in_flight" in d else 0,
        )


def _int_list(d: Mapping[str, Any], key: str, where: str) -> list[int]:
    raw = d.get(key) or []
    if not isinstance(raw, list) or len(raw) > MAX_REPLICAS or not all(type(v) is int and v >= 0 for v in raw):
        raise WorkerProtocolError(f"{where}.{key}: expected a list of at most {MAX_REPLICAS} integers >= 0")
    return raw


def _stage_dict(st: StageConfig) -> dict[str, Any]:
    return {
        "start": st.start,
        "end": st.end,
        "members": [asdict(m) for m in st.members],
        "micro_batch_s": st.micro_batch_s,
    }


def _parse_stages(raw_stages: list[Any], where_all: str) -> list[StageConfig]:
    stages = []
    for i, raw in enumerate(raw_stages):
        if not isinstance(raw, dict):
            raise WorkerProtocolError(f"{where_all}[{i}]: expected an object")
        where = f"{where_all}[{i}]"
        members = []
        for j, m in enumerate(_get(raw, "members", list, where)):
            if not isinstance(m, dict):
                raise WorkerProtocolError(f"{where}.members[{j}]: expected an object")
            mw = f"{where}.members[{j}]"
            members.append(MemberConfig(_get(m, "peer_id", str, mw), int(m.get("heads", 0)), int(m.get("columns", 0))))
        timing = None if raw.get("micro_batch_s") is None else _float(raw, "micro_batch_s", where)
        if timing is not None and not (math.isfinite(timing) and timing >= 0):
            raise WorkerProtocolError(f"{where}.micro_batch_s: expected a finite number >= 0 or null")
        stages.append(StageConfig(_int(raw, "start", where), _int(raw, "end", where), tuple(members), timing))
    return stages


# ---------------------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Listening:
    port: int

    def to_line(self) -> str:
        return _line({"event": "listening", "port": self.port})


@dataclass(frozen=True)
class StepEvent:
    step: int
    loss: float
    lr: float
    grad_norm: float
    samples: int
    tokens: int
    seconds: float
    wait_seconds: float = 0.0
    """Of ``seconds``, the time the stage waited on its links (bubble and slower neighbours)."""
    optimizer_seconds: float = 0.0
    ring_bytes: int = 0
    """Bytes this worker has sent to its replica ring so far (frames handed to the authenticated stream)."""
    wait_up_seconds: float = 0.0
    """Of ``wait_seconds``, waiting for the previous stage's activations."""
    wait_down_seconds: float = 0.0
    """Of ``wait_seconds``, waiting for the next stage's gradients."""
    group_wait_seconds: float = 0.0
    """Of ``seconds`` (not of ``wait_seconds``), inside the tensor-parallel group's all-reduces."""

    def to_line(self) -> str:
        return _line({"event": "step", **asdict(self)})


@dataclass(frozen=True)
class EvalEvent:
    step: int
    val_loss: float
    val_accuracy: float | None

    def to_line(self) -> str:
        return _line({"event": "eval", **asdict(self)})


@dataclass(frozen=True)
class ShardInfo:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class WitnessEvent:
    """A data-parallel replica's digest of the state every replica holds alike at a checkpoint step: with the
    gradients averaged every step, its checkpoint shard's bytes (the first replica's writes them; the sha256 is
    the shard's); with DiLoCo, the outer anchor and momentum. The leader
    compares the replicas' digests place by place (``arceusd.jobs.leader.witnesses.check_witness``)."""

    step: int
    digest: str

    def to_line(self) -> str:
        return _line({"event": "witness", "step": self.step, "digest": self.digest})


@dataclass(frozen=True)
class CheckpointEvent:
    step: int
    shard: ShardInfo
    cursor: Mapping[str, Any] | None = None
    param_bytes: int = 0
    optimizer_bytes: int = 0

    def to_line(self) -> str:
        return _line(
            {
                "event": "checkpoint",
                "step": self.step,
                "shard": asdict(self.shard),
                "cursor": dict(self.cursor) if self.cursor is not None else None,
                "param_bytes": self.param_bytes,
                "optimizer_bytes": self.optimizer_bytes,
            }
        )


@dataclass(frozen=True)
class DoneEvent:
    step: int

    def to_line(self) -> str:
        return _line({"event": "done", "step": self.step})


@dataclass(frozen=True)
class ErrorEvent:
    message: str

    def to_line(self) -> str:
        return _line({"event": "error", "message": self.message})


Event = Listening | StepEvent | EvalEvent | CheckpointEvent | WitnessEvent | DoneEvent | ErrorEvent


def parse_event(line: str) -> Event:
    """One stdout line of a worker; ``WorkerProtocolError`` for anything else."""
    d = _load_object(line, "worker event")
    kind = _get(d, "event", str, "worker event")
    w = f"{kind} event"
    if kind == "listening":
        return Listening(_int(d, "port", w))
    if kind == "step":
        return StepEvent(
            _int(d, "step", w),
            _float(d, "loss", w),
            _float(d, "lr", w),
            _float(d, "grad_norm", w),
            _int(d, "samples", w),
            _int(d, "tokens", w),
            _float(d, "seconds", w),
            _float(d, "wait_seconds", w) if "wait_seconds" in d else 0.0,
            _float(d, "optimizer_seconds", w) if "optimizer_seconds" in d else 0.0,
            _int(d, "ring_bytes", w) if "ring_bytes" in d else 0,
            _float(d, "wait_up_seconds", w) if "wait_up_seconds" in d else 0.0,
            _float(d, "wait_down_seconds", w) if "wait_down_seconds" in d else 0.0,
            _float(d, "group_wait_seconds", w) if "group_wait_seconds" in d else 0.0,
        )
    if kind == "eval":
        acc = d.get("val_accuracy")
        if acc is not None and not isinstance(acc, int | float):
            raise WorkerProtocolError(f"{w}.val_accuracy: expected a number or null")
        return EvalEvent(_int(d, "step", w), _float(d, "val_loss", w), None if acc is None else float(acc))
    if kind == "checkpoint":
        s = _get(d, "shard", dict, w)
        shard = ShardInfo(
            _get(s, "name", str, w + ".shard"), _get(s, "sha256", str, w + ".shard"), _int(s, "size", w + ".shard")
        )
        cursor = d.get("cursor")
        if cursor is not None and not isinstance(cursor, dict):
            raise WorkerProtocolError(f"{w}.cursor: expected an object or null")
        return CheckpointEvent(
            _int(d, "step", w), shard, cursor, int(d.get("param_bytes", 0)), int(d.get("optimizer_bytes", 0))
        )
    if kind == "witness":
        digest = _get(d, "digest", str, w)
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise WorkerProtocolError(f"{w}.digest: expected 64 lowercase hex characters")
        return WitnessEvent(_int(d, "step", w), digest)
    if kind == "done":
        return DoneEvent(_int(d, "step", w))
    if kind == "error":
        return ErrorEvent(_get(d, "message", str, w))
    raise WorkerProtocolError(f"worker event: unknown event {kind!r}")


# ---------------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class StartCommand:
    addresses: Mapping[str, str]
    """peer id -> ``"host:port"`` of every worker of the job."""

    def to_line(self) -> str:
        return _line({"cmd": "start", "addresses": dict(self.addresses)})


@dataclass(frozen=True)
class StopCommand:
    def to_line(self) -> str:
        return _line({"cmd": "stop"})


@dataclass(frozen=True)
class DropReplicaCommand:
    """The leader dropped a replica (one of its devices died): leave the ``index``-th of the ``replicas`` now in
    this worker's ring out of it from the next sync on (``ring_links.WireRing.drop``); ``hold_at`` (a checkpoint
    step, 0: none): after that checkpoint, wait for the replica's rebuild (:class:`GrowReplicaCommand`) or
    :class:`GoOnCommand`."""

    replicas: int
    index: int
    hold_at: int = 0

    def to_line(self) -> str:
        return _line({"cmd": "drop_replica", "replicas": self.replicas, "index": self.index, "hold_at": self.hold_at})


@dataclass(frozen=True)
class GrowReplicaCommand:
    """A worker holding after checkpoint ``step``: new workers rebuilt the dropped replica of ``slot`` from that
    checkpoint; its devices are ``stages`` (peer ids per stage and rank, cut as this worker's replica) at
    ``addresses``. The ring goes on in ``generation`` with it."""

    step: int
    slot: int
    generation: int
    stages: tuple[tuple[str, ...], ...]
    addresses: Mapping[str, str]

    def to_line(self) -> str:
        return _line(
            {
                "cmd": "grow_replica",
                "step": self.step,
                "slot": self.slot,
                "generation": self.generation,
                "stages": [list(st) for st in self.stages],
                "addresses": dict(self.addresses),
            }
        )


@dataclass(frozen=True)
class GoOnCommand:
    """A worker holding after a checkpoint goes on without the rebuilt replica."""

    def to_line(self) -> str:
        return _line({"cmd": "go_on"})


@dataclass(frozen=True)
class RetireCommand:
    """The leader dropped this worker's own replica (another of its devices is gone) while this worker serves the
    job's data: stop training, serve the other replicas until they are done, then exit."""

    def to_line(self) -> str:
        return _line({"cmd": "retire"})


Command = StartCommand | StopCommand | DropReplicaCommand | GrowReplicaCommand | GoOnCommand | RetireCommand


def parse_command(line: str) -> Command:
    """One stdin line of the daemon; ``WorkerProtocolError`` for anything else."""
    d = _load_object(line, "daemon command")
    kind = _get(d, "cmd", str, "daemon command")
    if kind == "stop":
        return StopCommand()
    if kind == "go_on":
        return GoOnCommand()
    if kind == "retire":
        return RetireCommand()
    if kind == "drop_replica":
        replicas, index = _int(d, "replicas", "drop_replica command", 2), _int(d, "index", "drop_replica command")
        if index >= replicas or replicas > 1024:
            raise WorkerProtocolError(f"drop_replica command: no replica {index} of {replicas}")
        return DropReplicaCommand(replicas, index, _int(d, "hold_at", "drop_replica command") if "hold_at" in d else 0)
    if kind == "grow_replica":
        w = "grow_replica command"
        raw = _get(d, "stages", list, w)
        if not 1 <= len(raw) <= 1024 or not all(
            isinstance(st, list) and 1 <= len(st) <= 1024 and all(isinstance(p, str) for p in st) for st in raw
        ):
            raise WorkerProtocolError(f"{w}.stages: expected lists of peer ids, one per stage")
        return GrowReplicaCommand(
            _int(d, "step", w),
            _int(d, "slot", w),
            _int(d, "generation", w, 1),
            tuple(tuple(st) for st in raw),
            _addresses(d, w),
        )
    if kind == "start":
        return StartCommand(_addresses(d, "start command"))
    raise WorkerProtocolError(f"daemon command: unknown command {kind!r}")


def _addresses(d: Mapping[str, Any], where: str) -> dict[str, str]:
    addresses = _get(d, "addresses", dict, where)
    for k, v in addresses.items():
        if not isinstance(v, str) or ":" not in v:
            raise WorkerProtocolError(f"{where}.addresses[{k!r}]: expected 'host:port', got {v!r}")
    return dict(addresses)


def finite(x: float) -> float:
    """JSON has no NaN/inf: a non-finite loss is reported as a huge sentinel-free error instead (caller)."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x}: training diverged")
    return x
