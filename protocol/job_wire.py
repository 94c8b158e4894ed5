"""Wire messages of the job lifecycle (ids 70-89 and 95-98, append-only). Announce/join use ids 30-32 of
:mod:`protocol.messages`.

==== ================ ========== =====================================================================
id   type             max_size   meaning
==== ================ ========== =====================================================================
70   PeerAddress      512        (peer id, host:port) pair (nested only)
71   JobStart         4 MiB      leader -> member: the plan (and its inputs) for (job, term, epoch); start a worker
72   JobStartReply    4 KiB      member -> leader: plan verified or refused; the worker's transport address
73   JobGo            64 KiB     leader -> member: every worker's address; begin training
74   JobStop          4 KiB      leader -> member: stop the job's worker (finished, replanning, cancelled)
75   JobReport        64 KiB     member -> leader: a worker event (checkpoint shard, witness, done, error, lost) or
                                 the member's departure, as typed fields (below)
76   JobAck           1 KiB      generic answer
77   ShardRequest     1 KiB      fetch a chunk of a checkpoint shard of (job, step, name) from ``offset``
78   ShardData        4 MiB      up to :data:`SHARD_CHUNK` bytes of the shard and its total size
79   ResumeRequest    1 KiB      member -> leader: a chunk of this member's resume slice for (job, epoch)
80   StandbySync      64 KiB     leader -> standby: step S is committed (signed manifest); copy the named shards
                                 of it (and, once, the data files) from the leader with ShardRequest/DataRequest;
                                 ``offers``: the plan members' offers as JSON (what a takeover plans with)
81   DataRequest      1 KiB      standby -> leader: a chunk of data file ``index`` (of StandbySync.data_files)
82   LinkEcho         2 MiB+     leader <-> member: echoed unchanged; the leader times it to measure the link
83   ReportShard      512        a checkpoint shard as its writer reports it: name, sha256 (hex), size (nested only)
84   ReportCursor     64         the sampler cursor of a checkpoint: (epoch, step) (nested only)
85   JobDropReplica   512        leader -> the replicas left: replica ``index`` of ``replicas`` is dropped (one of
                                 its devices is gone); the others train on over a smaller ring
86   JobGrowReplica   64 KiB     leader -> the replicas left, holding at a checkpoint: the dropped replica was
                                 rebuilt (its slot, devices, worker addresses, ring generation), or ``release``
87   SpeedChallenge   512        leader -> member: get ready for ``rounds`` products of ``size`` x ``size``
                                 matrices (a JobAck once its child is loaded; :mod:`arceusd.jobs.judging.challenges`)
88   ChallengeGo      512        leader -> member: the seed; the leader's clock runs until the answer
89   ChallengeRoot    512        member -> leader: the Merkle root of every product's blocks
95   ChallengeOpen    1 KiB      leader -> member: the blocks (leaves) to show
96   ChallengeBlocks  64 KiB     member -> leader: those blocks' digests (float32) and Merkle proofs
97   WeightsRequest   1 KiB      member -> leader: a chunk of this member's place's initial weights for (job,
                                 epoch) (their raw bytes in the order the signed spec implies), or, ``whole``,
                                 standby -> leader: a chunk of the whole weights file
98   StandbyHeld      512        standby -> leader: this device holds committed checkpoint ``step``, every shard
                                 (and the data, once) copied and checked: it can lead from there (the leader's
                                 ``status`` says "ready at step S" only from this, issue 31)
==== ================ ========== =====================================================================

``JobStart.grow`` (JSON, empty for a plan's start) starts a spare device's worker in a dropped replica's slot, from
a committed checkpoint, while the other replicas hold (``arceusd.jobs.leader.regrow``; a device left takes
``JobGrowReplica`` in ``arceusd.jobs.member.replica_changes``).

``JobStart.members`` names the job's members as the leader holds them when it sends the start (at most
:data:`JOB_MEMBERS_MAX`, each a peer id; :func:`protocol.validation.member_ids` checks them): what a member shows
as the job's members (``arceusd jobs``, ``market``), kept current by every plan's start. A leader takes no member
past :data:`JOB_MEMBERS_MAX`.

``JobStart.standby`` names the plan member that stands by to lead if the leader dies (empty: none); the job's
election ranks the leader first and the standby second (:mod:`arceusd.elections.core`).

``JobStart.resume`` (JSON, empty for a fresh start): ``{"step": S, "files": {peer: {"name", "sha256",
"size"}}}``: the checkpoint step every worker resumes from and each worker's re-sliced state file, which the
member fetches from the leader with :class:`ResumeRequest` and checks against the hash before using it.

``JobReport``: ``kind`` (:class:`ReportKind`) says what happened; the other fields are its parts, each absent
(None, or ``""`` for the strings) when the kind has none: ``step`` (checkpoint, witness, done), ``shard`` (a
:class:`ReportShard`: name at most 128 bytes, sha256 as 64 hex characters, size), ``cursor`` (a
:class:`ReportCursor`, from the job owner's worker only), ``digest`` (witness: a sha256, 64 hex characters),
``message`` (error, lost: at most :data:`REPORT_MESSAGE_MAX` bytes) and the sender's step-time claims in
seconds per step (checkpoint: ``step_s``, ``predicted_s``, ``wait_s``, ``wait_up_s``, ``wait_down_s``,
``group_wait_s``). The codec bounds every field and checks its type (an unknown kind is ``bad_enum``, a longer
name ``too_long``: the report is dropped and counted under that reason, ``dropped.membership`` in ``arceusd
status``); what the values mean (a shard name from the plan, a size within its bound, finite seconds) the
leader checks (:mod:`arceusd.jobs.leader.shard_checks`, :mod:`arceusd.jobs.leader.witnesses`,
:mod:`arceusd.jobs.judging.claims`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol.messages import message

_ID = {"max_len": 64}

JOB_MEMBERS_MAX = 1024
"""The most members a job holds: the member ids a :class:`JobStart` (and a join's answer,
:class:`protocol.messages.JoinReply`) may name."""


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
    grow: bytes = field(default=b"", metadata={"max_len": 4096})  # a dropped replica rebuilt: JSON (plans.grow_start)
    members: tuple[str, ...] = field(default=(), metadata={"max_len": JOB_MEMBERS_MAX})  # the job's member ids


@message(72, max_size=4096)
@dataclass(frozen=True)
class JobStartReply:
    job_id: str = field(metadata=_ID)
    accepted: bool
    reason: str = field(default="", metadata={"max_len": 2048})
    worker_address: str = field(default="", metadata={"max_len": 300})
    follows: str = field(default="", metadata=_ID)  # a refusal's: the peer id this member takes commands from


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


class ReportKind(enum.IntEnum):
    """What a :class:`JobReport` says: a worker event (``lost``: the worker process died without one) or the
    member's departure from the job."""

    CHECKPOINT = 1
    WITNESS = 2
    DONE = 3
    ERROR = 4
    LOST = 5
    LEAVE = 6


SHARD_NAME_MAX = 128
"""Bytes of a shard's file name (as in :class:`ShardRequest`)."""
SHA256_HEX = 64
REPORT_MESSAGE_MAX = 2048
"""Bytes of a report's error message (the leader shows the first 300 characters)."""


@message(83, max_size=512)
@dataclass(frozen=True)
class ReportShard:
    """A checkpoint shard as its writer reports it: file name, sha256 in lowercase hex, size in bytes."""

    name: str = field(metadata={"max_len": SHARD_NAME_MAX})
    sha256: str = field(metadata={"max_len": SHA256_HEX})
    size: int


@message(84, max_size=64)
@dataclass(frozen=True)
class ReportCursor:
    """The next step to run is step ``step`` of epoch ``epoch`` (:class:`arceusd.data.steps.Cursor`)."""

    epoch: int
    step: int


@message(75, max_size=64 * 1024)
@dataclass(frozen=True)
class JobReport:
    job_id: str = field(metadata=_ID)
    epoch: int
    kind: ReportKind
    step: int | None = None
    shard: ReportShard | None = None
    cursor: ReportCursor | None = None
    digest: str = field(default="", metadata={"max_len": SHA256_HEX})
    message: str = field(default="", metadata={"max_len": REPORT_MESSAGE_MAX})
    step_s: float | None = None
    predicted_s: float | None = None
    wait_s: float | None = None
    wait_up_s: float | None = None
    wait_down_s: float | None = None
    group_wait_s: float | None = None


@message(76, max_size=1024)
@dataclass(frozen=True)
class JobAck:
    ok: bool
    reason: str = field(default="", metadata={"max_len": 512})
    follows: str = field(default="", metadata=_ID)  # a refusal's: the peer id this member takes commands from


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


@message(98, max_size=512)
@dataclass(frozen=True)
class StandbyHeld:
    """Standby -> leader, after a :class:`StandbySync`'s copies are checked: it holds committed ``step``."""

    job_id: str = field(metadata=_ID)
    step: int


@message(81, max_size=1024)
@dataclass(frozen=True)
class DataRequest:
    job_id: str = field(metadata=_ID)
    index: int
    offset: int = 0


@message(97, max_size=1024)
@dataclass(frozen=True)
class WeightsRequest:
    """A chunk from ``offset`` of the sender's slice of a stock LM's initial weights in plan epoch ``epoch``
    (:mod:`arceusd.models.hf.weights_slice`), or, with ``whole``, of the whole weights file (to the standby)."""

    job_id: str = field(metadata=_ID)
    epoch: int
    offset: int = 0
    whole: bool = False


LINK_ECHO_MAX = 2 * 1024 * 1024


@message(82, max_size=LINK_ECHO_MAX + 1024)
@dataclass(frozen=True)
class LinkEcho:
    payload: bytes = field(metadata={"max_len": LINK_ECHO_MAX})


@message(85, max_size=512)
@dataclass(frozen=True)
class JobDropReplica:
    """Leader -> the devices of the replicas left: a device of replica ``index`` (of the ``replicas`` in the plan
    now) is gone; that replica is dropped and the others train on over a smaller ring (issue 22)."""

    job_id: str = field(metadata=_ID)
    replicas: int
    index: int
    hold_at: int = 0  # the checkpoint step after which the replicas left hold for its rebuild (0: no rebuild)


@message(86, max_size=64 * 1024)
@dataclass(frozen=True)
class JobGrowReplica:
    """Leader -> the devices of the replicas left, holding after checkpoint ``step``: the dropped replica of
    ``slot`` was rebuilt on ``devices`` (taking the places of the first replica's devices, in order) whose
    workers listen at ``addresses``; the ring goes on in ``generation`` with it. ``release``: no rebuild, go on."""

    job_id: str = field(metadata=_ID)
    step: int
    slot: int = 0
    generation: int = 0
    devices: tuple[str, ...] = field(default=(), metadata={"max_len": 1024})
    addresses: tuple[PeerAddress, ...] = field(default=(), metadata={"max_len": 1024})
    release: bool = False


CHALLENGE_ID = 32
"""A speed challenge's id: 32 hex characters the leader draws."""
CHALLENGE_OPEN_MAX = 16
"""The most blocks a leader may ask to see."""
CHALLENGE_BLOCK_MAX = 16 * 4
"""The bytes of one block (``challenges.BLOCK_ROWS`` rows' digests, float32)."""


@message(87, max_size=512)
@dataclass(frozen=True)
class SpeedChallenge:
    """Leader -> member: get ready to compute ``rounds`` products of ``size`` x ``size`` matrices (issue #19);
    answered with a JobAck once ready. ``deadline_s``: how long the leader waits for the root once it sent the
    seed (the member stops the work then)."""

    job_id: str = field(metadata=_ID)
    challenge: str = field(metadata={"max_len": CHALLENGE_ID})
    size: int
    rounds: int
    deadline_s: float


@message(88, max_size=512)
@dataclass(frozen=True)
class ChallengeGo:
    """Leader -> member: the seed of the matrices; answered with a :class:`ChallengeRoot` (or a JobAck refusing)."""

    job_id: str = field(metadata=_ID)
    challenge: str = field(metadata={"max_len": CHALLENGE_ID})
    seed: str = field(metadata={"max_len": SHA256_HEX})


@message(89, max_size=512)
@dataclass(frozen=True)
class ChallengeRoot:
    challenge: str = field(metadata={"max_len": CHALLENGE_ID})
    root: str = field(metadata={"max_len": SHA256_HEX})


@message(95, max_size=1024)
@dataclass(frozen=True)
class ChallengeOpen:
    """Leader -> member: show these leaves (blocks) of the products; answered with :class:`ChallengeBlocks`."""

    job_id: str = field(metadata=_ID)
    challenge: str = field(metadata={"max_len": CHALLENGE_ID})
    leaves: tuple[int, ...] = field(default=(), metadata={"max_len": CHALLENGE_OPEN_MAX})


@message(96, max_size=64 * 1024)
@dataclass(frozen=True)
class ChallengeBlocks:
    """Member -> leader: each opened block's digests (float32) and its Merkle proof (sibling hashes, 32 bytes
    each)."""

    challenge: str = field(metadata={"max_len": CHALLENGE_ID})
    blocks: tuple[bytes, ...] = field(default=(), metadata={"max_len": CHALLENGE_OPEN_MAX})
    proofs: tuple[bytes, ...] = field(default=(), metadata={"max_len": CHALLENGE_OPEN_MAX})
