"""One job as this daemon knows it: its spec, members, plan, progress, and what it reports to users.

Its lifecycle (role, state, the ``(term, epoch)`` stamp, leader, committed step, error), its members, the plan's
standby and the "go only once" guard live in one place, the job's :class:`arceusd.jobs.core.JobCore`, which
decides every transition; :class:`Job` reads them (``job.state``, ``job.term``, ``job.members``,
``job.standby``, ...) and keeps what every device needs around it (the offers, the plan's objects, the worker,
progress, the ledger, the standby's copy); what only the job's leader keeps besides (its queue of long actions,
the reports it gathers towards a commit, the members it measures and judges, recoveries and commits) is its
:class:`arceusd.jobs.record.leader_record.LeaderRecord`, ``job.leading``, one small record per concern.

States (owner/leader): ``waiting`` -> ``planning`` -> ``starting`` ->
``running`` -> ``done``; ``recovering`` while it repartitions after a failure or to rebalance; ``paused`` when
the survivors cannot hold the model (it resumes when capacity returns); ``failed`` / ``cancelled`` end it.
Members mirror what the leader tells them (``announced``, ``joined``, ``starting``, ``running``,
``replanning``, ``paused``, ...).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import trio

from arceusd.jobs.core.machine import JobCore
from arceusd.jobs.core.states import TERMINAL, JobState, Role, Stamp
from arceusd.jobs.judging import claims
from arceusd.jobs.plans.job_paths import JobPaths
from arceusd.jobs.procs.supervisor import WorkerProcess
from arceusd.jobs.record.leader_record import LeaderRecord
from arceusd.jobs.record.report_fields import report_figures
from arceusd.jobs.record.throughput import Speed, Throughput

if TYPE_CHECKING:
    from arceusd.jobs.plans.planning import Offer
    from arceusd.jobs.spec.parsed import JobSpec
    from partitioner import Plan, PlanInputs, ReplicaPlan

HISTORY_TAIL = 200
"""Loss points the control method ``job`` answers by default (the text views draw from these); with
``history: "all"`` it answers every point (``arceusd status JOB --json`` and the dashboard ask for that)."""

MAX_HISTORY = 100_000
"""Loss points a job keeps. Past it, every other point of the history is dropped: the whole curve stays, at half
the resolution (a 1,000,000-step job keeps between 50,000 and 100,000 points, a few MB)."""

STAGE_WINDOW = 20
"""Steps over which ``arceusd status JOB`` reports this device's measured step time and link waits."""


class DropSummary(TypedDict):
    """A replica drop as ``arceusd status JOB --json`` shows it (``dropped_replicas``)."""

    reason: str
    step: int
    devices: list[str]
    replicas_left: int
    at: float


class Contribution(TypedDict):
    """One device's row of the ledger (``contributions``)."""

    peer_id: str
    share: float
    steps: int
    tflop: float


@dataclass(frozen=True)
class ReplicaDrop:
    """A data-parallel replica dropped because one of its devices was lost (the others trained on)."""

    reason: str
    step: int
    """The step this device had reached when the drop reached it."""
    devices: tuple[str, ...]
    replicas_left: int
    at: float = field(default_factory=time.time)

    def summary(self) -> DropSummary:
        return {
            "reason": self.reason,
            "step": self.step,
            "devices": list(self.devices),
            "replicas_left": self.replicas_left,
            "at": round(self.at, 3),
        }


class MemberOffers(Mapping[str, "Offer"]):
    """A read-only view: the offers (``job.offers``) of the peers the core holds as members (all offers on a
    device that never led the job). Membership is the core's alone; this only pairs it with the objects."""

    __slots__ = ("_core", "_offers")

    def __init__(self, offers: dict[str, Offer], core: JobCore) -> None:
        self._offers, self._core = offers, core

    def _counts(self, peer: str) -> bool:
        return self._core.lead is None or self._core.is_member(peer)

    def __getitem__(self, peer: str) -> Offer:
        if not self._counts(peer):
            raise KeyError(peer)
        return self._offers[peer]

    def __contains__(self, peer: object) -> bool:
        return isinstance(peer, str) and peer in self._offers and self._counts(peer)

    def __iter__(self) -> Iterator[str]:
        return (p for p in list(self._offers) if self._counts(p))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class Job:
    job_id: str
    spec: JobSpec
    spec_bytes: bytes
    spec_hash: str
    owner: str
    owner_address: str
    directory: Path
    core: JobCore  # the lifecycle: role, state, stamp, leader, committed step, error (decides every transition)
    offers: dict[str, Offer] = field(default_factory=dict)
    """Peer -> its offer, as this device holds them (the objects). Who is a member is the core's
    (``core.lead.members``): :attr:`members` shows the offers of the core's members."""
    told_members: tuple[str, ...] = ()
    """On a device that does not lead the job: its members as the leader last told this device (the answer to
    its join, each plan's start). ``members`` stays the leader's; :meth:`member_ids` shows whichever applies."""
    plan: Plan | None = None  # the (first) pipeline, whose devices write the checkpoint shards
    replica_plan: ReplicaPlan | None = None  # every replica of the plan (``plan`` is its first)
    ring_bytes: int = 0  # bytes this device's worker sent its replicas' ring in the current plan epoch
    replica_drops: list[ReplicaDrop] = field(default_factory=list)  # replicas dropped, the others going on
    replica_slots: tuple[int, ...] = ()  # the slot (share of each batch) of each replica now; (): 0..R-1
    data_shares: int = 0  # shares of each batch (the plan's replicas, dropped ones too); 0: one per replica
    ring_generation: int = 0  # the replica rings' generation: one more per replica dropped or rebuilt
    rebuilt_replicas: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (step, devices) of rebuilds
    serving_only: bool = False  # this device's worker retired (its replica dropped): it only serves the data
    inputs: PlanInputs | None = None
    shares: dict[str, float] = field(default_factory=dict)
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    lr: float | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    throughput: Throughput = field(default_factory=Throughput)
    """This device's worker's steps over time: the job's steps/s, samples/s, tokens/s and time left."""
    history: list[tuple[int, float]] = field(default_factory=list)
    history_at: list[float] = field(default_factory=list)
    """The wall-clock time this device saw each point of ``history`` (the same length; the dashboard's time axis
    and its CSV)."""
    # this device's stage over its last steps, from the worker's step events
    stage_times: deque[claims.StageTime] = field(default_factory=lambda: deque(maxlen=STAGE_WINDOW))
    model_path: str = ""
    worker: WorkerProcess | None = None
    local_stopped: trio.Event | None = None  # set once the worker this device last detached has stopped
    created: float = field(default_factory=time.time)
    first_step_at: float = 0.0  # wall clock of this device's first training step (0: none yet)
    first_of_daemon: bool = False  # submitted here before any other job since this daemon started
    spare_in: tuple[int, int] | None = None  # the (term, epoch) of the leader's plan that left this device out
    finished: trio.Event = field(default_factory=trio.Event)
    wake: trio.Event = field(default_factory=trio.Event)  # set to wake the leader's loop (poke)
    leading: LeaderRecord = field(default_factory=lambda: LeaderRecord())  # what it keeps while it leads
    # the ledger: every device credits the plan's devices for each step its worker ran
    steps_done: dict[str, int] = field(default_factory=dict)  # peer -> training steps it took part in
    work: dict[str, float] = field(default_factory=dict)  # peer -> sum of its share over those steps
    # leadership: the owner leads until it dies; then the plan's standby (elected) takes over
    leader_address: str = ""  # where the device this one takes commands from (core.leader) listens
    standby_data: dict[str, Any] | None = None  # on the standby: the data entry of its checked copy
    standby_offers: dict[str, Offer] = field(default_factory=dict)  # on the standby: the plan members' offers
    sync_lock: trio.Lock = field(default_factory=trio.Lock)
    shapes_lock: trio.Lock = field(default_factory=trio.Lock)  # one child computes a plan's shard shapes
    commit_lock: trio.Lock = field(default_factory=trio.Lock)  # the leader commits one checkpoint at a time

    def __post_init__(self) -> None:
        self.leader_address = self.leader_address or self.owner_address

    # ----------------------------------------------------------------------------- the three ways a job begins
    @classmethod
    def submitted(
        cls,
        job_id: str,
        spec: JobSpec,
        spec_bytes: bytes,
        digest: str,
        me: str,
        address: str,
        jobs_root: Path,
        *,
        min_members: int,
        first_of_daemon: bool,
        created: float,
    ) -> Job:
        """A job submitted to this device (``me``, listening at ``address``): it owns and leads it, waiting for
        ``min_members`` members."""
        core = JobCore.owned(me, spec.training.steps, min_members=min_members)
        paths = JobPaths.of(jobs_root, job_id)
        return cls(
            job_id,
            spec,
            spec_bytes,
            digest,
            me,
            address,
            paths.directory,
            core,
            total_steps=spec.training.steps,
            first_of_daemon=first_of_daemon,
            created=created,
        )

    @classmethod
    def restored(
        cls,
        saved: dict[str, Any],
        spec: JobSpec,
        spec_bytes: bytes,
        address: str,
        paths: JobPaths,
        *,
        committed_step: int,
        gather_until: float,
    ) -> Job:
        """A job this device owned when it stopped (``saved``: its owner record), resumed from
        ``committed_step`` once the members it had (until ``gather_until``) rejoin, in a new term."""
        me = str(saved["owner"])
        core = JobCore.owned(
            me,
            spec.training.steps,
            stamp=Stamp(int(saved["term"]) + 1, int(saved["epoch"])),
            committed_step=committed_step,
            gather_until=gather_until,
            expected=frozenset(str(p) for p in saved.get("members", [])),
        )
        return cls(
            str(saved["job_id"]),
            spec,
            spec_bytes,
            str(saved["spec_hash"]),
            me,
            address,
            paths.directory,
            core,
            total_steps=spec.training.steps,
            step=committed_step,
        )

    @classmethod
    def announced(
        cls,
        job_id: str,
        spec: JobSpec,
        spec_bytes: bytes,
        digest: str,
        owner: str,
        owner_address: str,
        me: str,
        jobs_root: Path,
    ) -> Job:
        """A job another device (``owner``) announced to this one: seen, not joined yet."""
        core = JobCore(me, owner, spec.training.steps)
        return cls(
            job_id,
            spec,
            spec_bytes,
            digest,
            owner,
            owner_address,
            JobPaths.of(jobs_root, job_id).directory,
            core,
            total_steps=spec.training.steps,
        )

    @property
    def members(self) -> MemberOffers:
        """The job's members with their offers: the core's members (while it holds the leader's state) whose
        offers this device holds; on a device that never led the job, every offer it holds."""
        return MemberOffers(self.offers, self.core)

    def drop_member(self, peer: str) -> None:
        """``peer`` is no member any more (it left, or the leader excluded it): the core drops it, and its offer
        goes. The caller asks for the repartition when it was in the plan."""
        self.core.drop_member(peer)
        if peer != self.core.me:
            self.offers.pop(peer, None)

    @property
    def standby(self) -> str:
        """The current plan's standby (holds the data and the leader's shards): the core's."""
        return self.core.standby

    @property
    def paths(self) -> JobPaths:
        """Where this job's files live on this device."""
        return JobPaths(self.directory)

    # -------------------------------------------------------------------------------- the core's, read here
    @property
    def role(self) -> Role:
        return self.core.role

    @property
    def state(self) -> JobState:
        return self.core.state

    @property
    def term(self) -> int:
        return self.core.stamp.term

    @property
    def epoch(self) -> int:
        return self.core.stamp.epoch

    @property
    def leader(self) -> str:
        """The peer id of the device this one takes commands from (itself when it leads)."""
        return self.core.leader

    @property
    def leaders(self) -> set[str]:
        """Everyone who led the job: whose manifests we trust."""
        return self.core.leaders

    @property
    def committed_step(self) -> int:
        return self.core.committed_step

    @property
    def error(self) -> str:
        return self.core.error

    @error.setter
    def error(self, value: str) -> None:
        """What went wrong last, for users (a note; transitions are the core's)."""
        self.core.error = value

    def poke(self) -> None:
        """Wake the leader loop (a member changed, a report came, a restart was asked for)."""
        self.wake.set()

    def record_loss(self, step: int, loss: float, at: float | None = None) -> None:
        """Add a point to the loss history (seen at wall clock ``at``, now by default), halving the resolution
        once it holds :data:`MAX_HISTORY` points."""
        self.history.append((step, round(loss, 5)))
        self.history_at.append(round(time.time() if at is None else at, 3))
        self.first_step_at = self.first_step_at or self.history_at[-1]
        if len(self.history) > MAX_HISTORY:
            self.history = self.history[::-2][::-1]  # every other point, counted back from the newest
            self.history_at = self.history_at[::-2][::-1]

    def cut_history(self, last_step: int) -> None:
        """Drop the loss points after ``last_step`` (a resume from that checkpoint), with their times."""
        kept = [i for i, h in enumerate(self.history) if h[0] <= last_step]
        self.history = [self.history[i] for i in kept]
        self.history_at = [self.history_at[i] for i in kept if i < len(self.history_at)]

    def speed(self) -> Speed:
        """How fast it trains now; once it ended, how fast it trained last (no time left); nothing while it
        replans, waits or is paused (its last rate is not what it does)."""
        if self.state != JobState.RUNNING and self.state not in TERMINAL:
            return Speed()
        context = getattr(self.spec.model, "block_size", None)
        speed = self.throughput.speed(
            self.step, self.total_steps, self.spec.training.batch_size, context if isinstance(context, int) else None
        )
        return speed if self.state == JobState.RUNNING else replace(speed, eta_s=None)

    def summary(self, full: bool = False, whole_history: bool = False, me: str = "") -> dict[str, Any]:
        """What ``arceusd status`` shows; ``full`` for ``status JOB`` (``me``: this device, whose stage times
        come from its own worker's steps rather than from its last checkpoint report)."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "name": self.spec.name,
            "owner": self.owner,
            "role": self.role,
            "state": self.state,
            "step": self.step,
            "total_steps": self.total_steps,
            "loss": self.loss,
            "val_loss": self.val_loss,
            "val_accuracy": self.val_accuracy,
            "members": self.member_ids(),
            "error": self.error,
            "model_path": self.model_path,
            "spec_hash": self.spec_hash,
            "leader": self.leader,
            "spare": self.is_spare(),
            **asdict(self.speed()),
        }
        if full:
            history = list(self.history) if whole_history else self.history[-HISTORY_TAIL:]
            out.update(
                {
                    "term": self.term,
                    "epoch": self.epoch,
                    "lr": self.lr,
                    "history": history,
                    "history_at": self.history_at[-len(history) :] if history else [],
                    "committed_step": self.committed_step,
                    "plan": self.plan_summary(),
                    "spares": self.spares(),
                    "contributions": self.contributions(),
                    "recoveries": [r.summary() for r in self.leading.loop.recoveries],
                    "model": type(self.spec.model).__name__,
                    "data": self.spec.data.kind,
                    "worker_pid": self.worker.pid if self.worker is not None else None,
                    "stale_reports": self.leading.checks.stale_reports,
                    "standby": self.standby,
                    "links": self.leading.loop.links,
                    "refused_reports": dict(self.leading.checks.refused_reports),
                    "excluded": dict(self.leading.checks.excluded),
                    "measured_step_s": {p: list(t) for p, t in self.leading.speed.measured.items()},
                    "member_reports": report_figures(self.leading.commits.latest),
                    "discounted": {p: round(f, 2) for p, f in self.leading.speed.discounts.items()},
                    "speed_checks": {p: t.summary() for p, t in self.leading.speed.timed.items()},
                    "probation": self.leading.probation.member,
                    "cleared": sorted(self.leading.probation.cleared),
                    "standby_ready": self.standby_ready(),
                    "standby_step": self.standby_step(),
                    "stage_timing": self.stage_timing(),
                    "stage_times": self.stage_times_by_device(me),
                    "ring_bytes": self.ring_bytes,
                    "dropped_replicas": [d.summary() for d in self.replica_drops],
                    "rebuilt_replicas": [{"step": step, "devices": list(d)} for step, d in self.rebuilt_replicas],
                    "checkpoints": [{"step": s, "at": round(t, 3)} for s, t in self.leading.commits.checkpoints],
                }
            )
        return out

    def standby_step(self) -> int | None:
        """The newest committed step the job's standby holds, as this device knows it: on the leader, what the
        standby confirmed (``StandbyHeld``: its copies checked); on the standby, its own copy; None otherwise."""
        if self.leader == self.core.me:
            held = self.leading.commits.standby_held
            return held[1] if held is not None and held[0] == self.standby else None
        mine = self.standby == self.core.me and self.standby_data is not None and self.committed_step > 0
        return self.committed_step if mine else None

    def standby_ready(self) -> bool | None:
        """Whether the job's standby could lead: on the leader, once the standby confirmed a committed checkpoint
        (issue 31: the leader's own view said "syncing" for good, and after a take-over its old standby copy
        spoke for the new standby); on the standby, whether it holds its checked copies; None on any other device
        (it is not told: its views say nothing of it rather than "syncing")."""
        if self.leader == self.core.me:
            return self.standby_step() is not None
        if self.standby == self.core.me:
            return self.standby_data is not None
        return None

    def spares(self) -> list[str]:
        """The members the leader's plan leaves out (the step is predicted faster without them): unpaid, they
        take a place when one is lost. Empty on a device that does not lead the job, or before a plan."""
        plan = self.plan_peers()
        if self.leader != self.core.me or not plan:
            return []
        return sorted(set(self.members) - set(plan))

    def is_spare(self) -> bool:
        """Whether this device is a member the leader's current plan leaves out (it was sent the plan and holds
        no place in it: :meth:`mark_spare`): in no stage, paid nothing, it takes a place if one is lost."""
        return self.spare_in is not None and self.state not in TERMINAL and self.leader != self.core.me

    def mark_spare(self, term: int, epoch: int, told: tuple[str, ...]) -> None:
        """The leader's plan of ``(term, epoch)`` came and leaves this device out (``told``: the job's members as
        the leader holds them). A plan that gives it a place clears it (``spare_in = None``)."""
        if self.spare_in is None or (term, epoch) >= self.spare_in:
            self.spare_in = (term, epoch)
            self.told_members = told or self.told_members

    def member_ids(self) -> list[str]:
        """The job's members as this device knows them: while it leads, the peers whose offers it holds;
        otherwise the ids its leader last told it (none for a job it never joined)."""
        return sorted(self.members) if self.leader == self.core.me else sorted(self.told_members)

    def stage_timing(self) -> dict[str, float] | None:
        """This device's stage over its last steps: median step time, and the share of it spent waiting on
        links (the pipeline's bubble and slower neighbours), to set beside the plan's prediction."""
        if not self.stage_times:
            return None
        seconds = sorted(t.total_s for t in self.stage_times)
        total = sum(seconds)
        waited = sum(t.wait_s for t in self.stage_times)
        return {
            "steps": len(seconds),
            "step_time_s": seconds[len(seconds) // 2],
            "wait_fraction": waited / total if total > 0 else 0.0,
        }

    def stage_times_by_device(self, me: str = "") -> dict[str, dict[str, float | None]]:
        """Each device's measured compute and link-wait seconds per step (medians) beside the plan's prediction:
        the members' from their last checkpoint reports (the leader keeps them), this device's (``me``) from its
        own worker's last steps. ``wait_s`` is None for a report that did not carry it; ``seen_s`` is the step time
        the device's neighbours in the pipeline saw it take (None when they did not all report;
        :func:`arceusd.jobs.judging.claims.seen_by_neighbours`)."""
        out: dict[str, dict[str, float | None]] = {
            peer: {
                "compute_s": got,
                "wait_s": self.leading.speed.waits.get(peer),
                "predicted_s": predicted,
                "seen_s": self.leading.speed.seen.get(peer),
            }
            for peer, (got, predicted) in sorted(self.leading.speed.measured.items())
        }
        own = claims.own_step_times(self, me) if me else {}
        if own:
            out[me] = {
                "compute_s": own["step_s"],
                "wait_s": own.get("wait_s"),
                "predicted_s": own["predicted_s"],
                "seen_s": self.leading.speed.seen.get(me),
            }
        return out

    def plan_peers(self) -> tuple[str, ...]:
        """Every device of the current plan, in every replica, in plan order (empty without a plan): while this
        device leads, the core's (it decides them: a plan found, a replica dropped or rebuilt); otherwise those of
        the plan its leader sent (:meth:`planned_peers`)."""
        if self.core.leads:
            return self.core.plan_devices
        return self.planned_peers()

    def planned_peers(self) -> tuple[str, ...]:
        """The devices of the plan objects this device holds (the leader's before it hands them to its core)."""
        if self.plan is None:
            return ()
        if self.replica_plan is not None:
            return tuple(self.replica_plan.peer_ids)
        return tuple(self.plan.peer_ids)

    def slots(self) -> tuple[int, ...]:
        """The slot of each replica of the plan now (its share of each batch)."""
        count = len(self.replica_plan.replicas) if self.replica_plan is not None else 1
        return self.replica_slots or tuple(range(count))

    def plan_summary(self) -> dict[str, Any] | None:
        """The plan for ``status``/the dashboard: the first pipeline's stages, and with data-parallel replicas
        every replica's stages, the sync mode and the whole job's predicted step time."""
        if self.plan is None:
            return None
        planned = {} if self.inputs is None else {d.peer_id: d.flops_per_s for d in self.inputs.devices}

        def stages(the_plan: Plan) -> list[dict[str, Any]]:
            return [
                {
                    "index": s.index,
                    "blocks": [s.start, s.end],
                    "devices": [
                        {
                            "peer_id": sh.peer_id,
                            "heads": list(sh.heads),
                            "mlp_columns": list(sh.mlp_columns),
                            "flops_per_s": planned.get(sh.peer_id),
                        }  # the speed planned with (claims.discounted)
                        for sh in s.shares
                    ],
                }
                for s in the_plan.stages
            ]

        out: dict[str, Any] = {
            "schedule": self.plan.schedule,
            "micro_batches": self.plan.micro_batches,
            "in_flight_cap": self.plan.in_flight_cap,  # (0: none; the model fits its devices no other way)
            "predicted_step_time_s": self.plan.predicted_step_time_s,
            "bubble_fraction": self.plan.bubble_fraction,
            "stages": stages(self.plan),
        }
        rp = self.replica_plan
        if rp is not None and len(rp.replicas) > 1:
            out.update(
                {
                    "predicted_step_time_s": rp.predicted_step_time_s,
                    "sync": rp.sync_mode.value,
                    "sync_s": rp.sync_s,
                    "diloco_h": rp.diloco_h if rp.sync_mode.value == "diloco" else None,
                    "replicas": [
                        {"stages": stages(p), "predicted_step_time_s": p.predicted_step_time_s} for p in rp.replicas
                    ],
                }
            )
        return out

    def contributions(self) -> list[Contribution]:
        """The ledger: each device's share of the model's FLOPs under the plan(s) it worked in, the steps it
        took part in, and the work that adds up to (shares change when the job is repartitioned)."""
        if self.inputs is None:
            return []
        per_sample = sum(b.forward_flops_per_sample + b.backward_flops_per_sample for b in self.inputs.blocks)
        batch = self.spec.training.batch_size
        peers = sorted(set(self.shares) | set(self.work))
        return [
            {
                "peer_id": peer,
                "share": round(self.shares.get(peer, 0.0), 4),
                "steps": self.steps_done.get(peer, 0),
                "tflop": round(self.work.get(peer, 0.0) * per_sample * batch / 1e12, 6),
            }
            for peer in peers
        ]

    def credit(self, steps: int) -> None:
        """Account ``steps`` completed training steps to the current plan's devices, by their share."""
        for peer, share in self.shares.items():
            self.work[peer] = self.work.get(peer, 0.0) + share * steps
            self.steps_done[peer] = self.steps_done.get(peer, 0) + steps


__all__ = [
    "HISTORY_TAIL",
    "MAX_HISTORY",
    "STAGE_WINDOW",
    "TERMINAL",
    "Contribution",
    "DropSummary",
    "Job",
    "MemberOffers",
    "ReplicaDrop",
]
