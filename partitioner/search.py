"""The planner: dynamic programming over (block suffix, devices used) for each allowed micro-batch count.

For a fixed micro-batch count m the objective is the cost model's step time
(m-1) * max_s t_s + sum_s t_s + max_s u_s + sync (u_s: the stage's optimizer step; sync: the step's scalar
exchange over the first stage's head, added when a plan is complete: in exact mode every label of a state
shares its device set, and a complete label its root, so dominance stays exact). It is not additive, so each
DP state keeps a small Pareto set of labels (bottleneck M, sum S, stages k, slowest optimizer step U), k
capped at m because the 1F1B stash of a stage is ``in_flight_1f1b(stages from it to the end, m)`` micro-batches. The DP
runs backwards over block suffixes, so when a stage is prepended its stash count is known and memory is
checked exactly (a hard constraint). Labels are pruned against the best complete plan found so far (also
across micro-batch counts) with an admissible lower bound for the blocks still to place.

When no plan fits, the search runs again with capped 1F1B (``cost.py``: at most c micro-batches in flight on any
stage, for c from the most that can change anything down to 1: ``cost.in_flight_caps``) and takes the first c that
fits: a model larger than the devices' memory holds
with the pipeline's full warm-up still trains, more slowly, where the devices hold its weights and one
micro-batch's activations per stage.

Devices used, two modes:
- exact (n <= ``EXACT_MAX_DEVICES``): the state holds the *set* of devices used by the suffix and the head
  of its first stage; every subset (of size <= max_tensor_parallel) of the unused devices may form the next
  stage. This covers every order and every subset of devices, so it finds the optimum of the cost model (the
  tests check it against ``exhaustive.py``).
- chain (larger n): devices in the deterministic chain order of ``order.chain_order``; a stage is a run of
  consecutive devices in that order (a run of 2+ is a tensor-parallel group) and the stages use a contiguous
  window of the chain, so devices at either end may be left out.

Inputs are canonicalised (devices sorted by peer id) before search, every loop runs in a fixed order and
ties go to the smaller micro-batch count, then the first found in DP order, so permuted inputs give
identical plans."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import cast

from partitioner.cost import CostModel, GroupInfo, in_flight_caps
from partitioner.inputs import PlanInputs
from partitioner.order import chain_order
from partitioner.plan import Plan, PlanError

EXACT_MAX_DEVICES = 6
CHAIN_MAX_LABELS = 8
GIB = float(1 << 30)

# label: (bottleneck, sum, stages capped at m, slowest optimizer step, back)
# with back = (members, j0, j1, parent label) or None
_Label = tuple[float, float, int, float, object]
_Preds = Callable[[int], list[tuple[GroupInfo, int]]]


def _set_mode(cm: CostModel, max_tp: int) -> tuple[int, _Preds]:
    groups: list[tuple[GroupInfo, int]] = []
    for mask in range(1, 1 << cm.n):
        members = [i for i in range(cm.n) if mask >> i & 1]
        if len(members) > max_tp:
            continue
        g = cm.group(members)
        if g is not None:
            groups.append((g, mask))
    groups.sort(key=lambda t: (bin(t[1]).count("1"), t[1]))
    cache: dict[int, list[tuple[GroupInfo, int]]] = {}

    def preds(used: int) -> list[tuple[GroupInfo, int]]:
        if used not in cache:
            cache[used] = [(g, used | gm) for g, gm in groups if not gm & used]
        return cache[used]

    return 0, preds


def _chain_mode(cm: CostModel, max_tp: int) -> tuple[int, _Preds]:
    order = chain_order(cm)
    n = len(order)
    runs: dict[tuple[int, int], GroupInfo] = {}
    for a in range(n):
        for size in range(1, max_tp + 1):
            if a + size > n:
                break
            g = cm.group(order[a : a + size])
            if g is not None:
                runs[(a, size)] = g
    ending: dict[int, list[tuple[GroupInfo, int]]] = {e: [] for e in range(n + 1)}
    for (a, size), g in sorted(runs.items()):
        ending[a + size].append((g, a))
    everything = [(g, a) for (a, _size), g in sorted(runs.items())]
    terminal = n + 1  # "nothing placed yet": the last stage may end anywhere in the chain

    def preds(start: int) -> list[tuple[GroupInfo, int]]:
        return everything if start == terminal else ending[start]

    return terminal, preds


def _fit(static: float, stash: float, budget: int, cap: int) -> int:
    """Most in-flight micro-batches n (<= cap) with static + stash * n <= budget (``evaluate``'s check)."""
    if static + stash > budget:
        return 0
    if stash <= 0:
        return cap
    n = min(cap, max(1, int((budget - static) // stash)))
    bounded = 0
    while n > 1 and static + stash * n > budget and bounded < 4:
        n -= 1
        bounded += 1
    while n < cap and static + stash * (n + 1) <= budget and bounded < 8:
        n += 1
        bounded += 1
    return n


def _search_m(
    cm: CostModel,
    m: int,
    terminal: int,
    preds: _Preds,
    incumbent: float,
    best_speed: float,
    max_labels: int = 0,
    final_ctx: int | None = None,
    in_flight_cap: int = 0,
) -> tuple[float, _Label] | None:
    """Best (objective, label) for m micro-batches that beats ``incumbent``, or None.

    ``max_labels`` > 0 keeps at most that many labels per state (heuristic, fast); 0 keeps the Pareto set.
    ``final_ctx`` (set mode): only complete plans whose used-device mask equals it are accepted.
    ``in_flight_cap`` > 0: capped 1F1B (``cost.py``): every stage stashes at most that many micro-batches, and
    the pipeline takes at least ``ceil(m / cap)`` trips through the stages (still at least the uncapped
    objective, so the pruning bounds stay admissible).
    """
    trips = -(-m // in_flight_cap) if in_flight_cap > 0 else 0
    n_blocks = len(cm.blocks)
    b = cm.micro_batch_size(m)
    lb_rest = [cm.total_flops_pref[j] * b / best_speed for j in range(n_blocks + 1)]
    states: list[dict[tuple[int, int], list[_Label]]] = [{} for _ in range(n_blocks + 1)]
    states[n_blocks][(terminal, -1)] = [(0.0, 0.0, 0, 0.0, None)]
    best: tuple[float, _Label] | None = None
    inc = incumbent
    for j in range(n_blocks, 0, -1):
        for (ctx, head), labels in states[j].items():
            for g, nctx in preds(ctx):
                if head == -1:
                    bt = 0.0
                else:
                    maybe = cm.boundary_s(g.head, head, j, b)
                    if maybe is None:
                        continue
                    bt = maybe
                size = g.size
                budgets, speeds = g.budgets, g.speeds
                fpref, spref, stpref = g.flops_pref, g.static_pref, g.stash_pref
                dispatch = g.dispatch
                for j0 in range(j - 1, -1, -1):
                    if size > 1 and cm.tp_cap[j0] < size:
                        break
                    fit = m  # how many micro-batches of stash every member can hold (capped at m)
                    comp = 0.0
                    for k in range(size):
                        stash = (stpref[k][j] - stpref[k][j0]) * b
                        fit = _fit(spref[k][j] - spref[k][j0], stash, budgets[k], fit)
                        c = (fpref[k][j] - fpref[k][j0]) * b / speeds[k] + (j - j0) * dispatch[k]
                        if c > comp:
                            comp = c
                    if fit < 1:
                        break
                    t = comp + bt + (cm.allreduce_s(g, j0, j, b) if size > 1 else 0.0)
                    if m * t >= inc:
                        break
                    rest = lb_rest[j0]
                    opt = cm.optimizer_s(g, j0, j)
                    target = states[j0].setdefault((nctx, g.head), [])
                    for label in labels:
                        kk = label[2] + 1  # stages from this one to the end, capped at m
                        if kk > m:
                            kk = m
                        stash_n = kk + 1  # in_flight_1f1b(kk, m), inlined (hot loop)
                        if stash_n > m:
                            stash_n = m
                        if trips and stash_n > in_flight_cap:
                            stash_n = in_flight_cap
                        if stash_n > fit:
                            continue
                        big = label[0] if label[0] > t else t
                        total = label[1] + t
                        slowest = label[3] if label[3] > opt else opt
                        pipe = (m - 1) * big + total
                        if trips and trips * total > pipe:  # capped_pipeline_s, inlined
                            pipe = trips * total
                        val = pipe + slowest
                        if val + rest >= inc:
                            continue
                        dominated = False
                        for o in target:
                            if o[0] <= big and o[1] <= total and o[2] <= kk and o[3] <= slowest:
                                dominated = True
                                break
                        if dominated:
                            continue
                        new: _Label = (big, total, kk, slowest, (g.members, j0, j, label))
                        target[:] = [
                            o for o in target if not (big <= o[0] and total <= o[1] and kk <= o[2] and slowest <= o[3])
                        ]
                        target.append(new)
                        if max_labels and len(target) > max_labels:
                            # heuristic cap: keep the best objective so far (then fewer stages)
                            target.sort(key=lambda o: ((m - 1) * o[0] + o[1] + o[3], o[2]))
                            del target[max_labels:]
                        if j0 == 0 and (final_ctx is None or nctx == final_ctx):
                            sync = cm.sync_s(g.head, _members_of(new))
                            if sync is not None and val + sync < inc:
                                inc = val + sync
                                best = (val + sync, new)
        states[j] = {}  # free memory as we go
    return best


def _members_of(label: _Label) -> list[int]:
    """Every device of the (complete) plan ``label`` stands for."""
    return [d for members, _, _ in _stages_of(label) for d in members]


def _stages_of(label: _Label) -> list[tuple[tuple[int, ...], int, int]]:
    out: list[tuple[tuple[int, ...], int, int]] = []
    back = label[4]
    steps = 0
    while back is not None and steps < 1_000_000:
        members, j0, j1, parent = cast(tuple[tuple[int, ...], int, int, _Label], back)
        out.append((members, j0, j1))
        back = parent[4]
        steps += 1
    return out


def plan(inputs: PlanInputs, exact_max_devices: int = EXACT_MAX_DEVICES) -> Plan:
    """The best plan for ``inputs`` under the cost model (see ``cost.py``).

    Error handling: raises ``PlanError`` (message says what is missing: memory needed vs offered, the block
    that fits nowhere, unusable micro-batch counts) when no plan satisfies the constraints.
    """
    cm = CostModel(inputs)
    if cm.n == 0:
        raise PlanError("no devices to plan over: at least one member must offer a device")
    counts = cm.training.usable_micro_batch_counts()
    if not counts:
        raise PlanError(
            f"none of the allowed micro-batch counts {list(cm.training.micro_batch_counts)} divides the "
            f"global batch size {cm.training.global_batch_size}; allow a divisor of it"
        )
    any_tp = any(c >= 2 for c in cm.tp_cap)
    max_tp = min(cm.training.max_tensor_parallel, cm.n) if any_tp else 1
    exact = cm.n <= exact_max_devices
    terminal, preds = _set_mode(cm, max_tp) if exact else _chain_mode(cm, max_tp)
    cap = 0 if exact else CHAIN_MAX_LABELS
    final_ctx = (1 << cm.n) - 1 if exact and cm.training.use_all_devices else None
    fastest = sorted(cm.speeds, reverse=True)
    best_speed = sum(fastest[:max_tp])

    def best(in_flight_cap: int) -> Plan | None:
        best_plan: Plan | None = None
        # Largest micro-batch count first: it usually wins, so its plan gives a tight bound for the others.
        for m in sorted(counts, reverse=True):
            if in_flight_cap >= m:
                continue  # no stage holds more than m: the cap would change nothing
            bound = math.inf if best_plan is None else best_plan.predicted_step_time_s * (1 + 1e-9)
            # a quick pass with one label per state gives a good bound, then the full (or capped) pass
            search = partial(_search_m, cm, m, terminal, preds, final_ctx=final_ctx, in_flight_cap=in_flight_cap)
            quick = search(bound, best_speed, max_labels=1)
            if quick is not None:
                bound = min(bound, quick[0] * (1 + 1e-12))
            found = search(bound, best_speed, max_labels=cap) or quick
            if found is None:
                continue
            candidate = cm.evaluate(_stages_of(found[1]), m, in_flight_cap)
            if candidate is None:  # cannot happen: the DP checks the same constraints; guard against a bug loudly
                raise PlanError(f"internal error: DP produced an infeasible placement for m={m}")
            if best_plan is None or (candidate.predicted_step_time_s, m) <= (
                best_plan.predicted_step_time_s,
                best_plan.micro_batches,
            ):
                best_plan = candidate
        return best_plan

    # uncapped first; only a model that fits no such plan is planned with fewer micro-batches in flight, the
    # most that fits (the fewer, the slower: cost.py's capped 1F1B)
    for in_flight_cap in in_flight_caps(counts, cm.n):
        found_plan = best(in_flight_cap)
        if found_plan is not None:
            return found_plan
    raise PlanError(explain_infeasible(cm, max_tp))


def _size(n: float, digits: int = 1) -> str:
    """Bytes for a person: GiB from 1 GiB up, MiB below (a small model's needs do not read as "0.0 GiB")."""
    if n >= GIB:
        return f"{n / GIB:.{digits}f} GiB"
    return f"{n / (1 << 20):.{digits}f} MiB"


def explain_infeasible(cm: CostModel, max_tp: int) -> str:
    """Why nothing fits, in numbers: total memory needed vs offered, or the block that fits on no device."""
    counts = cm.training.usable_micro_batch_counts()
    b = cm.micro_batch_size(max(counts)) if counts else cm.training.global_batch_size
    offered = sum(cm.budgets)
    need = sum(2 * k.param_bytes + k.optimizer_bytes + k.stash_bytes_per_sample * b for k in cm.blocks)
    if need > offered:
        return (
            f"no plan fits in memory: the model needs {_size(need, 1)} (weights, gradients, optimizer "
            f"state and one micro-batch of {b} samples of stashed activations), the members offer "
            f"{_size(offered, 1)} in total; add members or memory, or allow more micro-batches"
        )
    top = sorted(cm.budgets, reverse=True)
    for j, blk in enumerate(cm.blocks):
        need_j = 2 * blk.param_bytes + blk.optimizer_bytes + blk.stash_bytes_per_sample * b
        width = min(max_tp, cm.tp_cap[j]) if cm.tp_cap[j] >= 2 else 1
        # tensor parallelism spreads a block roughly evenly; the best group offers about width x its smallest
        best_group = max(top[k] * (k + 1) for k in range(min(width, len(top))))
        if need_j > best_group:
            return (
                f"block {blk.name!r} (#{j}) fits on no device: it needs {_size(need_j, 2)}, the largest "
                f"device offers {_size(top[0], 2)}"
                + (f" and the best tensor-parallel group about {_size(best_group, 2)}" if width > 1 else "")
                + f"; the members offer {_size(offered, 1)} in total"
            )
    return (
        f"no plan fits: the model needs {_size(need, 2)} and the members offer {_size(offered, 2)} "
        f"in total, but no cut of the blocks into contiguous stages fits every device's memory over the "
        f"usable links (check that the link matrix connects the members with enough memory)"
    )
