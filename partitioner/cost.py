"""The one cost model every planner here uses (the DP, the exhaustive search and the baselines).

Each device i has an effective speed v_i = flops_per_s x block_efficiency (what the model's own blocks reach,
measured against the matmul benchmark), a dispatch cost d_i per block per micro-batch (forward + backward)
and an optimizer cost o_i per parameter; each link a fixed cost per message on top of rtt/2 + bytes/bw.
Uncalibrated profiles have efficiency 1 and zero costs, which is the model as it was before calibration.

Per micro-batch of ``b`` samples, a stage on group G over blocks [j0, j1) takes
  compute   = max over members i of  sum_j f_i(j) * (fwd_j + bwd_j) * b / v_i  +  (j1 - j0) * d_i
  allreduce = (tensor-parallel groups only) per sub-layer (attention, MLP) one all-reduce forward and one
              backward of the sub-layer output, over the group's worst link:
              (g-1) * rtt + 2 (g-1)/g * bytes / bandwidth + 2 (g-1) * message cost each (in the compute dtype;
              the worker's all-reduce is a star over the group's rank 0, which handles 2 (g-1) messages)
  transfer  = boundary to the next stage, head to head: activation forward (rtt/2 + bytes/bw + message cost
              over a->b) and its gradient backward (over b->a); wire bytes = activation bytes * wire/compute
where f_i(j) is member i's share of block j (its heads and MLP columns, averaged; 1 for a single device).
Stage time t_s = compute + allreduce + transfer; the stage's optimizer time u_s = max over members i of
(parameters it holds) * o_i (parameters = param bytes / compute bytes per element).

Step time = (m - 1) * max_s t_s + sum_s t_s + max_s u_s + sync. The first two terms are the pipeline as the
worker runs it (``arceusd/worker/schedule.py``): the first micro-batch passes through every stage once (fill
and drain), after which the bottleneck stage paces it; for GPipe this is the exact makespan of the forward and
backward passes when one stage is the bottleneck of both (backward = 2 x forward per block, so it is); for
1F1B it is an upper bound (1F1B overlaps a stage's fill with later stages' work; simulated, it is never
slower and at most ~20 % faster on uneven stages). Then every schedule ends with one ``OptimizerStep``: one
scalar exchange for the global gradient norm and the loss together (the worker's ``allreduce_scalars``, a
star over the first stage's head: every other worker sends its values and gets the sums back), then every
stage's optimizer step at once (the slowest counts; an upper bound, since a later stage's step may overlap
the first stage's next forwards). sync = the worst round trip from a worker to the head and back (rtt/2 +
message cost each way); none with a single worker.

Memory (hard) per member: f_i * (2 * params + optimizer) [weights + gradients + optimizer state] plus
f_i * stash * b * (in-flight micro-batches): GPipe keeps all m, 1F1B keeps ``in_flight_1f1b(S - s, m)`` on stage
s (the worker's 1F1B runs one look-ahead forward on every stage but the last: min(S - s + 1, m); the last
stage defers the weights' gradients of its last 2 micro-batches: min(2, m), 1 for a lone stage, counted as 2;
``tests/unit/test_schedule.py`` checks this against the worker's schedules). GPipe is
chosen when it fits (simpler, same predicted time here), else 1F1B, else the placement is infeasible.

Capped 1F1B (only when no plan fits otherwise: ``search.plan``): every stage keeps at most ``c`` micro-batches
in flight (``Plan.in_flight_cap``; the worker's warm-up is cut to ``c - 1`` forwards and no backward defers its
weights), so a stage's stash is ``min(in_flight_1f1b(S - s, m), c)``. It costs time: stage s cannot start
micro-batch i + c before micro-batch i came back through every later stage, so the first stage, which waits
on the whole chain, runs at most c micro-batches per ``sum_s t_s``: the pipeline takes at least
``ceil(m / c) * sum_s t_s`` (exact for c = 1, every micro-batch alone through the chain and back; below the
uncapped figure once c reaches the number of stages), and the step is the larger of the two plus the optimizer
and the sync. A capped plan trains the same values as the uncapped one: the same forwards and backwards in the
same micro-batch order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from partitioner.canonical import inputs_hash
from partitioner.inputs import PlanInputs
from partitioner.plan import DeviceShare, Plan, Stage
from partitioner.splits import proportional_split

INF = math.inf


def capped_pipeline_s(m: int, cap: int, times: Sequence[float], uncapped: float) -> float:
    """The forward and backward passes of a step whose stages keep at most ``cap`` micro-batches in flight (0:
    no cap): the uncapped figure, or ``ceil(m / cap)`` trips through every stage when that is longer."""
    if cap <= 0:
        return uncapped
    trips = -(-m // cap)
    return max(uncapped, trips * sum(times))


def in_flight_caps(counts: Sequence[int], devices: int) -> tuple[int, ...]:
    """The caps on micro-batches in flight a planner tries, in order: none (0) first, then from the most that can
    change anything down to 1. Below the largest micro-batch count, and at most ``devices``: a stage of a plan
    over n devices holds at most n + 1 (its look-ahead), so a larger cap changes nothing."""
    return (0, *range(min(max(counts, default=1) - 1, devices), 0, -1))


def in_flight_1f1b(stages_to_end: int, m: int) -> int:
    """Micro-batches a stage stashes in the worker's 1F1B, given how many stages there are from it to the last
    (itself included): ``min(k + 1, m)`` for every stage but the last (its look-ahead forward), ``min(2, m)`` for
    the last (two micro-batches deferring their weights' gradients; a lone stage defers none and holds 1, but
    the planner does not know yet whether the last stage is also the first)."""
    return min(stages_to_end + 1, m)


class GroupInfo:
    """Precomputed facts about a device group (one device, or a tensor-parallel group)."""

    __slots__ = (
        "ar_bw",
        "ar_msg",
        "ar_rtt",
        "budgets",
        "dispatch",
        "flops_pref",
        "head",
        "members",
        "opt_per_param",
        "params_pref",
        "shares",
        "size",
        "speed_sum",
        "speeds",
        "stash_pref",
        "static_pref",
    )

    def __init__(
        self, cm: CostModel, members: tuple[int, ...], ar_rtt: float, ar_bw: float, ar_msg: float = 0.0
    ) -> None:
        self.members = members
        self.head = members[0]
        self.size = len(members)
        self.speeds = tuple(cm.speeds[i] for i in members)
        self.speed_sum = sum(self.speeds)
        self.budgets = tuple(cm.budgets[i] for i in members)
        self.ar_rtt = ar_rtt
        self.ar_bw = ar_bw
        self.ar_msg = ar_msg
        self.dispatch = tuple(cm.dispatch[i] for i in members)
        self.opt_per_param = tuple(cm.opt_per_param[i] for i in members)
        keys = tuple(cm.ids[i] for i in members)
        n_blocks = len(cm.blocks)
        shares: list[list[tuple[int, int]]] = [[] for _ in members]
        fracs: list[list[float]] = [[] for _ in members]
        for blk in cm.blocks:
            if self.size == 1:
                shares[0].append((blk.heads, blk.mlp_columns))
                fracs[0].append(1.0)
                continue
            hs = proportional_split(blk.heads, self.speeds, keys) if blk.heads >= self.size else (0,) * self.size
            cs = (
                proportional_split(blk.mlp_columns, self.speeds, keys)
                if blk.mlp_columns >= self.size
                else (0,) * self.size
            )
            for k in range(self.size):
                parts = []
                if blk.heads >= self.size:
                    parts.append(hs[k] / blk.heads)
                if blk.mlp_columns >= self.size:
                    parts.append(cs[k] / blk.mlp_columns)
                fracs[k].append(sum(parts) / len(parts) if parts else 1.0 / self.size)
                shares[k].append((hs[k], cs[k]))
        self.shares = shares
        self.flops_pref: list[list[float]] = []
        self.static_pref: list[list[float]] = []
        self.stash_pref: list[list[float]] = []
        self.params_pref: list[list[float]] = []
        per_element = cm.training.compute_bytes_per_element
        for k in range(self.size):
            fp, sp, st, pp = [0.0], [0.0], [0.0], [0.0]
            for j in range(n_blocks):
                blk, f = cm.blocks[j], fracs[k][j]
                fp.append(fp[-1] + f * (blk.forward_flops_per_sample + blk.backward_flops_per_sample))
                sp.append(sp[-1] + f * (2 * blk.param_bytes + blk.optimizer_bytes))
                st.append(st[-1] + f * blk.stash_bytes_per_sample)
                pp.append(pp[-1] + f * blk.param_bytes / per_element)
            self.flops_pref.append(fp)
            self.static_pref.append(sp)
            self.stash_pref.append(st)
            self.params_pref.append(pp)


class CostModel:
    """Cost model over canonical inputs. Devices are referred to by index into ``ids`` (sorted peer ids)."""

    def __init__(self, inputs: PlanInputs) -> None:
        c = inputs.canonical()
        self.inputs = c
        self.blocks = c.blocks
        self.ids = tuple(d.peer_id for d in c.devices)
        self.index = {p: i for i, p in enumerate(self.ids)}
        # effective speeds: what the model's blocks reach (the benchmark's FLOP/s x the measured efficiency)
        self.speeds = tuple(float(d.effective_flops_per_s) for d in c.devices)
        self.dispatch = tuple(float(d.dispatch_s) for d in c.devices)
        self.opt_per_param = tuple(float(d.optimizer_s_per_param) for d in c.devices)
        self.budgets = tuple(d.memory_bytes for d in c.devices)
        self.n = len(self.ids)
        self.training = c.training
        self.wire_ratio = c.training.wire_bytes_per_element / c.training.compute_bytes_per_element
        # (rtt, bandwidth, fixed cost per message) by (source, destination) index
        self.links: dict[tuple[int, int], tuple[float, float, float]] = {}
        for src, dst, lk in c.links.links:
            self.links[(self.index[src], self.index[dst])] = (lk.rtt_s, lk.bandwidth_bytes_per_s, lk.message_s)
        # tensor-parallel capacity of each block: the most devices it can be split over (0: not splittable)
        self.tp_cap = tuple(
            min(x for x in (b.heads, b.mlp_columns) if x > 0) if (b.heads or b.mlp_columns) else 0 for b in self.blocks
        )
        nsub_pref, nsub_act_pref, flops_pref = [0], [0.0], [0.0]
        for b in self.blocks:
            nsub = (b.heads > 0) + (b.mlp_columns > 0)
            nsub_pref.append(nsub_pref[-1] + nsub)
            nsub_act_pref.append(nsub_act_pref[-1] + nsub * b.activation_bytes_per_sample)
            flops_pref.append(flops_pref[-1] + b.forward_flops_per_sample + b.backward_flops_per_sample)
        self.nsub_pref = nsub_pref
        self.nsub_act_pref = nsub_act_pref
        self.total_flops_pref = flops_pref
        self._groups: dict[tuple[int, ...], GroupInfo | None] = {}
        self._inputs_hash: str | None = None

    # --- groups -------------------------------------------------------------------------------------------
    def order_members(self, members: Sequence[int]) -> tuple[int, ...]:
        """Head first: fastest device, ties by peer id; the rest in the same order."""
        return tuple(sorted(set(members), key=lambda i: (-self.speeds[i], self.ids[i])))

    def group(self, members: Sequence[int]) -> GroupInfo | None:
        """Group facts, or None when a tensor-parallel group lacks a link between two of its members."""
        key = self.order_members(members)
        if key in self._groups:
            return self._groups[key]
        info: GroupInfo | None
        if len(key) == 1:
            info = GroupInfo(self, key, 0.0, INF)
        else:
            worst_rtt, worst_bw, worst_msg = 0.0, INF, 0.0
            usable = True
            for a in key:
                for b in key:
                    if a == b:
                        continue
                    lk = self.links.get((a, b))
                    if lk is None:
                        usable = False
                        break
                    worst_rtt, worst_bw = max(worst_rtt, lk[0]), min(worst_bw, lk[1])
                    worst_msg = max(worst_msg, lk[2])
                if not usable:
                    break
            info = GroupInfo(self, key, worst_rtt, worst_bw, worst_msg) if usable else None
        self._groups[key] = info
        return info

    # --- costs --------------------------------------------------------------------------------------------
    def micro_batch_size(self, m: int) -> int:
        return self.training.global_batch_size // m

    def range_splittable(self, size: int, j0: int, j1: int) -> bool:
        return size == 1 or all(self.tp_cap[j] >= size for j in range(j0, j1))

    def compute_s(self, g: GroupInfo, j0: int, j1: int, b: int) -> float:
        return max(
            (g.flops_pref[k][j1] - g.flops_pref[k][j0]) * b / g.speeds[k] + (j1 - j0) * g.dispatch[k]
            for k in range(g.size)
        )

    def optimizer_s(self, g: GroupInfo, j0: int, j1: int) -> float:
        """The stage's optimizer step (once per step): its slowest member's parameters x seconds/parameter."""
        return max((g.params_pref[k][j1] - g.params_pref[k][j0]) * g.opt_per_param[k] for k in range(g.size))

    def allreduce_s(self, g: GroupInfo, j0: int, j1: int, b: int) -> float:
        if g.size == 1:
            return 0.0
        count = self.nsub_pref[j1] - self.nsub_pref[j0]
        nbytes = (self.nsub_act_pref[j1] - self.nsub_act_pref[j0]) * b
        s = g.size
        return 2 * count * (s - 1) * (g.ar_rtt + 2 * g.ar_msg) + 4 * (s - 1) / s * nbytes / g.ar_bw

    def boundary_s(self, a: int, c: int, j1: int, b: int) -> float | None:
        """Activation a->c after block j1-1 plus its gradient c->a; None if either direction is missing."""
        fwd, bwd = self.links.get((a, c)), self.links.get((c, a))
        if fwd is None or bwd is None:
            return None
        nbytes = self.blocks[j1 - 1].activation_bytes_per_sample * b * self.wire_ratio
        return fwd[0] / 2 + nbytes / fwd[1] + fwd[2] + bwd[0] / 2 + nbytes / bwd[1] + bwd[2]

    def sync_s(self, root: int, members: Sequence[int]) -> float | None:
        """The step's scalar exchange (gradient norm and loss), a star over ``root`` (stage 0's head): every
        other worker sends its values and gets the sums back; None when a worker has no link to or from the
        root."""
        worst = 0.0
        for d in members:
            if d == root:
                continue
            up, down = self.links.get((d, root)), self.links.get((root, d))
            if up is None or down is None:
                return None
            worst = max(worst, up[0] / 2 + up[2] + down[0] / 2 + down[2])
        return worst

    def static_bytes(self, g: GroupInfo, k: int, j0: int, j1: int) -> float:
        return g.static_pref[k][j1] - g.static_pref[k][j0]

    def stash_bytes(self, g: GroupInfo, k: int, j0: int, j1: int, b: int) -> float:
        return (g.stash_pref[k][j1] - g.stash_pref[k][j0]) * b

    def fits(self, g: GroupInfo, j0: int, j1: int, b: int, in_flight: int) -> bool:
        return all(
            self.static_bytes(g, k, j0, j1) + self.stash_bytes(g, k, j0, j1, b) * in_flight <= g.budgets[k]
            for k in range(g.size)
        )

    def hash(self) -> str:
        if self._inputs_hash is None:
            self._inputs_hash = inputs_hash(self.inputs)
        return self._inputs_hash

    # --- whole plans --------------------------------------------------------------------------------------
    def evaluate(self, stages: Sequence[tuple[Sequence[int], int, int]], m: int, in_flight_cap: int = 0) -> Plan | None:
        """Build the plan for ``stages`` = [(device indices, start, end), ...] and ``m`` micro-batches; with
        ``in_flight_cap`` > 0, capped 1F1B (module docstring).

        Returns None when the placement is infeasible (memory, missing link, unsplittable block, batch not
        divisible by m). Raises ``ValueError`` when the stages do not cover the blocks contiguously or reuse a
        device (a caller bug).
        """
        n_blocks = len(self.blocks)
        if not stages:
            raise ValueError("a plan needs at least one stage")
        pos, used = 0, set[int]()
        for members, j0, j1 in stages:
            if j0 != pos or j1 <= j0:
                raise ValueError(f"stages must cover blocks contiguously; got [{j0}, {j1}) at block {pos}")
            if used & set(members) or not members:
                raise ValueError("each stage needs its own non-empty set of devices")
            used |= set(members)
            pos = j1
        if pos != n_blocks:
            raise ValueError(f"stages cover {pos} of {n_blocks} blocks")
        if m <= 0 or self.training.global_batch_size % m:
            return None
        b = self.micro_batch_size(m)
        groups: list[GroupInfo] = []
        for members, j0, j1 in stages:
            g = self.group(members)
            if g is None or not self.range_splittable(g.size, j0, j1):
                return None
            groups.append(g)
        n_stages = len(stages)
        parts: list[tuple[float, float, float]] = []
        optimizer = [self.optimizer_s(g, j0, j1) for g, (_, j0, j1) in zip(groups, stages, strict=True)]
        for s, (g, (_, j0, j1)) in enumerate(zip(groups, stages, strict=True)):
            transfer = 0.0
            if s + 1 < n_stages:
                bt = self.boundary_s(g.head, groups[s + 1].head, j1, b)
                if bt is None:
                    return None
                transfer = bt
            parts.append((self.compute_s(g, j0, j1, b), self.allreduce_s(g, j0, j1, b), transfer))
        times = [c + a + t for c, a, t in parts]
        schedule = "gpipe"
        in_flight = [m] * n_stages
        if in_flight_cap > 0 or not all(
            self.fits(g, j0, j1, b, m) for g, (_, j0, j1) in zip(groups, stages, strict=True)
        ):
            schedule = "1f1b"
            in_flight = [in_flight_1f1b(n_stages - s, m) for s in range(n_stages)]
            if in_flight_cap > 0:
                in_flight = [min(n, in_flight_cap) for n in in_flight]
            if not all(
                self.fits(g, j0, j1, b, in_flight[s])
                for s, (g, (_, j0, j1)) in enumerate(zip(groups, stages, strict=True))
            ):
                return None
        sync = self.sync_s(groups[0].head, [d for g in groups for d in g.members])
        if sync is None:
            return None
        pipeline = capped_pipeline_s(m, in_flight_cap, times, (m - 1) * max(times) + sum(times))
        step = pipeline + max(optimizer) + sync
        bubble = 1.0 - (m * sum(times)) / (n_stages * pipeline) if pipeline > 0 else 0.0
        out_stages: list[Stage] = []
        memory: dict[str, int] = {}
        for s, (g, (_, j0, j1)) in enumerate(zip(groups, stages, strict=True)):
            shares = tuple(
                DeviceShare(
                    self.ids[dev],
                    tuple(g.shares[k][j][0] for j in range(j0, j1)),
                    tuple(g.shares[k][j][1] for j in range(j0, j1)),
                )
                for k, dev in enumerate(g.members)
            )
            for k, dev in enumerate(g.members):
                need = self.static_bytes(g, k, j0, j1) + self.stash_bytes(g, k, j0, j1, b) * in_flight[s]
                memory[self.ids[dev]] = math.ceil(need)
            c, a, t = parts[s]
            out_stages.append(
                Stage(
                    index=s,
                    start=j0,
                    end=j1,
                    devices=tuple(self.ids[d] for d in g.members),
                    shares=shares,
                    compute_s=c,
                    allreduce_s=a,
                    transfer_s=t,
                    time_s=times[s],
                    stash_micro_batches=in_flight[s],
                    optimizer_s=optimizer[s],
                )
            )
        return Plan(
            stages=tuple(out_stages),
            micro_batches=m,
            micro_batch_size=b,
            schedule=schedule,
            predicted_step_time_s=step,
            bubble_fraction=max(0.0, bubble),
            memory_bytes=tuple(sorted(memory.items())),
            inputs_hash=self.hash(),
            sync_s=sync,
            in_flight_cap=in_flight_cap,
        )
