"""Canonical bytes and hashes of planner inputs and plans.

Canonical JSON: ``sort_keys``, no whitespace, ASCII only, no NaN/Infinity; floats as Python's shortest
round-trip ``repr`` (identical on every IEEE-754 platform). Inputs are canonicalised first (devices sorted
by peer id, links sorted), so permuted inputs hash the same. JSON rather than msgpack: the bytes are
readable in logs and a diff of two plans is a plain text diff; planning messages are small, so size does not
matter.

Calibration fields (``DeviceProfile.block_efficiency``, ``dispatch_s``, ``optimizer_s_per_param``;
``Link.message_s``) are written only when they differ from their "uncalibrated" defaults, so inputs without
calibration keep the bytes (and hash) they had before those fields existed, and inputs from such a peer
still load. Inputs *with* calibration are refused by a peer that predates it (``DeviceProfile`` gets an
unknown keyword): it cannot recompute the plan, and says so instead of agreeing to a different one."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from partitioner.blocks import BlockCost
from partitioner.inputs import DeviceProfile, Link, LinkMatrix, PlanInputs, TrainingParams
from partitioner.plan import DeviceShare, Plan, Stage


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _block_to_dict(b: BlockCost) -> dict[str, Any]:
    return {
        "name": b.name,
        "param_bytes": b.param_bytes,
        "optimizer_bytes": b.optimizer_bytes,
        "activation_bytes_per_sample": b.activation_bytes_per_sample,
        "stash_bytes_per_sample": b.stash_bytes_per_sample,
        "forward_flops_per_sample": float(b.forward_flops_per_sample),
        "backward_flops_per_sample": float(b.backward_flops_per_sample),
        "heads": b.heads,
        "mlp_columns": b.mlp_columns,
    }


_DEVICE_CALIBRATION = (("block_efficiency", 1.0), ("dispatch_s", 0.0), ("optimizer_s_per_param", 0.0))


def _device_to_dict(d: DeviceProfile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "peer_id": d.peer_id,
        "flops_per_s": float(d.flops_per_s),
        "memory_bytes": d.memory_bytes,
        "kind": d.kind,
    }
    for name, default in _DEVICE_CALIBRATION:
        value = float(getattr(d, name))
        if value != default:
            out[name] = value
    return out


def _link_to_list(src: str, dst: str, lk: Link) -> list[Any]:
    out: list[Any] = [src, dst, float(lk.rtt_s), float(lk.bandwidth_bytes_per_s)]
    if lk.message_s != 0.0:
        out.append(float(lk.message_s))
    return out


def _link_from_list(item: Any) -> tuple[str, str, Link]:
    if not isinstance(item, list) or len(item) not in (4, 5):
        raise ValueError(f"a link is [source, destination, rtt_s, bandwidth(, message_s)], got {item!r}")
    src, dst, rtt, bw = item[:4]
    message = float(item[4]) if len(item) == 5 else 0.0
    return str(src), str(dst), Link(float(rtt), float(bw), message)


def inputs_to_dict(inputs: PlanInputs) -> dict[str, Any]:
    c = inputs.canonical()
    t = c.training
    return {
        "blocks": [_block_to_dict(b) for b in c.blocks],
        "devices": [_device_to_dict(d) for d in c.devices],
        "links": [_link_to_list(s, d, lk) for s, d, lk in c.links.links],
        "training": {
            "global_batch_size": t.global_batch_size,
            "micro_batch_counts": list(t.micro_batch_counts),
            "wire_bytes_per_element": t.wire_bytes_per_element,
            "compute_bytes_per_element": t.compute_bytes_per_element,
            "max_tensor_parallel": t.max_tensor_parallel,
            "use_all_devices": t.use_all_devices,
        },
    }


def inputs_from_dict(d: dict[str, Any]) -> PlanInputs:
    """Rebuild inputs from ``inputs_to_dict`` output; raises ValueError/KeyError/TypeError if bad."""
    blocks = tuple(BlockCost(**b) for b in d["blocks"])
    devices = tuple(DeviceProfile(**x) for x in d["devices"])
    links = LinkMatrix(tuple(_link_from_list(item) for item in d["links"]))
    tr = dict(d["training"])
    tr["micro_batch_counts"] = tuple(tr["micro_batch_counts"])
    return PlanInputs(blocks, devices, links, TrainingParams(**tr))


def inputs_bytes(inputs: PlanInputs) -> bytes:
    return canonical_json(inputs_to_dict(inputs))


def inputs_hash(inputs: PlanInputs) -> str:
    """sha256 hex of the canonical input bytes."""
    return hashlib.sha256(inputs_bytes(inputs)).hexdigest()


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "format_version": plan.format_version,
        "inputs_hash": plan.inputs_hash,
        "micro_batches": plan.micro_batches,
        "micro_batch_size": plan.micro_batch_size,
        "schedule": plan.schedule,
        "predicted_step_time_s": plan.predicted_step_time_s,
        "bubble_fraction": plan.bubble_fraction,
        "memory_bytes": [[p, b] for p, b in plan.memory_bytes],
        "stages": [_stage_to_dict(s) for s in plan.stages],
        **({"sync_s": plan.sync_s} if plan.sync_s != 0.0 else {}),
        **({"in_flight_cap": plan.in_flight_cap} if plan.in_flight_cap else {}),  # (older plans keep their bytes)
    }


def _stage_to_dict(s: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": s.index,
        "start": s.start,
        "end": s.end,
        "devices": list(s.devices),
        "shares": [
            {"peer_id": sh.peer_id, "heads": list(sh.heads), "mlp_columns": list(sh.mlp_columns)} for sh in s.shares
        ],
        "compute_s": s.compute_s,
        "allreduce_s": s.allreduce_s,
        "transfer_s": s.transfer_s,
        "time_s": s.time_s,
        "stash_micro_batches": s.stash_micro_batches,
    }
    if s.optimizer_s != 0.0:  # only calibrated inputs charge it: uncalibrated plans keep their old bytes
        out["optimizer_s"] = s.optimizer_s
    return out


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """Rebuild a plan from ``plan_to_dict`` output; raises ValueError/KeyError/TypeError if bad."""
    stages = tuple(
        Stage(
            index=int(s["index"]),
            start=int(s["start"]),
            end=int(s["end"]),
            devices=tuple(str(p) for p in s["devices"]),
            shares=tuple(
                DeviceShare(
                    str(sh["peer_id"]), tuple(int(h) for h in sh["heads"]), tuple(int(c) for c in sh["mlp_columns"])
                )
                for sh in s["shares"]
            ),
            compute_s=float(s["compute_s"]),
            allreduce_s=float(s["allreduce_s"]),
            transfer_s=float(s["transfer_s"]),
            time_s=float(s["time_s"]),
            stash_micro_batches=int(s["stash_micro_batches"]),
            optimizer_s=float(s.get("optimizer_s", 0.0)),
        )
        for s in d["stages"]
    )
    return Plan(
        stages=stages,
        micro_batches=int(d["micro_batches"]),
        micro_batch_size=int(d["micro_batch_size"]),
        schedule=str(d["schedule"]),
        predicted_step_time_s=float(d["predicted_step_time_s"]),
        bubble_fraction=float(d["bubble_fraction"]),
        memory_bytes=tuple((str(p), int(b)) for p, b in d["memory_bytes"]),
        inputs_hash=str(d["inputs_hash"]),
        format_version=int(d["format_version"]),
        sync_s=float(d.get("sync_s", 0.0)),
        in_flight_cap=_in_flight_cap(d),
    )


def _in_flight_cap(d: dict[str, Any]) -> int:
    cap = int(d.get("in_flight_cap", 0))
    if not 0 <= cap <= int(d["micro_batches"]):
        raise ValueError(f"in_flight_cap {cap} is not within 0..micro_batches")
    return cap


def plan_bytes(plan: Plan) -> bytes:
    return canonical_json(plan_to_dict(plan))


def plan_from_bytes(data: bytes) -> Plan:
    """Decode canonical plan bytes. Raises ``ValueError`` on anything malformed."""
    try:
        return plan_from_dict(json.loads(data))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed plan bytes: {exc!r}") from exc


def plan_hash(plan: Plan) -> str:
    """sha256 hex of the canonical plan bytes (which include the inputs hash)."""
    return hashlib.sha256(plan_bytes(plan)).hexdigest()
