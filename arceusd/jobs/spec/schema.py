"""Declarative job specs: parse TOML/JSON into a validated :class:`JobSpec`, serialise it, hash it.

Owns: the job spec's schema and its entry points (:func:`load_spec`, :func:`parse_spec`, :func:`spec_from_dict`);
the field checks are :mod:`arceusd.jobs.spec.parser`'s, the canonical form, the spec hash and the job id
:mod:`arceusd.jobs.spec.identity`'s (re-exported here).

Schema (TOML; JSON with the same nesting is accepted, chosen by a ``.json`` suffix)::

    name = "mnist-mlp"          # required, [A-Za-z0-9._-], at most 64 characters
    seed = 0                    # default 0
    [model]   type = "mlp", layer_sizes = [784, 128, 64, 10]
              | type = "gpt", n_layer, n_head, n_embd, block_size, vocab_size (int or "auto"), dropout, bias
              | type = "hf", config (a gpt2/llama/qwen2/mistral config.json path, or inline), block_size,
                weights?, weights_sha256?  (arceusd/jobs/spec/hf.py)
    [data]    kind = "mnist", dir, train_count, holdout_count, mean, std, split_seed?, images?, labels?,
              sha256?
              | kind = "text", path, val_fraction, sha256?
              | kind = "tokens", path, tokenizer, format ("text" | "jsonl"), text_field, val_fraction, sha256?,
                tokenizer_sha256?  (a stock LM's data; arceusd/jobs/spec/hf.py)
    [training] steps | epochs, batch_size, micro_batches, optimizer ("sgd" | "adamw"), lr, weight_decay,
              momentum (sgd only), betas (adamw only), warmup_steps, lr_decay ("none" | "cosine"), min_lr,
              grad_clip, precision, compression, topk_fraction (topk only), schedule, eval_interval_steps,
              eval_iters, replicas (int or "auto"; default 1), sync ("auto" | "every_step" | "diloco"),
              use_all_devices (default false: a device is planned only where the step gets faster with it)
    [training.diloco] inner_steps (500), outer_lr (0.7), outer_momentum (0.9), compression ("int8")
    [checkpoint] interval_steps, keep
    [admission]  mode = "open" | "allowlist", peers = [peer ids] (allowlist only)
    [lora]       r, alpha, dropout, target_modules, merge (optional, [model] type = "hf" only: adapters trained on
                 the frozen model; arceusd/jobs/spec/lora.py)
    [needs]      memory_total_mib, memory_per_device_mib, device_kinds (["cpu", "cuda", "mps"]), min_members,
                 max_members, deadline_hours, max_price_per_hour, budget_usd (all optional; see NeedsSpec)

Validation collects every problem and raises one :class:`JobSpecError` with one line per problem (field path,
what was wrong, what is allowed). With ``check_files`` the data are inspected: paths resolve relative to the
folder holding the spec file (never the shell's working folder, so a spec means the same wherever it is
submitted from); ``vocab_size = "auto"`` and ``epochs`` are resolved; the files' content digest is recorded in
``data.sha256`` (or checked against it when the spec gives one). Specs received over the wire
(:func:`spec_from_dict`) are validated the same way without files: only the owner has the data.

Identity: :func:`canonical_json` is the sorted-key, compact JSON of :meth:`to_dict` (every field that affects
training, data digest included; ``base_dir`` excluded since it only says where the owner keeps the files).
``spec_hash = sha256(canonical_json)`` in hex. A job id is the first 16 bytes, in hex (32 characters, like a
peer id), of ``sha256("arceus-job-id-v1\\0" || spec hash || owner peer id || nonce)``: the same spec submitted
twice, or by two owners, gives two jobs.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from arceusd.jobs.spec.fields import FieldReader, SpecProblem
from arceusd.jobs.spec.identity import canonical_json, job_id, spec_hash, to_dict
from arceusd.jobs.spec.parsed import (
    AdmissionSpec,
    CheckpointSpec,
    JobSpec,
    MnistDataSpec,
    TextDataSpec,
    TrainingSpec,
)
from arceusd.jobs.spec.parser import parse_document

__all__ = [
    "AdmissionSpec",
    "CheckpointSpec",
    "JobSpec",
    "JobSpecError",
    "MnistDataSpec",
    "SpecProblem",
    "TextDataSpec",
    "TrainingSpec",
    "canonical_json",
    "job_id",
    "load_spec",
    "parse_spec",
    "spec_from_dict",
    "spec_hash",
    "to_dict",
]

MAX_SPEC_BYTES = 1 << 20
"""The largest spec file read."""


class JobSpecError(ValueError):
    """A job spec was invalid. ``problems`` lists every problem; the message has one line per problem."""

    def __init__(self, problems: list[SpecProblem] | tuple[SpecProblem, ...], source: str = "job spec") -> None:
        self.problems = tuple(problems)
        self.source = source
        count = len(self.problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{source}: {count} problem{'s' if count != 1 else ''}:\n{lines}")

    def paths(self) -> list[str]:
        """The field paths with problems, in report order."""
        return [p.path for p in self.problems]


# ---------------------------------------------------------------------------------------------- entry points


def load_spec(path: str | Path, *, check_files: bool = True) -> JobSpec:
    """Read and validate a spec file (``.json`` as JSON, else TOML); data paths resolve from its folder.

    Error handling: ``JobSpecError`` for an unreadable or unparsable file and for every invalid field.
    """
    p = Path(path)
    source = str(p)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise JobSpecError([SpecProblem("(file)", f"cannot read the spec: {e.strerror or e}")], source) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise JobSpecError([SpecProblem("(file)", f"spec is {len(raw)} bytes; at most {MAX_SPEC_BYTES}")], source)
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
        raise JobSpecError([SpecProblem("(file)", f"not valid {kind}: {e}")], source) from None
    return parse_spec(doc, base_dir=p.resolve().parent, source=source, check_files=check_files)


def spec_from_dict(doc: object, *, source: str = "job spec from the wire") -> JobSpec:
    """Validate a spec received as a dict (e.g. :func:`to_dict` output from a peer); reads no data files."""
    return parse_spec(doc, base_dir=None, source=source, check_files=False)


def parse_spec(doc: object, *, base_dir: Path | None, source: str = "job spec", check_files: bool = True) -> JobSpec:
    """Validate a parsed TOML/JSON document into a :class:`JobSpec` (see the module docstring)."""
    r = FieldReader()
    if not isinstance(doc, dict):
        raise JobSpecError([SpecProblem("(top)", f"a spec must be a table/object, got {type(doc).__name__}")], source)
    spec = parse_document(r, doc, base_dir, check_files)
    if r.problems or spec is None:
        raise JobSpecError(r.problems or [SpecProblem("(top)", "invalid spec")], source)
    return spec
