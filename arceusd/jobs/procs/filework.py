"""The daemon's tensor work, run in a child process: re-slicing a checkpoint for a new plan, exporting the model.

The daemon never imports torch (it would stall the event loop for seconds and make peers suspect a healthy
daemon); what needs tensors runs as ``python -m arceusd.jobs.procs.filework TASK`` with a JSON request on stdin and
one JSON line on stdout, the way the worker and the probe run. Owns both sides:

- the daemon's side (:func:`prepare_resume`, :func:`export_model`): trio starts the child and parses its answer;
  a child that fails raises :class:`FileworkError` with the last of its message;
- the child's side (:func:`main`): ``resume`` runs :func:`arceusd.jobs.plans.recovery.prepare_resume` over the plan's
  stages, ``export`` assembles the shards into the model (:mod:`arceusd.jobs.procs.export`), ``shapes`` computes once
  per plan the parameter shapes each place in it implies (:func:`plan_shapes`), which the leader checks every
  committed shard against (:mod:`arceusd.jobs.judging.shard_scan`, in the daemon, without torch); a LoRA job's are its
  adapters' alone (its reference model's parameters). A resume slice and an
  exported model that hold a non-finite value are refused (issue #19: never ``done`` with a broken model).

Everything the child gets comes from this daemon (its own spec bytes, plan, files); it parses the spec again
with :func:`arceusd.jobs.spec.schema.spec_from_dict` and the plan with the partitioner's decoder.
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arceusd.jobs.plans import recovery
from arceusd.jobs.plans.planning import plan_from_start, worker_stages
from arceusd.jobs.plans.recovery import ResumeFile, ResumePoint
from arceusd.jobs.procs.warm_starts import warm_starts
from arceusd.jobs.spec.schema import spec_from_dict
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.models.hf.config import HFModelConfig
from partitioner import plan_from_bytes

log = logging.getLogger(__name__)

TASKS = ("resume", "export", "shapes")


class FileworkError(RuntimeError):
    """The child process failed; the message says what it reported."""


# ------------------------------------------------------------------------------------------------ the daemon
async def _run(task: str, request: dict[str, Any]) -> dict[str, Any]:
    # forked from the fork server when it runs: re-slicing is on a recovery's critical path (issue 33)
    returncode, stdout, stderr = await warm_starts().run(
        "arceusd.jobs.procs.filework", [task], json.dumps(request).encode()
    )
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise FileworkError(
            f"{task} in a child process failed (exit {returncode}): {stderr.decode(errors='replace')[-800:]}"
        )
    if "error" in answer:
        raise FileworkError(f"{task} failed: {answer['error']}")
    if returncode != 0:  # the answer is whole (the child prints it last, after all its work): keep it
        log.warning(
            "%s in a child process answered in full, then its exit code read %d (kept the answer): %s",
            task,
            returncode,
            stderr.decode(errors="replace")[-300:],
        )
    return answer


async def prepare_resume(
    job_dir: Path, spec_bytes: bytes, plan_data: bytes, epoch: int, trusted: Sequence[str], replicas: Sequence[Path]
) -> ResumePoint | None:
    """Slice the newest verified checkpoint of ``job_dir`` for the plan (in a child process); None when no
    checkpoint verifies (start fresh)."""
    began = time.monotonic()
    answer = await _run(
        "resume",
        {
            "job_dir": str(job_dir),
            "spec": spec_bytes.decode(),
            "plan": base64.b64encode(plan_data).decode(),
            "epoch": epoch,
            "trusted": list(trusted),
            "replicas": [str(r) for r in replicas],
        },
    )
    # where a slow re-slice went (issue 33): the child's own phases, the rest is its start and the pipes
    log.info("re-sliced in %.3f s (in the child: %s)", time.monotonic() - began, answer.get("timings"))
    body = answer.get("resume")
    if body is None:
        return None
    files = {str(p): ResumeFile(str(n), str(h), int(s)) for p, (n, h, s) in body["files"].items()}
    cursor = body.get("cursor")
    return ResumePoint(int(body["step"]), files, cursor if isinstance(cursor, dict) else None, Path(body["directory"]))


async def export_model(
    job_dir: Path,
    spec_bytes: bytes,
    job_id: str,
    step: int,
    paths: Sequence[Path],
    vocab_path: str | None,
    weights: Path | None = None,
) -> Path:
    """Assemble the model from the shards at ``paths`` and write it into ``job_dir`` (in a child process);
    ``weights``: a stock LM's initial weights, resolved (a LoRA job's merged export rebuilds its base from them)."""
    answer = await _run(
        "export",
        {
            "job_dir": str(job_dir),
            "spec": spec_bytes.decode(),
            "job_id": job_id,
            "step": step,
            "paths": [str(p) for p in paths],
            "vocab_path": vocab_path,
            "weights": str(weights) if weights else None,
        },
    )
    return Path(answer["model_path"])


async def plan_shapes(
    spec_bytes: bytes, plan_data: bytes
) -> tuple[dict[str, dict[str, tuple[int, ...]]], dict[str, float]]:
    """The parameter names and shapes each device's place in the plan implies: peer -> name -> shape (in a child
    process: the reference model's shapes, sliced the way the workers slice them), and each whole parameter's
    largest initial magnitude (the job's seed: what the first checkpoint is checked against,
    :mod:`arceusd.jobs.judging.plausibility`)."""
    answer = await _run("shapes", {"spec": spec_bytes.decode(), "plan": base64.b64encode(plan_data).decode()})
    shapes, initial = answer.get("shapes"), answer.get("initial")
    if not isinstance(shapes, dict) or not isinstance(initial, dict):
        raise FileworkError("shapes: no shapes in the child's answer")
    return (
        {str(peer): {str(k): tuple(int(d) for d in v) for k, v in names.items()} for peer, names in shapes.items()},
        {str(k): float(v) for k, v in initial.items()},
    )


# ------------------------------------------------------------------------------------------------ the child
# The imports inside these functions load torch (or transformers):
# the daemon imports this module for its side above.
def _non_finite(tensors: Any) -> str | None:
    """The first tensor name holding a NaN or an infinity, or None."""
    import torch  # torch: the child only

    for key, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return str(key)
    return None


def _shapes(request: dict[str, Any]) -> dict[str, Any]:
    import torch  # torch: the child only

    from arceusd.jobs.procs.reslice import slice_state  # torch
    from arceusd.models.build import build_reference_model  # torch

    spec = spec_from_dict(json.loads(request["spec"]))
    stages = worker_stages(plan_from_bytes(base64.b64decode(request["plan"])))
    with torch.no_grad():  # the job's own initial values: their magnitudes bound the first checkpoint's
        reference = {k: v.detach() for k, v in build_reference_model(spec.model, spec.seed).named_parameters()}
    full = {f"param.blocks.{k}": v for k, v in reference.items()}
    shapes: dict[str, dict[str, list[int]]] = {}
    for stage in stages:
        for rank, member in enumerate(stage.members):
            sliced = slice_state(spec.model, full, stage, rank)
            shapes[member.peer_id] = {k: list(v.shape) for k, v in sliced.items()}
    # a model whose initial values come from its seed alone (a stock LM may start from weights on disk: none then)
    seeded = isinstance(spec.model, MLPConfig | GPTConfig)
    initial = {k: float(v.abs().max()) if v.numel() else 0.0 for k, v in full.items()} if seeded else {}
    return {"shapes": shapes, "initial": initial}


def _resume(request: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()

    spec = spec_from_dict(json.loads(request["spec"]))
    # data-parallel replicas: every replica's devices get the slice of their place
    pipelines = [worker_stages(p) for p in plan_from_start(base64.b64decode(request["plan"])).replicas]
    prepared = time.monotonic()
    point = recovery.prepare_resume(
        Path(request["job_dir"]),
        spec.model,
        pipelines[0],
        int(request["epoch"]),
        [str(t) for t in request["trusted"]],
        [Path(r) for r in request["replicas"]],
        pipelines[1:],
    )
    if point is None:  # (a non-finite value in the checkpoint it slices is refused there: ResumeError)
        return {"resume": None}
    timings = {"parsed": prepared - started, "sliced": time.monotonic() - prepared}
    return {
        "resume": {
            "step": point.step,
            "cursor": point.cursor,
            "directory": str(point.directory),
            "files": {p: [f.name, f.sha256, f.size] for p, f in point.files.items()},
        },
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }


def _export(request: dict[str, Any]) -> dict[str, Any]:
    from arceusd.jobs.procs.export import assemble, write_model  # torch: only the export child

    spec = spec_from_dict(json.loads(request["spec"]))
    state = assemble(spec.model, [Path(p).read_bytes() for p in request["paths"]])
    where = _non_finite(state)
    if where is not None:
        raise ValueError(f"the assembled model holds non-finite values ({where}); it is not saved")
    extra: dict[str, Any] = {"job_id": request["job_id"], "step": int(request["step"]), "name": spec.name}
    if isinstance(spec.model, HFModelConfig):  # a folder transformers' from_pretrained loads
        from arceusd.models.hf.export import write_hf_export  # transformers: only a stock model's export

        tokenizer = Path(request["vocab_path"]) if request.get("vocab_path") else None
        folder = Path(request["job_dir"]) / "export"
        if spec.model.lora is not None:  # the adapters in peft's format (and the merged model when asked)
            from arceusd.models.hf.lora_export import write_lora_export  # peft: only a LoRA export

            weights = Path(request["weights"]) if request.get("weights") else None
            path = write_lora_export(folder, spec.model, state, tokenizer, spec.seed, weights)
            return {"model_path": str(path)}
        return {"model_path": str(write_hf_export(folder, spec.model, state, tokenizer))}
    if request.get("vocab_path"):
        from arceusd.data.text import load_text  # torch

        extra["vocab"] = "".join(load_text(Path(request["vocab_path"])).vocab.chars)
    return {"model_path": str(write_model(Path(request["job_dir"]), spec.model, state, extra))}


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in TASKS:
        sys.exit(f"usage: python -m arceusd.jobs.procs.filework {{{','.join(TASKS)}}} < request.json")
    try:
        request = json.loads(sys.stdin.read())
        task = {"resume": _resume, "export": _export, "shapes": _shapes}[sys.argv[1]]
        answer = task(request)
    except Exception as exc:  # one line for the daemon's log; the traceback goes to stderr
        traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(1)
    print(json.dumps(answer))


if __name__ == "__main__":
    main()


__all__ = ["FileworkError", "export_model", "main", "plan_shapes", "prepare_resume"]
