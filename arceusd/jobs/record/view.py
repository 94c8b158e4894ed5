"""Text rendering of job summaries for the CLI (``arceusd jobs``, ``arceusd status JOB``)."""

from __future__ import annotations

import math
import textwrap
from typing import Any, TypeGuard

from arceusd.jobs.core.states import TERMINAL
from arceusd.jobs.record.report_fields import report_lines


def _num(value: object, fmt: str = ".4f") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def _ms(seconds: object) -> str:
    return f"{seconds * 1000:.1f} ms" if isinstance(seconds, int | float) else "-"


def block_range(blocks: object) -> str:
    """A stage's blocks as every view writes them: ``[start, end)`` from the plan as ``2-5`` (both ends held) or
    ``3`` (issue 31: the CLI, ``--watch`` and the dashboard wrote three forms, one of which read as overlapping
    stages); the dashboard's ``app.js`` ``blockRange`` follows the same rule."""
    if not (isinstance(blocks, list | tuple) and len(blocks) == 2 and all(isinstance(b, int) for b in blocks)):
        return "?"
    first, last = int(blocks[0]), int(blocks[1]) - 1
    return f"{first}" if first == last else f"{first}-{last}"


def _number(value: object) -> TypeGuard[int | float]:
    """Whether ``value`` is a finite int or float (not a bool): something a view writes as a figure."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def usd(value: object) -> str:
    """Dollars as every view writes them: ``$0.0020`` (four places), ``-`` when there is no number."""
    return f"${value:.4f}" if _number(value) else "-"


def usd_per_hour(value: object) -> str:
    """A price as every view writes it: ``$0.0020/h`` (issue 31: the dashboard printed ``$0.002``); the
    dashboard gets these strings from the server (``arceusd.dashboard.data``), it formats no price itself."""
    shown = usd(value)
    return shown + "/h" if shown != "-" else "-"


def count(value: object) -> str:
    """A count as every view writes it: a whole number (``3``, never ``3.000``); ``-`` when there is none."""
    return str(int(value)) if _number(value) and value == int(value) else "-"


SPARE = "in no stage, paid nothing, takes a place if one is lost"
"""What a spare's own daemon says of it (a member the leader's plan leaves out: ``Job.is_spare``)."""


ENDED = frozenset(state.value for state in TERMINAL)
"""A job's states after which nothing is synced to its standby."""


def standby_note(j: dict[str, Any]) -> str:
    """What every view writes after the standby's id (``j``: ``status JOB --json``): ``ready at step S`` once
    the standby holds committed checkpoint ``S`` (on the leader: the standby confirmed it, ``standby_step``),
    ``ready`` when it holds its checked copies and no step is known, ``syncing`` before; nothing without a
    standby, once the job ended, or on a device that is not told (``standby_ready`` None: neither the leader nor
    the standby) (issue 31: the leader's views said "syncing" for good, even after the end)."""
    ready = j.get("standby_ready")
    if not j.get("standby") or j.get("state") in ENDED or ready is None:
        return ""
    if ready is not True:
        return "syncing"
    step = j.get("standby_step")
    return f"ready at step {step}" if isinstance(step, int) and not isinstance(step, bool) else "ready"


def standby_text(j: dict[str, Any]) -> str:
    """The standby as the CLI and ``--watch`` write it: its short id and :func:`standby_note` (``-``: none)."""
    if not j.get("standby"):
        return "-"
    note = standby_note(j)
    return f"{str(j['standby'])[:12]} ({note})" if note else str(j["standby"])[:12]


def wrapped(line: str, width: int = 110) -> list[str]:
    """``line`` in full, wrapped at ``width`` with its continuation indented past its label: reasons name devices
    and causes in full (issue 31: they were cut at 80 characters, the device that died cut off)."""
    return textwrap.wrap(line, width, subsequent_indent=" " * 11, break_long_words=False, break_on_hyphens=False)


def job_line(j: dict[str, Any]) -> str:
    """One job of ``arceusd jobs``; a job known only from this device's records (``restored``: the daemon
    restarted since, :mod:`arceusd.jobs.record.known`) says what it earned there and why it is not running here."""
    line = (
        f"{j['job_id'][:12]}  {j['name']:<20} {j['state']:<10} {j['role']:<6} step {j['step']}/{j['total_steps']}"
        f"  loss {_num(j.get('loss'))}  members {len(j.get('members', []))}"
    )
    if j.get("spare"):
        line += f"  (spare: {SPARE})"
    if j.get("restored"):
        line += f"  earned {usd(j.get('earned_usd'))} ({count(j.get('receipts'))} receipt(s))"
        line += f"  ({j['error']})" if j.get("error") else ""
    return line


def contribution_lines(j: dict[str, Any]) -> list[str]:
    """The ledger: each member's share of the work and what it adds up to."""
    contributions = j.get("contributions") or []
    if not contributions:
        return []
    return ["  contributions"] + [
        f"    {c['peer_id'][:12]}  {c['share']:.1%} of the work   {c['tflop']:.3f} TFLOP so far" for c in contributions
    ]


def claim_lines(j: dict[str, Any]) -> list[str]:
    """What the leader measured of its members' claims (issue #19): each device's timed speed challenge, who was
    planned slower than it offered, and who was excluded."""
    lines = []
    for peer, c in sorted((j.get("speed_checks") or {}).items()):
        result = f"failed: {c['failed']}" if c.get("failed") else f"{c['slowdown']:.1f}x slower than offered"
        lines.append(
            f"  timed    {peer[:12]}  offered {c['offered_gflops']:.1f} GFLOP/s, measured "
            f"{c['measured_gflops']:.1f} in {c['seconds']:.2f} s ({result})"
        )
    for peer, factor in sorted((j.get("discounted") or {}).items()):
        lines.append(f"  slower   {peer[:12]}  planned at its offer / {factor:g} (it ran that much slower)")
    if j.get("probation"):
        lines.append(
            f"  probation {j['probation'][:12]}  planned alone beside the leader (it and its neighbour each "
            "said they waited on the other)"
        )
    for peer in j.get("cleared") or []:
        lines.append(f"  cleared  {peer[:12]}  kept to its offer beside the leader")
    for peer, why in sorted((j.get("excluded") or {}).items()):
        lines += wrapped(f"  excluded {peer[:12]}  {why}")
    return lines


def render_job(j: dict[str, Any]) -> str:
    lines = [
        f"job {j['job_id']}  ({j['name']}: {j['model']} on {j['data']})",
        f"  state    {j['state']}  (term {j['term']}, epoch {j['epoch']}, you are {j['role']})",
        f"  step     {j['step']}/{j['total_steps']}   loss {_num(j.get('loss'))}   lr {_num(j.get('lr'), '.2e')}",
        f"  eval     loss {_num(j.get('val_loss'))}   accuracy {_num(j.get('val_accuracy'), '.2%')}",
        f"  speed    {_num(j.get('samples_per_s'), '.1f')} samples/s   {_num(j.get('tokens_per_s'), '.0f')} tokens/s",
    ]
    cost = j.get("cost")  # the leader's: spent, budget left, time and cost to finish (arceusd.market.progress)
    if isinstance(cost, dict) and isinstance(cost.get("line"), str):
        lines.append(f"  cost     {cost['line']}")
    plan = j.get("plan")
    if plan:
        lines.append(
            f"  plan     {plan['schedule']}, {plan['micro_batches']} micro-batches"
            + (f" (at most {plan['in_flight_cap']} in flight, to fit memory)" if plan.get("in_flight_cap") else "")
            + ", predicted "
            f"{plan['predicted_step_time_s'] * 1000:.1f} ms/step, "
            f"bubble {plan['bubble_fraction']:.0%}"
        )
        replicas = plan.get("replicas") or [{"stages": plan["stages"]}]
        if len(replicas) > 1:
            sync = (
                f"DiLoCo every {plan.get('diloco_h')} steps"
                if plan.get("sync") == "diloco"
                else "gradients averaged every step"
            )
            lines.append(
                f"    {len(replicas)} data-parallel replicas, {sync}; this device sent "
                f"{j.get('ring_bytes', 0) / 1e6:.1f} MB to its ring"
            )
        for r, replica in enumerate(replicas):
            where = f"replica {r} " if len(replicas) > 1 else ""
            for stage in replica["stages"]:
                devices = ", ".join(
                    d["peer_id"][:12]
                    + (f" (heads {sum(d['heads'])}, cols {sum(d['mlp_columns'])})" if len(stage["devices"]) > 1 else "")
                    for d in stage["devices"]
                )
                lines.append(f"    {where}stage {stage['index']}: blocks {block_range(stage['blocks'])} on {devices}")
        times = j.get("stage_times") or {}
        for stage in plan["stages"]:
            for d in stage["devices"]:
                t = times.get(d["peer_id"])
                if t:
                    seen = t.get("seen_s")  # the leader's view: what the devices beside it saw it take
                    shown = f"; seen by its neighbours: {_ms(seen)})" if seen is not None else ")"
                    lines.append(
                        f"    {d['peer_id'][:12]} (stage {stage['index']}): {_ms(t.get('compute_s'))} "
                        f"compute, {_ms(t.get('wait_s'))} waiting per step "
                        f"(plan: {_ms(t.get('predicted_s'))} compute{shown}"
                    )
    if j.get("spare"):
        lines.append(f"  spare    this device: {SPARE}")
    spares = j.get("spares") or []
    if spares:
        lines.append(
            f"  spares   {', '.join(p[:12] for p in spares)}: not in the plan (the step is predicted "
            "faster without them); unpaid, they take a place when one is lost"
        )
    timing = j.get("stage_timing")
    if timing:
        lines.append(
            f"  measured {timing['step_time_s'] * 1000:.1f} ms/step on this device (median of the last "
            f"{timing['steps']}), {timing['wait_fraction']:.0%} of it waiting on links"
        )
    lines += contribution_lines(j) + report_lines(j) + claim_lines(j)
    if j.get("committed_step"):
        lines.append(f"  checkpoint  step {j['committed_step']} committed")
    if j.get("standby") and j.get("state") not in ENDED:
        lines.append(f"  standby  {standby_text(j)}")
    for r in j.get("recoveries") or []:
        after = r.get("first_step_after_s")
        timing = f"training again after {after:.1f} s" if isinstance(after, int | float) else "in progress"
        lines += wrapped(
            f"  recovery epoch {r['epoch']}: {r['reason']}; resumed at step {r['resumed_step']} "
            f"({r['recomputed_steps']} recomputed), {timing}"
        )
    for d in j.get("dropped_replicas") or []:
        lines += wrapped(
            f"  dropped  a replica at step {d['step']} ({', '.join(p[:12] for p in d['devices'])}): "
            f"{d['reason']}; {d['replicas_left']} replica(s) went on"
        )
    for r in j.get("rebuilt_replicas") or []:
        on = ", ".join(p[:12] for p in r["devices"])
        lines.append(f"  rebuilt  a replica at step {r['step']} on {on} (from that checkpoint; the others held there)")
    if j.get("model_path"):
        lines.append(f"  model    {j['model_path']}")
    if j.get("error"):
        lines.append(f"  note     {j['error']}")
    return "\n".join(lines)
