"""Wire messages of the job lifecycle (ids 70-82, append-only). Announce/join use ids 30-32 of
:mod:`protocol.messages`.

==== ================ ========== =====================================================================
id   type             max_size   meaning
==== ================ ========== =====================================================================
70   PeerAddress      512        (peer id, host:port) pair (nested only)
71   JobStart         4 MiB      leader -> member: the plan (and its inputs) for (job, term, epoch); start a worker
72   JobStartReply    4 KiB      member -> leader: plan verified or refused; the worker's transport address
73   JobGo            64 KiB     leader -> member: every worker's address; begin training
74   JobStop          4 KiB      leader -> member: stop the job's worker (finished, replanning, cancelled)
75   JobReport        64 KiB     member -> leader: a worker event (checkpoint shard, done, error), as JSON
76   JobAck           1 KiB      generic answer
77   ShardRequest     1 KiB      fetch a chunk of a checkpoint shard of (job, step, name) from ``offset``
78   ShardData        4 MiB      up to :data:`SHARD_CHUNK` bytes of the shard and its total size
79   ResumeRequest    1 KiB      member -> leader: a chunk of this member's resume slice for (job, epoch)
80   StandbySync      64 KiB     leader -> standby: step S is committed (signed manifest); copy the named shards
                                 of it (and, once, the data files) from the leader with ShardRequest/DataRequest;
                                 ``offers``: the plan members' offers as JSON (what a takeover plans with)
81   DataRequest      1 KiB      standby -> leader: a chunk of data file ``index`` (of StandbySync.data_files)
82   LinkEcho         2 MiB+     leader <-> member: echoed unchanged; the leader times it to measure the link
==== ================ ========== =====================================================================

``JobStart.standby`` names the plan member that stands by to lead if the leader dies (empty: none); the job's
election ranks the leader first and the standby second (:mod:`arceusd.election`).

``JobStart.resume`` (JSON, empty for a fresh start): ``{"step": S, "files": {peer: {"name", "sha256",
"size"}}}``: the checkpoint step every worker resumes from and each worker's re-sliced state file, which the
member fetches from the leader with :class:`ResumeRequest` and checks against the hash before using it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.messages import message

_ID = {"max_len": 64}


@message(70, max_size=512)
@dataclass(frozen=True)
class PeerAddress:
    peer_id: str = field(metadata=_ID)
    address: str = field(metadata={"max_len": 300})


@message(71, max_size=4 * 1024 * 1024)
@dataclass(frozen=True)
class JobStart:
    job_id: str = field(metadata=_ID)
    term: int
    epoch: int
    spec: bytes = field(metadata={"max_len": 1024 * 1024})
    plan: bytes = field(metadata={"max_len": 1024 * 1024})
    inputs: bytes = field(metadata={"max_len": 2 * 1024 * 1024})
    resume_step: int = 0
    resume: bytes = field(default=b"", metadata={"max_len": 64 * 1024})
    standby: str = field(default="", metadata=_ID)


@message(72, max_size=4096)
@dataclass(frozen=True)
class JobStartReply:
    job_id: str = field(metadata=_ID)
    accepted: bool
    reason: str = field(default="", metadata={"max_len": 2048})
    worker_address: str = field(default="", metadata={"max_len": 300})


@message(73, max_size=64 * 1024)
@dataclass(frozen=True)
class JobGo:
    job_id: str = field(metadata=_ID)
    term: int
    epoch: int
    addresses: tuple[PeerAddress, ...] = field(metadata={"max_len": 256})


@message(74, max_size=4096)
@dataclass(frozen=True)
class JobStop:
    job_id: str = field(metadata=_ID)
    term: int
    reason: str = field(default="", metadata={"max_len": 1024})


@message(75, max_size=64 * 1024)
@dataclass(frozen=True)
class JobReport:
    job_id: str = field(metadata=_ID)
    epoch: int
    event: str = field(metadata={"max_len": 60 * 1024})


@message(76, max_size=1024)
@dataclass(frozen=True)
class JobAck:
    ok: bool
    reason: str = field(default="", metadata={"max_len": 512})


@message(77, max_size=1024)
@dataclass(frozen=True)
class ShardRequest:
    job_id: str = field(metadata=_ID)
    step: int
    name: str = field(metadata={"max_len": 128})
    offset: int = 0


SHARD_CHUNK = 3 * 1024 * 1024


@message(78, max_size=4 * 1024 * 1024)
@dataclass(frozen=True)
class ShardData:
    total: int
    data: bytes = field(metadata={"max_len": SHARD_CHUNK})


@message(79, max_size=1024)
@dataclass(frozen=True)
class ResumeRequest:
    job_id: str = field(metadata=_ID)
    epoch: int
    name: str = field(metadata={"max_len": 128})
    offset: int = 0


@message(80, max_size=64 * 1024)
@dataclass(frozen=True)
class StandbySync:
    job_id: str = field(metadata=_ID)
    step: int
    manifest: bytes = field(metadata={"max_len": 48 * 1024})
    shards: tuple[str, ...] = field(default=(), metadata={"max_len": 64})
    data_files: tuple[str, ...] = field(default=(), metadata={"max_len": 4})
    offers: bytes = field(default=b"", metadata={"max_len": 12 * 1024})


@message(81, max_size=1024)
@dataclass(frozen=True)
class DataRequest:
    job_id: str = field(metadata=_ID)
    index: int
    offset: int = 0


LINK_ECHO_MAX = 2 * 1024 * 1024


@message(82, max_size=LINK_ECHO_MAX + 1024)
@dataclass(frozen=True)
class LinkEcho:
    payload: bytes = field(metadata={"max_len": LINK_ECHO_MAX})
