"""Scaling out: R data-parallel replicas of an S-stage pipeline, and how the replicas keep in sync.

``plan_replicas(inputs)`` returns a ``ReplicaPlan``: R pipelines (each a ``Plan`` over its own devices, fed
global_batch / R samples per step), all cut at the same block boundaries with the same tensor-parallel shares
(stage s of every replica holds the same slice, so the same stage of all replicas forms one ring), and the sync
mode. R = 1 is today's ``Plan`` (``plan.replicas == (search.plan(...),)`` when that wins; its bytes are
unchanged).

Candidates, in a fixed order (deterministic: every member recomputes the leader's choice):
- today's plan over all devices (``search.plan``) and every single device alone (the floor the issue asks for:
  never slower than the best member that can hold the model);
- for k = 1..n of the fastest devices (effective FLOP/s, then peer id) and every R dividing k (and the global
  batch), the k devices dealt into R groups in snake order (0, 1, .., R-1, R-1, .., 0, ..: equal-sized,
  speed-balanced groups). Replica 0 is planned by ``search.plan`` on its group; replica r takes the same stages
  on its group's devices of the same speed rank (``CostModel.evaluate``; infeasible -> no candidate).
Sync cost per step, over the ring of the replicas' stage devices (stage rings run in parallel, the slowest
counts; each is 2 (R - 1) / R of the stage's fp32 parameters over the ring's slowest link, plus 2 (R - 1)
hops of rtt/2 + message cost):
- ``ALLREDUCE``: every step, after the slowest replica's step (no overlap counted: an upper bound);
- ``DILOCO``: once per ``h`` steps with int8 pseudo-gradients (1 + 4/256 bytes per value), amortised.
With ``use_all_devices`` only candidates that give every device work count (today's plan, and the groupings
of all n devices whose replicas use every member), and the single-device floor does not apply.
DiLoCo is not the same computation (its loss per token is a little worse), so it is chosen only when it is
predicted at least ``DILOCO_MIN_GAIN`` times faster than all-reduce.

The job spec may fix what ``"auto"`` leaves to this search (``training.replicas`` / ``training.sync``):
``replicas = R`` keeps only candidates of exactly R replicas (R = 1: today's plan, unchanged), ``sync`` keeps
only that mode for the replicated candidates. A fixed R is what the user asked for, so the single-device floor
does not apply to it; when no plan of R replicas fits the devices there are (one was lost or excluded) and the
replicas average gradients every step, fewer replicas are planned (the same global batch, the same weights)
rather than none. The winner has the least predicted step
time for the same global batch (= the most tokens/s); ties go to fewer replicas, then fewer devices, then the
earlier candidate.
"""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass, replace
from typing import Any

from partitioner.canonical import canonical_json, inputs_hash, plan_from_dict, plan_to_dict
from partitioner.cost import CostModel
from partitioner.inputs import DeviceProfile, PlanInputs
from partitioner.plan import Plan, PlanError, PlanMismatch
from partitioner.search import plan as plan_pipeline

DEFAULT_DILOCO_H = 50
DILOCO_MIN_GAIN = 1.5
INT8_BYTES_PER_VALUE = 1 + 4 / 256
FP32_BYTES = 4


class ReplicaSyncMode(enum.Enum):
    NONE = "none"
    ALLREDUCE = "allreduce"
    DILOCO = "diloco"


@dataclass(frozen=True)
class ReplicaPlan:
    """R pipelines with identical stage cuts and how they sync. ``predicted_step_time_s`` is per step of the
    whole global batch (the slowest replica plus the sync, amortised over ``diloco_h`` steps for DiLoCo)."""

    replicas: tuple[Plan, ...]
    sync_mode: ReplicaSyncMode
    sync_s: float
    """Seconds of one synchronisation (a step's all-reduce, or one DiLoCo outer exchange)."""
    diloco_h: int
    predicted_step_time_s: float

    @property
    def peer_ids(self) -> tuple[str, ...]:
        return tuple(p for r in self.replicas for p in r.peer_ids)

    def replica_of(self, peer_id: str) -> int | None:
        for i, r in enumerate(self.replicas):
            if peer_id in r.peer_ids:
                return i
        return None


def plan_replicas(
    inputs: PlanInputs,
    diloco_h: int = DEFAULT_DILOCO_H,
    *,
    replicas: int | None = None,
    sync: ReplicaSyncMode | None = None,
    include: str | None = None,
) -> ReplicaPlan:
    """The fastest predicted plan of R replicas x S stages (see the module docstring); ``replicas`` /
    ``sync``: the spec's fixed choices (None: ``"auto"``); ``include``: a device every candidate must use (the
    job's owner, who serves the data): the fastest devices are taken with it rather than without it.

    Error handling: raises ``PlanError`` when not even today's plan exists, or no plan of the fixed number of
    replicas fits (its message says why; with gradients averaged every step, fewer replicas are planned first:
    :func:`_fixed_or_fewer`)."""
    if diloco_h < 1:
        raise ValueError(f"diloco_h must be >= 1, got {diloco_h}")
    if replicas is not None and replicas < 1:
        raise ValueError(f"replicas must be >= 1 or None (auto), got {replicas}")
    if sync is ReplicaSyncMode.NONE:
        raise ValueError("sync must be ALLREDUCE, DILOCO or None (auto); NONE is what one pipeline gets")
    inputs = inputs.canonical()
    if replicas == 1:
        today = plan_pipeline(inputs)
        return ReplicaPlan((today,), ReplicaSyncMode.NONE, 0.0, diloco_h, today.predicted_step_time_s)
    if replicas is not None:
        return _fixed_or_fewer(inputs, replicas, diloco_h, sync, include)
    best: tuple[tuple[float, int, int], ReplicaPlan] | None = None

    def consider(candidate: ReplicaPlan | None) -> None:
        nonlocal best
        if candidate is None or (include is not None and include not in candidate.peer_ids):
            return
        key = (candidate.predicted_step_time_s * (1 + 1e-9), len(candidate.replicas), len(candidate.peer_ids))
        if best is None or key < best[0]:
            best = (key, candidate)

    error: PlanError | None = None
    try:
        consider(_single(plan_pipeline(inputs), diloco_h))
    except PlanError as exc:
        error = exc
    every = inputs.training.use_all_devices  # the job wants every device busy: only plans that use them all
    for d in () if every else inputs.devices:
        consider(_single(_try_plan(_subset(inputs, (d.peer_id,), inputs.training.global_batch_size)), diloco_h))
    ranked = sorted(inputs.devices, key=lambda d: (-d.effective_flops_per_s, d.peer_id))
    gb = inputs.training.global_batch_size
    for k in range(len(ranked) if every else 2, len(ranked) + 1):
        for r in range(2, k + 1):
            if k % r or gb % r:
                continue
            for groups in _groupings(ranked, k, include, r):
                candidate = _replicated(inputs, groups, diloco_h, sync)
                if candidate is None or not every or len(candidate.peer_ids) == k:
                    consider(candidate)
    if best is None:
        raise error or PlanError("no plan fits on any device or group of devices")
    return best[1]


def _fastest(ranked: list[DeviceProfile], k: int, include: str | None) -> list[str]:
    """The ``k`` fastest devices' ids in rank order, with ``include`` among them when given."""
    ids = [d.peer_id for d in ranked]
    if include is None or include in ids[:k] or include not in ids:
        return ids[:k]
    return [p for p in ids if p in ids[: k - 1] or p == include]


def _fixed_or_fewer(
    inputs: PlanInputs, r: int, h: int, sync: ReplicaSyncMode | None, include: str | None
) -> ReplicaPlan:
    """The fastest plan of the spec's ``r`` replicas; when none fits (a member was lost or excluded) and the
    replicas average their gradients every step, the fastest of fewer replicas, down to one pipeline: every
    replica count trains the same global batch to the same weights then, as a dropped replica already does (issue
    29: a settled witness dispute leaves the job on the devices it has, not paused). DiLoCo's result depends on
    the number of replicas: it keeps the spec's or none."""
    try:
        return _fixed(inputs, r, h, sync, include)
    except PlanError:
        if sync is not ReplicaSyncMode.ALLREDUCE:
            raise
    for fewer in range(r - 1, 1, -1):
        with contextlib.suppress(PlanError):
            return _fixed(inputs, fewer, h, sync, include)
    one = _single(_try_plan(inputs), h)
    if one is None or (include is not None and include not in one.peer_ids):
        return _fixed(inputs, r, h, sync, include)  # raises the fixed count's own PlanError
    return one


def _fixed(inputs: PlanInputs, r: int, h: int, sync: ReplicaSyncMode | None, include: str | None) -> ReplicaPlan:
    """The fastest plan of exactly ``r`` replicas (the spec fixed R)."""
    gb = inputs.training.global_batch_size
    if gb % r:
        raise PlanError(f"the global batch of {gb} does not split into {r} replicas")
    ranked = sorted(inputs.devices, key=lambda d: (-d.effective_flops_per_s, d.peer_id))
    if len(ranked) < r:
        raise PlanError(f"{r} replicas need at least {r} devices; {len(ranked)} offered")
    every = inputs.training.use_all_devices
    best: tuple[tuple[float, int], ReplicaPlan] | None = None
    for k in range(len(ranked) if every else r, len(ranked) + 1, 1):
        if k % r:
            continue
        for groups in _groupings(ranked, k, include, r):
            candidate = _replicated(inputs, groups, h, sync)
            if candidate is None or (every and len(candidate.peer_ids) != k):
                continue
            if include is not None and include not in candidate.peer_ids:
                continue
            key = (candidate.predicted_step_time_s * (1 + 1e-9), len(candidate.peer_ids))
            if best is None or key < best[0]:
                best = (key, candidate)
    if best is None:
        raise PlanError(
            f"no plan of {r} replicas fits these devices (each replica needs devices that can hold the model "
            "together, cut alike); lower training.replicas or set it to 'auto'"
        )
    return best[1]


def _single(p: Plan | None, h: int) -> ReplicaPlan | None:
    if p is None:
        return None
    return ReplicaPlan((p,), ReplicaSyncMode.NONE, 0.0, h, p.predicted_step_time_s)


def _try_plan(inputs: PlanInputs) -> Plan | None:
    try:
        return plan_pipeline(inputs)
    except PlanError:
        return None


def _subset(inputs: PlanInputs, peers: tuple[str, ...], batch: int) -> PlanInputs:
    keep = set(peers)
    return PlanInputs(
        blocks=inputs.blocks,
        devices=tuple(d for d in inputs.devices if d.peer_id in keep),
        links=type(inputs.links)(tuple(t for t in inputs.links.links if t[0] in keep and t[1] in keep)),
        training=replace(inputs.training, global_batch_size=batch, use_all_devices=False),
    )


def _groupings(ranked: list[DeviceProfile], k: int, include: str | None, r: int) -> list[list[tuple[str, ...]]]:
    """Ways to deal the ``k`` fastest devices (``include`` among them) into ``r`` replicas: dealt by speed (each
    replica as fast as the others), and dealt by memory (each replica gets its share of the large devices: two
    small devices in one replica may hold no cut of the model while a large and a small one would)."""
    chosen = _fastest(ranked, k, include)
    by_speed = _snake(chosen, r)
    memory = {d.peer_id: d.memory_bytes for d in ranked}
    by_memory = _snake(sorted(chosen, key=lambda p: (-memory[p], chosen.index(p))), r)
    return [by_speed] if by_memory == by_speed else [by_speed, by_memory]


def _snake(peers: list[str], r: int) -> list[tuple[str, ...]]:
    groups: list[list[str]] = [[] for _ in range(r)]
    for i, p in enumerate(peers):
        lap, pos = divmod(i, r)
        groups[pos if lap % 2 == 0 else r - 1 - pos].append(p)
    return [tuple(g) for g in groups]


def _replicated(
    inputs: PlanInputs, groups: list[tuple[str, ...]], h: int, sync: ReplicaSyncMode | None = None
) -> ReplicaPlan | None:
    r = len(groups)
    batch = inputs.training.global_batch_size // r
    first = _try_plan(_subset(inputs, groups[0], batch))
    if first is None:
        return None
    plans = [first]
    for g in groups[1:]:
        sub = _subset(inputs, g, batch)
        cm = CostModel(sub)
        index = {d.peer_id: i for i, d in enumerate(sub.devices)}
        rank_of = {p: i for i, p in enumerate(groups[0])}
        stages = [(tuple(index[g[rank_of[p]]] for p in s.devices), s.start, s.end) for s in first.stages]
        other = cm.evaluate(stages, first.micro_batches, first.in_flight_cap)  # every replica runs one schedule
        if other is None or not _same_slices(first, other):
            return None
        plans.append(other)
    ring = _ring_s(inputs, plans)
    if ring is None:
        return None
    slowest = max(p.predicted_step_time_s for p in plans)
    allreduce = ReplicaPlan(tuple(plans), ReplicaSyncMode.ALLREDUCE, ring, h, slowest + ring)
    diloco_sync = ring * INT8_BYTES_PER_VALUE / FP32_BYTES
    diloco = ReplicaPlan(tuple(plans), ReplicaSyncMode.DILOCO, diloco_sync, h, slowest + diloco_sync / h)
    if sync is not None:
        return diloco if sync is ReplicaSyncMode.DILOCO else allreduce
    if diloco.predicted_step_time_s * DILOCO_MIN_GAIN <= allreduce.predicted_step_time_s:
        return diloco
    return allreduce


def _same_slices(a: Plan, b: Plan) -> bool:
    """Stage s of both plans holds the same blocks split the same way (same parameter shapes on each rank)."""
    if len(a.stages) != len(b.stages):
        return False
    for sa, sb in zip(a.stages, b.stages, strict=True):
        if (sa.start, sa.end) != (sb.start, sb.end) or len(sa.shares) != len(sb.shares):
            return False
        for x, y in zip(sa.shares, sb.shares, strict=True):
            if (x.heads, x.mlp_columns) != (y.heads, y.mlp_columns):
                return False
    return True


def _ring_s(inputs: PlanInputs, plans: list[Plan]) -> float | None:
    """One all-reduce of every stage's fp32 parameters over the rings of its ranks (parallel; the slowest
    counts); None when a ring lacks a link."""
    links = inputs.links.as_dict()
    r = len(plans)
    worst = 0.0
    for s, stage in enumerate(plans[0].stages):
        params = sum(b.param_bytes for b in inputs.blocks[stage.start : stage.end])
        values = params / inputs.training.compute_bytes_per_element
        for rank in range(len(stage.devices)):
            ring = [p.stages[s].devices[rank] for p in plans]
            slowest_bw, hop = float("inf"), 0.0
            for i in range(r):
                link = links.get((ring[i], ring[(i + 1) % r]))
                if link is None:
                    return None
                slowest_bw = min(slowest_bw, link.bandwidth_bytes_per_s)
                hop = max(hop, link.rtt_s / 2 + link.message_s)
            share = values / len(stage.devices)
            t = 2 * (r - 1) / r * share * FP32_BYTES / slowest_bw + 2 * (r - 1) * hop
            worst = max(worst, t)
    return worst


REPLICA_PLAN_FORMAT = 1
MAX_WIRE_REPLICAS = 64
"""A received replica plan with more pipelines than this is refused before anything else is read."""


def replica_plan_to_dict(rp: ReplicaPlan) -> dict[str, Any]:
    return {
        "replica_plan": REPLICA_PLAN_FORMAT,
        "replicas": [plan_to_dict(p) for p in rp.replicas],
        "sync_mode": rp.sync_mode.value,
        "sync_s": rp.sync_s,
        "diloco_h": rp.diloco_h,
        "predicted_step_time_s": rp.predicted_step_time_s,
    }


def replica_plan_bytes(rp: ReplicaPlan) -> bytes:
    """Canonical bytes of a replica plan (every member recomputes the same bytes from the same inputs)."""
    return canonical_json(replica_plan_to_dict(rp))


def replica_plan_from_bytes(data: bytes) -> ReplicaPlan:
    """Decode :func:`replica_plan_bytes` output. Raises ``ValueError`` on anything malformed."""
    try:
        d = json.loads(data)
        if not isinstance(d, dict) or d.get("replica_plan") != REPLICA_PLAN_FORMAT:
            raise ValueError(f"not a replica plan of format {REPLICA_PLAN_FORMAT}")
        replicas = d["replicas"]
        if not isinstance(replicas, list) or not 1 <= len(replicas) <= MAX_WIRE_REPLICAS:
            raise ValueError(f"replicas: 1..{MAX_WIRE_REPLICAS} pipelines expected")
        return ReplicaPlan(
            tuple(plan_from_dict(p) for p in replicas),
            ReplicaSyncMode(d["sync_mode"]),
            float(d["sync_s"]),
            int(d["diloco_h"]),
            float(d["predicted_step_time_s"]),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed replica plan bytes: {exc!r}") from exc


def verify_replicas(
    received: ReplicaPlan,
    inputs: PlanInputs,
    diloco_h: int,
    *,
    replicas: int | None = None,
    sync: ReplicaSyncMode | None = None,
    include: str | None = None,
) -> None:
    """Return None if ``received`` is exactly what :func:`plan_replicas` gives for these inputs and the spec's
    choices; else raise ``PlanMismatch`` (refuse the plan)."""
    try:
        ours = plan_replicas(inputs, diloco_h, replicas=replicas, sync=sync, include=include)
    except (PlanError, ValueError) as exc:
        raise PlanMismatch(f"these inputs admit no replica plan ({exc}), yet one was received") from exc
    if replica_plan_bytes(received) != replica_plan_bytes(ours):
        got, want = len(received.replicas), len(ours.replicas)
        raise PlanMismatch(
            f"the replica plan differs from the recomputed one ({got} replica(s) received, {want} recomputed; "
            f"inputs {inputs_hash(inputs)[:16]}...)"
        )


def with_devices(plan: Plan, devices: tuple[str, ...]) -> Plan:
    """``plan`` on other devices, cut alike: ``devices`` take the places of ``plan.peer_ids`` in order (a dropped
    replica rebuilt on spare devices). ``ValueError`` for a different count or a device named twice."""
    old = plan.peer_ids
    if len(devices) != len(old) or len(set(devices)) != len(devices):
        raise ValueError(f"{len(old)} distinct devices replace a pipeline of {len(old)}, got {len(devices)}")
    to = dict(zip(old, devices, strict=True))
    stages = tuple(
        replace(
            st,
            devices=tuple(to[d] for d in st.devices),
            shares=tuple(replace(sh, peer_id=to[sh.peer_id]) for sh in st.shares),
        )
        for st in plan.stages
    )
    return replace(plan, stages=stages, memory_bytes=tuple(sorted((to.get(p, p), b) for p, b in plan.memory_bytes)))


def cut_alike(a: Plan, b: Plan) -> bool:
    """Whether two pipelines hold the same blocks in each stage with the same shares (whatever their devices)."""

    def cuts(p: Plan) -> list[tuple[int, int, int, list[tuple[tuple[int, ...], tuple[int, ...]]]]]:
        return [(s.index, s.start, s.end, [(sh.heads, sh.mlp_columns) for sh in s.shares]) for s in p.stages]

    return cuts(a) == cuts(b) and (a.micro_batches, a.schedule) == (b.micro_batches, b.schedule)
