"""From a job spec and its members' offers to a verified plan, and from a plan to the workers' stage list.

Pure functions. The leader calls :func:`make_plan`; every member calls :func:`verify_start` on what the leader
sent, which recomputes the block costs from the spec (never trusting the leader's), checks that its own offer is
what it reported, and re-runs the partitioner (``partitioner.verify``): a member refuses a plan that does not
match byte for byte.

Links: the leader measures its link to each member over the transport (round trip, bandwidth, per-message cost;
``arceusd.device.link_probe.measure_link`` in the job manager) and estimates a link between two members from their links
to it (:func:`estimated_links`). Where nothing was measured, the round trip is the membership layer's and the
bandwidth :data:`DEFAULT_BANDWIDTH`. Whatever was used is stated in the plan inputs, which everyone verifies.

Calibration (``arceusd.device.profile``): an offer may carry what its device measured beyond the matmul benchmark:
the model blocks' efficiency, the dispatch cost per block, the optimizer's cost per parameter (AdamW and SGD;
the job's optimizer picks one) and the transport's cost per message. They go into the plan inputs
(``DeviceProfile`` fields; a link's message cost is the mean of its two ends'), so every member recomputes
the same plan. An offer without them (the defaults) plans as before calibration existed.

Replicas (``training.replicas`` / ``sync`` / ``diloco`` of the spec): :func:`make_replica_plan` asks
``partitioner.plan_replicas`` for R data-parallel pipelines (R and the sync mode fixed by the spec or chosen for
the most tokens/s); :func:`worker_replicas` and :func:`replica_sync_config` turn its answer into the workers'
``WorkerConfig.replicas`` / ``replica_sync``. The daemon plans every job as a ``ReplicaPlan``
(:func:`make_job_plan`): a spec that keeps ``replicas = 1`` gets today's one pipeline and its plan bytes
unchanged on the wire; any other spec sends the replica plan's bytes (:func:`encode_job_start`), which every
member recomputes (:func:`verify_job_start`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arceusd.jobs.judging.claims import MAX_DISCOUNT
from arceusd.jobs.spec.parsed import JobSpec
from arceusd.models.config import GPTConfig
from arceusd.models.costs import block_costs
from arceusd.worker.hf_tp_split import planner_tensor_parallel
from arceusd.worker.protocol import MemberConfig, ReplicaSyncConfig, StageConfig
from partitioner import (
    DeviceProfile,
    Link,
    LinkMatrix,
    Plan,
    PlanError,
    PlanInputs,
    PlanMismatch,
    ReplicaPlan,
    ReplicaSyncMode,
    TrainingParams,
    inputs_bytes,
    inputs_from_dict,
    plan,
    plan_bytes,
    plan_from_bytes,
    plan_replicas,
    replica_plan_bytes,
    replica_plan_from_bytes,
    verify,
    verify_replicas,
)
from partitioner.replicas import cut_alike
from partitioner.search import EXACT_MAX_DEVICES

DEFAULT_RTT_S = 1e-3
DEFAULT_BANDWIDTH = 100e6  # bytes/s, until links are measured


class PlanRefused(Exception):
    """A member refuses the leader's plan; the message says why."""


@dataclass(frozen=True)
class Offer:
    """What a member offers a job: its measured speed and the memory it lends, and the calibration its
    profile measured (``arceusd.device.profile.DeviceMeasurement``; defaults: uncalibrated)."""

    peer_id: str
    address: str
    flops_per_s: float
    memory_bytes: int
    kind: str = "cpu"
    block_efficiency: float = 1.0
    dispatch_s: float = 0.0
    adamw_s_per_param: float = 0.0
    sgd_s_per_param: float = 0.0
    message_s: float = 0.0

    def device_profile(self, optimizer: str) -> DeviceProfile:
        """The planner's view of this offer for a job trained with ``optimizer`` (``"adamw"`` or ``"sgd"``)."""
        per_param = {"adamw": self.adamw_s_per_param, "sgd": self.sgd_s_per_param}
        if optimizer not in per_param:
            raise ValueError(f"unknown optimizer {optimizer!r}; expected one of {sorted(per_param)}")
        return DeviceProfile(
            self.peer_id,
            self.flops_per_s,
            self.memory_bytes,
            self.kind,
            block_efficiency=self.block_efficiency,
            dispatch_s=self.dispatch_s,
            optimizer_s_per_param=per_param[optimizer],
        )

    def check(self) -> None:
        """Raise ``ValueError`` naming the field unless the planner can use this offer (an offer that came
        over the wire is checked before it is kept): the device profile's own checks for either optimizer, and
        every cost a finite number >= 0."""
        for name in ("dispatch_s", "adamw_s_per_param", "sgd_s_per_param", "message_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"offer of {self.peer_id[:12]}: {name} must be a finite number >= 0, got {value!r}")
        self.device_profile("adamw")
        self.device_profile("sgd")


def plan_inputs(
    spec: JobSpec,
    offers: list[Offer],
    rtt_s: dict[tuple[str, str], float],
    use_all_devices: bool = True,
    measured: Mapping[tuple[str, str], Link] | None = None,
) -> PlanInputs:
    """The planner's inputs: the spec's blocks, the offers' devices, and a link per pair: ``measured`` (round
    trip, bandwidth and per-message cost over the transport) where given, else the round trip from ``rtt_s``,
    :data:`DEFAULT_BANDWIDTH` and the mean of the two ends' per-message cost."""
    measured = measured or {}
    blocks = tuple(block_costs(spec.model, optimizer=spec.training.optimizer))
    devices = tuple(o.device_profile(spec.training.optimizer) for o in offers)
    message = {o.peer_id: o.message_s for o in offers}
    pairs = []
    ids = sorted(o.peer_id for o in offers)
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            link = measured.get((a, b)) or measured.get((b, a))
            if link is not None:
                pairs.append((a, b, link))
                continue
            rtt = rtt_s.get((a, b)) or rtt_s.get((b, a)) or DEFAULT_RTT_S
            # a message costs its sender and its receiver: the mean of the two ends' measured per-message cost
            pairs.append((a, b, Link(round(rtt, 6), DEFAULT_BANDWIDTH, (message[a] + message[b]) / 2)))
    tp = 4 if isinstance(spec.model, GPTConfig) else planner_tensor_parallel(spec.model)  # stock LMs: by KV heads
    training = TrainingParams(
        global_batch_size=spec.training.batch_size,
        micro_batch_counts=(spec.training.micro_batches,),
        max_tensor_parallel=tp,
        use_all_devices=use_all_devices,
    )
    return PlanInputs(blocks, devices, LinkMatrix.symmetric(pairs), training)


def make_plan(
    spec: JobSpec,
    offers: list[Offer],
    rtt_s: dict[tuple[str, str], float],
    measured: Mapping[tuple[str, str], Link] | None = None,
    include: str | None = None,
) -> tuple[PlanInputs, Plan]:
    """The plan over ``offers``: the fastest predicted one, so a device is in it only where the step is faster
    with it (or the model needs its memory); the members left out are spares. ``include`` (the leader, whose
    worker serves the data) is in every plan: when the fastest plan leaves it out, the fastest that gives it work
    (:func:`_fastest_with`). ``training.use_all_devices``: every member gets work if that fits, else the best plan
    over a subset (the plans before this rule).

    Error handling: :class:`partitioner.PlanError` (what is missing) when nothing fits.
    """
    if spec.training.use_all_devices:
        try:
            inputs = plan_inputs(spec, offers, rtt_s, use_all_devices=True, measured=measured)
            return inputs, plan(inputs)
        except PlanError:
            pass
    inputs = plan_inputs(spec, offers, rtt_s, use_all_devices=False, measured=measured)
    best = plan(inputs)
    if include is None or include in {p for stage in best.stages for p in stage.devices}:
        return inputs, best
    return _fastest_with(spec, offers, rtt_s, measured, include) or (inputs, best)


def _fastest_with(
    spec: JobSpec,
    offers: list[Offer],
    rtt_s: dict[tuple[str, str], float],
    measured: Mapping[tuple[str, str], Link] | None,
    include: str,
) -> tuple[PlanInputs, Plan] | None:
    """The fastest plan that gives ``include`` work: each group of offers with it (up to the partitioner's exact
    size; beyond it, all of them), each device of the group working; ties go to fewer devices. None when no
    group with it fits."""
    others = sorted((o for o in offers if o.peer_id != include), key=lambda o: o.peer_id)
    mine = [o for o in offers if o.peer_id == include]
    if not mine:
        return None
    if len(offers) > EXACT_MAX_DEVICES:
        groups: list[list[Offer]] = [offers]
    else:
        groups = [[*mine, *(o for i, o in enumerate(others) if mask >> i & 1)] for mask in range(1 << len(others))]
    found: tuple[PlanInputs, Plan] | None = None
    for group in groups:
        inputs = plan_inputs(spec, group, rtt_s, use_all_devices=True, measured=measured)
        try:
            candidate = plan(inputs)
        except PlanError:
            continue
        if found is None or _faster(candidate, found[1]):
            found = (inputs, candidate)
    return found


def _faster(a: Plan, b: Plan) -> bool:
    """Whether plan ``a`` beats ``b``: a faster predicted step, or as fast (1e-9 relative) on fewer devices."""
    ta, tb = a.predicted_step_time_s, b.predicted_step_time_s
    if abs(ta - tb) <= 1e-9 * max(ta, tb):
        return len(a.peer_ids) < len(b.peer_ids)
    return ta < tb


SYNC_MODES: dict[str, ReplicaSyncMode | None] = {
    "auto": None,
    "every_step": ReplicaSyncMode.ALLREDUCE,
    "diloco": ReplicaSyncMode.DILOCO,
}
"""The spec's ``training.sync`` as the planner's constraint (None: the planner chooses)."""


def make_replica_plan(
    spec: JobSpec,
    offers: list[Offer],
    rtt_s: dict[tuple[str, str], float],
    measured: Mapping[tuple[str, str], Link] | None = None,
    include: str | None = None,
) -> tuple[PlanInputs, ReplicaPlan]:
    """R data-parallel pipelines over ``offers`` as the spec asks (``training.replicas`` a number, or "auto":
    the most tokens/s predicted, never slower than the best single member that holds the model; a device that
    would slow the job is left out). DiLoCo's H is ``training.diloco.inner_steps``, at most the run's steps.
    ``include``: the device every candidate must use (the leader, who serves the data).

    Error handling: :class:`partitioner.PlanError` (what is missing) when nothing fits."""
    inputs = plan_inputs(spec, offers, rtt_s, use_all_devices=False, measured=measured)
    h, fixed, sync = _replica_choices(spec)
    return inputs, plan_replicas(inputs, h, replicas=fixed, sync=sync, include=include)


def _replica_choices(spec: JobSpec) -> tuple[int, int | None, ReplicaSyncMode | None]:
    """What the spec fixes for the replica planner: DiLoCo's H (at most the run's steps), R (None: "auto") and
    the sync mode (None: "auto"; every step for a model that trains a tied embedding); the leader plans and every
    member verifies with the same."""
    t = spec.training
    fixed = None if t.replicas == "auto" else int(t.replicas)
    sync = SYNC_MODES[t.sync]
    trains_tied = getattr(spec.model, "tied", False) and getattr(spec.model, "lora", None) is None
    if sync is None and trains_tied:  # a tied embedding's two copies must take the same steps
        sync = ReplicaSyncMode.ALLREDUCE  # (DiLoCo would average them on two rings: worker/tied.py)
    return max(1, min(t.diloco.inner_steps, t.steps)), fixed, sync


def one_pipeline(spec: JobSpec) -> bool:
    """Whether the spec keeps today's single pipeline (``training.replicas = 1``, the default)."""
    return spec.training.replicas == 1


def single(the_plan: Plan) -> ReplicaPlan:
    """One pipeline as a replica plan of one."""
    return ReplicaPlan((the_plan,), ReplicaSyncMode.NONE, 0.0, 1, the_plan.predicted_step_time_s)


def make_job_plan(
    spec: JobSpec,
    offers: list[Offer],
    rtt_s: dict[tuple[str, str], float],
    measured: Mapping[tuple[str, str], Link] | None = None,
    leader: str | None = None,
) -> tuple[PlanInputs, ReplicaPlan]:
    """The daemon's plan for a job: :func:`make_plan` for one pipeline, :func:`make_replica_plan` otherwise
    (with ``leader``, who serves the data, in every replica plan it considers).

    Error handling: :class:`partitioner.PlanError` (what is missing) when nothing fits."""
    if one_pipeline(spec):
        inputs, the_plan = make_plan(spec, offers, rtt_s, measured, include=leader)
        return inputs, single(the_plan)
    return make_replica_plan(spec, offers, rtt_s, measured, include=leader)


def encode_job_start(spec: JobSpec, inputs: PlanInputs, replica_plan: ReplicaPlan) -> tuple[bytes, bytes]:
    """The start's inputs and plan bytes: a one-pipeline spec sends the plan as before, others the replica plan."""
    if one_pipeline(spec):
        return encode_start(inputs, replica_plan.replicas[0])
    return inputs_bytes(inputs), replica_plan_bytes(replica_plan)


def verify_job_start(
    spec: JobSpec, inputs_data: bytes, plan_data: bytes, own: Offer, leader: str | None = None
) -> tuple[PlanInputs, ReplicaPlan]:
    """Member side of :func:`encode_job_start`: :func:`verify_start` for one pipeline; for replicas the same
    checks of the inputs, then the replica plan recomputed from them with the spec's choices and ``leader``
    (the sender of the start) as the device every plan must include."""
    if one_pipeline(spec):
        inputs, the_plan = verify_start(spec, inputs_data, plan_data, own)
        return inputs, single(the_plan)
    inputs, received = _replica_start(spec, inputs_data, plan_data, own)
    h, fixed, sync = _replica_choices(spec)
    try:
        verify_replicas(received, inputs, h, replicas=fixed, sync=sync, include=leader)
    except PlanMismatch as exc:
        raise PlanRefused(f"recomputing the replica plan gave a different result: {exc}") from None
    return inputs, received


def verify_grown_start(
    spec: JobSpec, inputs_data: bytes, plan_data: bytes, own: Offer, position: int
) -> tuple[PlanInputs, ReplicaPlan]:
    """A spare device's start in a dropped replica's place (:mod:`arceusd.jobs.leader.regrow`): the plan was the
    partitioner's with one replica moved onto spare devices, so it is checked, not recomputed: the inputs against
    the spec, every replica cut like the first, this device in replica ``position``, and the memory the plan
    predicts for it within its own offer."""
    if one_pipeline(spec):
        raise PlanRefused("a replica rebuilt for a job without replicas")
    inputs, received = _replica_start(spec, inputs_data, plan_data, own)
    replicas = received.replicas
    if not 0 <= position < len(replicas) or own.peer_id not in replicas[position].peer_ids:
        raise PlanRefused(f"this device has no place in replica {position} of the rebuilt plan")
    if not all(cut_alike(r, replicas[0]) for r in replicas):
        raise PlanRefused("the rebuilt plan's replicas are not cut alike")
    need = dict(replicas[position].memory_bytes).get(own.peer_id, 0)
    if need > own.device_profile(spec.training.optimizer).memory_bytes:
        raise PlanRefused(f"the plan needs {need} bytes on this device, more than it offered")
    return inputs, received


def _replica_start(spec: JobSpec, inputs_data: bytes, plan_data: bytes, own: Offer) -> tuple[PlanInputs, ReplicaPlan]:
    """A replica start's inputs and plan, decoded, the inputs checked against the spec and this device's offer."""
    try:
        inputs = inputs_from_dict(json.loads(inputs_data))
        received = replica_plan_from_bytes(plan_data)
    except (ValueError, KeyError, TypeError) as exc:
        raise PlanRefused(f"malformed replica plan or inputs: {exc}") from None
    _check_inputs(spec, inputs, own)
    return inputs, received


def plan_from_start(plan_data: bytes) -> ReplicaPlan:
    """The plan of a start's bytes (:func:`encode_job_start`): a replica plan, or one pipeline as a replica plan
    of one. Raises ``ValueError`` on anything malformed."""
    try:
        is_replicated = isinstance(d := json.loads(plan_data), dict) and "replica_plan" in d
    except ValueError as exc:
        raise ValueError(f"malformed plan bytes: {exc}") from None
    return replica_plan_from_bytes(plan_data) if is_replicated else single(plan_from_bytes(plan_data))


def replica_peers(replica_plan: ReplicaPlan, peer_id: str) -> tuple[int, Plan]:
    """The replica ``peer_id`` works in and that replica's pipeline; ``ValueError`` when it is in none."""
    index = replica_plan.replica_of(peer_id)
    if index is None:
        raise ValueError(f"peer {peer_id[:12]} is in no replica of the plan")
    return index, replica_plan.replicas[index]


def replica_flops_shares(replica_plan: ReplicaPlan, inputs: PlanInputs) -> dict[str, float]:
    """Each device's fraction of the job's training FLOPs: its share within its replica, over R replicas (each
    replica trains 1/R of the global batch)."""
    count = len(replica_plan.replicas)
    shares: dict[str, float] = {}
    for the_plan in replica_plan.replicas:
        for peer, share in flops_shares(the_plan, inputs).items():
            shares[peer] = shares.get(peer, 0.0) + share / count
    return shares


def worker_replicas(replica_plan: ReplicaPlan) -> tuple[tuple[StageConfig, ...], ...]:
    """Every replica's stages for ``WorkerConfig.replicas`` (empty for one pipeline)."""
    if len(replica_plan.replicas) == 1:
        return ()
    return tuple(worker_stages(p) for p in replica_plan.replicas)


def replica_sync_config(spec: JobSpec, replica_plan: ReplicaPlan) -> ReplicaSyncConfig | None:
    """``WorkerConfig.replica_sync`` for the plan (None for one pipeline)."""
    if len(replica_plan.replicas) == 1:
        return None
    d = spec.training.diloco
    codec = "raw" if d.compression == "none" else d.compression
    mode = "diloco" if replica_plan.sync_mode is ReplicaSyncMode.DILOCO else "allreduce"
    # the job's wire compression applies to the gradient all-reduce too (top-k has no ring form: exact there)
    compression = spec.training.compression
    grad_codec = compression if compression in ("fp16", "bf16", "int8") else "raw"
    return ReplicaSyncConfig(
        mode=mode,
        diloco_h=replica_plan.diloco_h,
        outer_lr=d.outer_lr,
        outer_momentum=d.outer_momentum,
        codec=codec,
        grad_codec=grad_codec,
    )


def estimated_links(leader: str, measured: Mapping[str, Link], members: Sequence[str]) -> dict[tuple[str, str], Link]:
    """Links for planning from what the leader measured to each member: its own links as measured, and for two
    members (which the leader cannot measure) the slower of their links to the leader (round trip and message
    cost the larger, bandwidth the smaller): on one LAN the leader's view of a member's link is a fair guess."""
    out: dict[tuple[str, str], Link] = {}
    for peer, link in measured.items():
        if peer in members and peer != leader:
            out[(leader, peer)] = link
    others = sorted(p for p in members if p != leader and p in measured)
    for i, a in enumerate(others):
        for b in others[i + 1 :]:
            la, lb = measured[a], measured[b]
            out[(a, b)] = Link(
                max(la.rtt_s, lb.rtt_s),
                min(la.bandwidth_bytes_per_s, lb.bandwidth_bytes_per_s),
                max(la.message_s, lb.message_s),
            )
    return out


def encode_start(inputs: PlanInputs, the_plan: Plan) -> tuple[bytes, bytes]:
    return inputs_bytes(inputs), plan_bytes(the_plan)


def verify_start(spec: JobSpec, inputs_data: bytes, plan_data: bytes, own: Offer) -> tuple[PlanInputs, Plan]:
    """Member side: check the leader's inputs against the spec and our own offer, then recompute the plan."""
    try:
        inputs = inputs_from_dict(json.loads(inputs_data))
        the_plan = plan_from_bytes(plan_data)
    except (ValueError, KeyError, TypeError) as exc:
        raise PlanRefused(f"malformed plan or inputs: {exc}") from None
    _check_inputs(spec, inputs, own)
    try:
        verify(the_plan, inputs)
    except PlanMismatch as exc:
        raise PlanRefused(f"recomputing the plan gave a different result: {exc}") from None
    return inputs, the_plan


def _check_inputs(spec: JobSpec, inputs: PlanInputs, own: Offer) -> None:
    """The leader's inputs against the spec (block costs, batch) and this device's own offer."""
    expected_blocks = tuple(block_costs(spec.model, optimizer=spec.training.optimizer))
    if inputs.blocks != expected_blocks:
        raise PlanRefused("the plan's block costs do not match the job spec's model")
    if inputs.training.global_batch_size != spec.training.batch_size:
        raise PlanRefused("the plan's batch size does not match the job spec")
    mine = [d for d in inputs.devices if d.peer_id == own.peer_id]
    if mine and not _states_offer(mine[0], own.device_profile(spec.training.optimizer)):
        raise PlanRefused("the plan misstates this device's offer (speed, memory or calibration)")


def _offer_facts(d: DeviceProfile) -> tuple[int, float, float, float]:
    """What a member checks about itself in the leader's inputs besides its speed (the kind does not enter the
    cost model)."""
    return d.memory_bytes, d.block_efficiency, d.dispatch_s, d.optimizer_s_per_param


def _states_offer(stated: DeviceProfile, own: DeviceProfile) -> bool:
    """Whether the leader's inputs state this device's offer: its memory and calibration as offered, its speed
    as offered or slower by at most :data:`arceusd.jobs.judging.claims.MAX_DISCOUNT` (the leader measured it slower:
    :func:`arceusd.jobs.judging.claims.discounted`), never faster."""
    speed_ok = own.flops_per_s / MAX_DISCOUNT * (1 - 1e-9) <= stated.flops_per_s <= own.flops_per_s
    return speed_ok and _offer_facts(stated) == _offer_facts(own)


def worker_stages(the_plan: Plan) -> tuple[StageConfig, ...]:
    """The plan's stages in the worker's terms (a tensor-parallel group's split from its first split block, the
    predicted seconds per micro-batch)."""
    stages = []
    for stage in the_plan.stages:
        members = []
        for share in stage.shares:
            heads = next((h for h in share.heads if h), 0) if len(stage.shares) > 1 else 0
            columns = next((c for c in share.mlp_columns if c), 0) if len(stage.shares) > 1 else 0
            members.append(MemberConfig(share.peer_id, heads, columns))
        stages.append(StageConfig(stage.start, stage.end, tuple(members), stage.time_s))
    return tuple(stages)


def flops_shares(the_plan: Plan, inputs: PlanInputs) -> dict[str, float]:
    """Each device's fraction of the model's training FLOPs under the plan (its share of the work)."""
    total = sum(b.forward_flops_per_sample + b.backward_flops_per_sample for b in inputs.blocks) or 1.0
    shares: dict[str, float] = {}
    for stage in the_plan.stages:
        for share in stage.shares:
            frac = 0.0
            for k, block in enumerate(inputs.blocks[stage.start : stage.end]):
                flops = block.forward_flops_per_sample + block.backward_flops_per_sample
                if len(stage.shares) == 1:
                    part = 1.0
                else:
                    parts = []
                    if block.heads:
                        parts.append(share.heads[k] / block.heads)
                    if block.mlp_columns:
                        parts.append(share.mlp_columns[k] / block.mlp_columns)
                    part = sum(parts) / len(parts) if parts else 1.0 / len(stage.shares)
                frac += flops * part
            shares[share.peer_id] = shares.get(share.peer_id, 0.0) + frac / total
    return shares


__all__ = [
    "Offer",
    "PlanError",
    "PlanRefused",
    "encode_job_start",
    "encode_start",
    "flops_shares",
    "make_job_plan",
    "make_plan",
    "make_replica_plan",
    "one_pipeline",
    "plan_from_start",
    "plan_inputs",
    "replica_flops_shares",
    "replica_peers",
    "replica_sync_config",
    "single",
    "verify_job_start",
    "verify_start",
    "worker_replicas",
    "worker_stages",
]
