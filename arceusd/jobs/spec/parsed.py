"""The parsed job spec: frozen dataclasses only (parsing and validation live in ``arceusd.jobs.spec.schema``).

Owns: the shape of a validated job spec. Every value here has been checked; data-derived values are
resolved (``vocab_size = "auto"`` became the text's vocabulary size, ``epochs`` became ``steps``, the data
files' content digest is in ``sha256`` when the files were checked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.models.hf.config import HFModelConfig

SPEC_VERSION = 1

Optimizer = Literal["sgd", "adamw"]
LrDecay = Literal["none", "cosine"]
Precision = Literal["fp32", "bf16"]
Compression = Literal["none", "fp16", "bf16", "int8", "topk"]
Schedule = Literal["auto", "gpipe", "1f1b"]
AdmissionMode = Literal["open", "allowlist"]
ReplicaSync = Literal["auto", "every_step", "diloco"]
DiLoCoCompression = Literal["none", "fp16", "bf16", "int8"]

OPTIMIZERS: tuple[Optimizer, ...] = ("sgd", "adamw")
LR_DECAYS: tuple[LrDecay, ...] = ("none", "cosine")
PRECISIONS: tuple[Precision, ...] = ("fp32", "bf16")
COMPRESSIONS: tuple[Compression, ...] = ("none", "fp16", "bf16", "int8", "topk")
SCHEDULES: tuple[Schedule, ...] = ("auto", "gpipe", "1f1b")
ADMISSION_MODES: tuple[AdmissionMode, ...] = ("open", "allowlist")
REPLICA_SYNCS: tuple[ReplicaSync, ...] = ("auto", "every_step", "diloco")
DILOCO_COMPRESSIONS: tuple[DiLoCoCompression, ...] = ("none", "fp16", "bf16", "int8")
MAX_REPLICAS = 256


@dataclass(frozen=True)
class MnistDataSpec:
    """MNIST IDX files in ``dir``; ``images``/``labels`` name the files inside it (resolved when checked)."""

    dir: str
    train_count: int
    holdout_count: int
    mean: float
    std: float
    split_seed: int | None = None
    images: str | None = None
    labels: str | None = None
    sha256: str | None = None
    kind: Literal["mnist"] = "mnist"


@dataclass(frozen=True)
class TextDataSpec:
    """A UTF-8 text file for a character model; the last ``val_fraction`` of it validates."""

    path: str
    val_fraction: float
    sha256: str | None = None
    kind: Literal["text"] = "text"


TokensFormat = Literal["text", "jsonl"]
TOKENS_FORMATS: tuple[TokensFormat, ...] = ("text", "jsonl")


@dataclass(frozen=True)
class TokensDataSpec:
    """A UTF-8 text (one document) or JSONL file (``text_field`` of each line) tokenized with ``tokenizer`` (a
    ``tokenizers`` tokenizer.json) for a stock causal LM (``arceusd/data/tokenized.py``); the last
    ``val_fraction`` of the ids validates. ``sha256`` pins the data file, ``tokenizer_sha256`` the tokenizer."""

    path: str
    tokenizer: str
    val_fraction: float
    format: TokensFormat = "text"
    text_field: str = "text"
    sha256: str | None = None
    tokenizer_sha256: str | None = None
    kind: Literal["tokens"] = "tokens"


DataSpec = MnistDataSpec | TextDataSpec | TokensDataSpec


@dataclass(frozen=True)
class DiLoCoSpec:
    """DiLoCo's outer loop (Douillard et al. 2023; the paper's defaults): every ``inner_steps`` local steps the
    replicas average their pseudo-gradients (sent with ``compression``) and take an outer Nesterov step."""

    inner_steps: int = 500
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    compression: DiLoCoCompression = "int8"


@dataclass(frozen=True)
class TrainingSpec:
    """Optimisation and execution settings.

    ``grad_clip`` 0 = off; ``eval_interval_steps`` 0 = evaluate only at the end; ``eval_iters`` is the
    number of validation batches of a text job (MNIST evaluates all held-out examples)."""

    steps: int
    epochs: int | None
    batch_size: int
    micro_batches: int
    optimizer: Optimizer
    lr: float
    weight_decay: float
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    lr_decay: LrDecay = "none"
    min_lr: float = 0.0
    grad_clip: float = 0.0
    precision: Precision = "fp32"
    compression: Compression = "none"
    topk_fraction: float = 0.01
    schedule: Schedule = "auto"
    eval_interval_steps: int = 0
    eval_iters: int = 20
    replicas: int | Literal["auto"] = 1
    """Data-parallel copies of the pipeline: a number, or ``"auto"`` (the planner picks R for the most
    tokens/s, never predicted slower than the best single member). 1: one pipeline (today's plans)."""
    sync: ReplicaSync = "auto"
    """How replicas keep in sync: gradients averaged ``every_step`` (the same computation as one process),
    ``diloco`` (``diloco.inner_steps`` local steps between outer steps; for slow links), or ``auto`` (the
    planner picks from the measured links). ``compression`` (fp16, bf16, int8) also compresses the every-step
    gradient all-reduce (replicas stay identical; no longer exactly one process's computation)."""
    diloco: DiLoCoSpec = DiLoCoSpec()
    use_all_devices: bool = False
    """Give every member work even where the predicted step is slower with it (to see the job spread, or to test
    the distribution itself). By default a device is in the plan only where the step gets faster with it, or the
    model needs its memory; the members left out are spares (unpaid; they take a place when one is lost)."""

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.micro_batches

    def lr_at(self, step: int) -> float:
        """Learning rate for (0-based) ``step``: linear warmup to ``lr`` over ``warmup_steps``, then constant
        or cosine decay to ``min_lr`` at ``steps`` (nanoGPT's ``get_lr``)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.lr_decay == "none":
            return self.lr
        span = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)


@dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoint every ``interval_steps`` (0 = only at the end); keep the newest ``keep``."""

    interval_steps: int = 100
    keep: int = 3


@dataclass(frozen=True)
class AdmissionSpec:
    """Who may join: anyone (``open``) or only the listed peer ids (``allowlist``)."""

    mode: AdmissionMode = "open"
    peers: tuple[str, ...] = ()

    def admits(self, peer_id: str) -> bool:
        return self.mode == "open" or peer_id in self.peers


DeviceKind = Literal["cpu", "cuda", "mps"]
DEVICE_KINDS: tuple[DeviceKind, ...] = ("cpu", "cuda", "mps")


@dataclass(frozen=True)
class NeedsSpec:
    """What the job asks of its devices (``[needs]``; matched by ``arceusd.market.needs``). Zero / empty means
    "not stated". ``deadline_hours``: the job should end within that long of its start; ``max_price_per_hour``:
    the most it pays a device per hour; ``budget_usd``: the most it pays in all."""

    memory_total_mib: int = 0
    memory_per_device_mib: int = 0
    device_kinds: tuple[DeviceKind, ...] = ()
    min_members: int = 1
    max_members: int = 0
    deadline_hours: float = 0.0
    max_price_per_hour: float = 0.0
    budget_usd: float = 0.0


@dataclass(frozen=True)
class JobSpec:
    """A validated job spec. ``base_dir`` (where relative data paths resolve) is local, not part of the spec's
    identity: it is excluded from equality, ``to_dict`` and the spec hash."""

    name: str
    seed: int
    model: MLPConfig | GPTConfig | HFModelConfig
    data: DataSpec
    training: TrainingSpec
    checkpoint: CheckpointSpec = CheckpointSpec()
    admission: AdmissionSpec = AdmissionSpec()
    needs: NeedsSpec = NeedsSpec()
    base_dir: Path | None = field(default=None, compare=False)

    def data_path(self) -> Path:
        """The data folder (MNIST) or file (text), resolved against ``base_dir``."""
        raw = self.data.dir if isinstance(self.data, MnistDataSpec) else self.data.path
        return resolve_path(raw, self.base_dir)


def resolve_path(raw: str, base_dir: Path | None) -> Path:
    """``~`` expanded; a relative path joins ``base_dir`` (the spec file's folder), else the cwd."""
    p = Path(raw).expanduser()
    if p.is_absolute() or base_dir is None:
        return p
    return base_dir / p
