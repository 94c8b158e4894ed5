"""The job spec's schema checks: every field of a parsed TOML/JSON document read, bounded and validated into a
:class:`arceusd.jobs.spec.parsed.JobSpec` (:func:`parse_document`), collecting every problem with its field path.

The schema and the entry points are :mod:`arceusd.jobs.spec.schema`'s (its docstring lists the fields); the spec's
canonical form and identity are :mod:`arceusd.jobs.spec.identity`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arceusd.data.errors import DataError
from arceusd.data.mnist_files import DEFAULT_MEAN, DEFAULT_STD, NUM_CLASSES
from arceusd.data.steps import epoch_steps, window_epoch_steps
from arceusd.jobs.spec import hf as spec_hf
from arceusd.jobs.spec import lora as spec_lora
from arceusd.jobs.spec.datafacts import MnistFacts, TextFacts, mnist_facts, text_facts
from arceusd.jobs.spec.fields import FieldReader
from arceusd.jobs.spec.hf import TokensFacts
from arceusd.jobs.spec.parsed import (
    ADMISSION_MODES,
    COMPRESSIONS,
    DEVICE_KINDS,
    DILOCO_COMPRESSIONS,
    LR_DECAYS,
    MAX_REPLICAS,
    OPTIMIZERS,
    PRECISIONS,
    REPLICA_SYNCS,
    SCHEDULES,
    SPEC_VERSION,
    AdmissionSpec,
    CheckpointSpec,
    DataSpec,
    DiLoCoSpec,
    JobSpec,
    MnistDataSpec,
    NeedsSpec,
    TextDataSpec,
    TokensDataSpec,
    TrainingSpec,
    resolve_path,
)
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.models.hf.config import HFModelConfig

#: Ceilings that keep a hostile or mistyped spec from asking for absurd sizes.
MAX_WIDTH = 1 << 20
MAX_LAYERS = 1024
MAX_STEPS = 10**9
MAX_BATCH = 1 << 20
MAX_SEED = 2**63 - 1
MNIST_MLP_INPUTS = 784

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
_PEER_ID_RE = re.compile(r"^[0-9a-f]{32}$")

TOP_KEYS = ("spec_version", "name", "seed", "model", "data", "training", "checkpoint", "admission", "needs", "lora")
MLP_KEYS = ("type", "layer_sizes")
GPT_KEYS = ("type", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout", "bias")
MNIST_KEYS = (
    "kind",
    "dir",
    "train_count",
    "holdout_count",
    "mean",
    "std",
    "split_seed",
    "images",
    "labels",
    "sha256",
)
TEXT_KEYS = ("kind", "path", "val_fraction", "sha256")
TRAINING_KEYS = (
    "steps",
    "epochs",
    "batch_size",
    "micro_batches",
    "optimizer",
    "lr",
    "weight_decay",
    "momentum",
    "betas",
    "warmup_steps",
    "lr_decay",
    "min_lr",
    "grad_clip",
    "precision",
    "compression",
    "topk_fraction",
    "schedule",
    "eval_interval_steps",
    "eval_iters",
    "replicas",
    "sync",
    "diloco",
    "use_all_devices",
)
DILOCO_KEYS = ("inner_steps", "outer_lr", "outer_momentum", "compression")
CHECKPOINT_KEYS = ("interval_steps", "keep")
ADMISSION_KEYS = ("mode", "peers")
NEEDS_KEYS = (
    "memory_total_mib",
    "memory_per_device_mib",
    "device_kinds",
    "min_members",
    "max_members",
    "deadline_hours",
    "max_price_per_hour",
    "budget_usd",
)
MAX_MEMORY_MIB = 1 << 30
MAX_MEMBERS = 256


def parse_document(r: FieldReader, doc: dict[str, Any], base_dir: Path | None, check_files: bool) -> JobSpec | None:
    """Read ``doc`` into a spec, recording every problem on ``r`` (None when it cannot be built)."""
    return _Parser(r, doc, base_dir, check_files).parse()


@dataclass
class _Model:
    kind: str
    layer_sizes: tuple[int, ...] | None = None
    gpt: dict[str, Any] | None = None
    vocab_auto: bool = False
    hf: HFModelConfig | None = None


class _Parser:
    def __init__(self, r: FieldReader, doc: dict[str, Any], base_dir: Path | None, check_files: bool) -> None:
        self.r = r
        self.doc = doc
        self.base_dir = base_dir
        self.check_files = check_files

    def parse(self) -> JobSpec | None:
        r, doc = self.r, self.doc
        r.unknown_keys(doc, TOP_KEYS, "")
        version = r.integer(doc, "spec_version", "", SPEC_VERSION)
        if version is not None and version != SPEC_VERSION:
            r.problem("spec_version", f"unsupported version {version}; this daemon reads version {SPEC_VERSION}")
        name = r.string(doc, "name", "", max_len=64)
        if name is not None and not _NAME_RE.match(name):
            r.problem("name", f"got {name!r}; allowed: 1-64 characters of A-Z a-z 0-9 . _ -")
        seed = r.integer(doc, "seed", "", 0, lo=0, hi=MAX_SEED)
        model = self._model()
        data = self._data()
        facts = self._facts(data)
        training = self._training(data, model, facts)
        checkpoint = self._checkpoint()
        admission = self._admission()
        needs = self._needs()
        model_cfg = self._cross_check(model, data, facts, training)
        model_cfg = spec_lora.with_lora(r, doc, model_cfg)  # [lora]: adapters on a frozen stock LM
        if r.problems or name is None or seed is None or data is None or model_cfg is None:
            return None
        if training is None or checkpoint is None or admission is None or needs is None:
            return None
        data = _with_facts(data, facts)
        return JobSpec(
            name=name,
            seed=seed,
            model=model_cfg,
            data=data,
            training=training,
            checkpoint=checkpoint,
            admission=admission,
            needs=needs,
            base_dir=self.base_dir,
        )

    # -- [model]
    def _model(self) -> _Model | None:
        r = self.r
        t = r.table(self.doc, "model", "", required=True)
        if t is None:
            return None
        kind = r.choice(t, "type", "model", ("mlp", "gpt", "hf"))
        if kind == "hf":  # a stock transformers architecture (arceusd/jobs/spec/hf.py)
            return _Model("hf", hf=spec_hf.parse_hf_model(r, t, self.base_dir, self.check_files))
        if kind == "mlp":
            r.unknown_keys(t, MLP_KEYS, "model")
            sizes = r.int_list(t, "layer_sizes", "model", min_len=2, max_len=MAX_LAYERS + 1, lo=1, hi=MAX_WIDTH)
            return _Model("mlp", layer_sizes=sizes)
        if kind == "gpt":
            r.unknown_keys(t, GPT_KEYS, "model")
            g: dict[str, Any] = {
                "n_layer": r.integer(t, "n_layer", "model", lo=1, hi=MAX_LAYERS),
                "n_head": r.integer(t, "n_head", "model", lo=1, hi=4096),
                "n_embd": r.integer(t, "n_embd", "model", lo=1, hi=MAX_WIDTH),
                "block_size": r.integer(t, "block_size", "model", lo=1, hi=MAX_WIDTH),
                "dropout": r.number(t, "dropout", "model", 0.0, lo=0.0, hi=1.0, hi_open=True),
                "bias": r.boolean(t, "bias", "model", True),
            }
            vocab = t.get("vocab_size")
            auto = vocab == "auto"
            if isinstance(vocab, str) and not auto:
                r.problem("model.vocab_size", f"got {vocab!r}; allowed: a positive integer or 'auto'")
                g["vocab_size"] = None
            else:
                g["vocab_size"] = None if auto else r.integer(t, "vocab_size", "model", lo=1, hi=MAX_WIDTH)
            if g["n_embd"] is not None and g["n_head"] is not None and g["n_embd"] % g["n_head"]:
                r.problem(
                    "model.n_embd",
                    f"{g['n_embd']} is not divisible by model.n_head = {g['n_head']}; "
                    "each head needs n_embd / n_head channels",
                )
            return _Model("gpt", gpt=g, vocab_auto=auto)
        return None

    # -- [data]
    def _data(self) -> DataSpec | None:
        r = self.r
        t = r.table(self.doc, "data", "", required=True)
        if t is None:
            return None
        kind = r.choice(t, "kind", "data", ("mnist", "text", "tokens"))
        digest = self._digest(t)
        if kind == "tokens":
            return spec_hf.parse_tokens_data(r, t, digest)
        if kind == "mnist":
            r.unknown_keys(t, MNIST_KEYS, "data")
            directory = r.string(t, "dir", "data")
            train = r.integer(t, "train_count", "data", lo=1, hi=MAX_STEPS)
            hold = r.integer(t, "holdout_count", "data", 0, lo=0, hi=MAX_STEPS)
            mean = r.number(t, "mean", "data", DEFAULT_MEAN, lo=-1e6, hi=1e6)
            std = r.number(t, "std", "data", DEFAULT_STD, lo=0.0, lo_open=True, hi=1e6)
            split_seed = r.integer(t, "split_seed", "data", None, lo=0, hi=MAX_SEED)
            images = r.string(t, "images", "data", None, max_len=255)
            labels = r.string(t, "labels", "data", None, max_len=255)
            if ("images" in t) != ("labels" in t):
                r.problem("data.images", "give both data.images and data.labels, or neither (to find them in dir)")
            if directory is None or train is None or hold is None or mean is None or std is None:
                return None
            return MnistDataSpec(
                dir=directory,
                train_count=train,
                holdout_count=hold,
                mean=mean,
                std=std,
                split_seed=split_seed,
                images=images,
                labels=labels,
                sha256=digest,
            )
        if kind == "text":
            r.unknown_keys(t, TEXT_KEYS, "data")
            path = r.string(t, "path", "data")
            val = r.number(t, "val_fraction", "data", 0.1, lo=0.0, hi=1.0, hi_open=True)
            if path is None or val is None:
                return None
            return TextDataSpec(path=path, val_fraction=val, sha256=digest)
        return None

    def _digest(self, t: Mapping[str, Any]) -> str | None:
        d = self.r.string(t, "sha256", "data", None, max_len=64)
        if d is not None and not _HEX64_RE.match(d):
            self.r.problem("data.sha256", f"got {d!r}; allowed: 64 lowercase hex characters (a sha256 digest)")
            return None
        return d

    def _facts(self, data: DataSpec | None) -> MnistFacts | TextFacts | TokensFacts | None:
        if data is None or not self.check_files:
            return None
        if isinstance(data, TokensDataSpec):
            return spec_hf.tokens_facts(self.r, data, self.base_dir)
        try:
            if isinstance(data, MnistDataSpec):
                facts: MnistFacts | TextFacts = mnist_facts(
                    resolve_path(data.dir, self.base_dir), data.images, data.labels
                )
            else:
                facts = text_facts(resolve_path(data.path, self.base_dir), data.val_fraction)
        except DataError as e:
            where = "data.dir" if isinstance(data, MnistDataSpec) else "data.path"
            self.r.problem(where, f"{e} (relative paths resolve from the spec file's folder: {self.base_dir})")
            return None
        if data.sha256 is not None and data.sha256 != facts.sha256:
            self.r.problem(
                "data.sha256",
                f"the data files' digest is {facts.sha256}, not {data.sha256}; the files changed or the spec "
                "names the wrong ones",
            )
        return facts

    # -- [training]
    def _training(
        self, data: DataSpec | None, model: _Model | None, facts: MnistFacts | TextFacts | TokensFacts | None
    ) -> TrainingSpec | None:
        r = self.r
        t = r.table(self.doc, "training", "", required=True)
        if t is None:
            return None
        p = "training"
        r.unknown_keys(t, TRAINING_KEYS, p)
        steps = r.integer(t, "steps", p, None, lo=1, hi=MAX_STEPS)
        epochs = r.integer(t, "epochs", p, None, lo=1, hi=MAX_STEPS)
        batch = r.integer(t, "batch_size", p, lo=1, hi=MAX_BATCH)
        micro = r.integer(t, "micro_batches", p, 1, lo=1, hi=MAX_BATCH)
        optimizer = r.choice(t, "optimizer", p, OPTIMIZERS)
        lr = r.number(t, "lr", p, lo=0.0, lo_open=True, hi=1e3)
        weight_decay = r.number(t, "weight_decay", p, 0.01 if optimizer == "adamw" else 0.0, lo=0.0, hi=1e3)
        momentum = r.number(t, "momentum", p, 0.0, lo=0.0, hi=1.0, hi_open=True)
        betas = r.number_pair(t, "betas", p, (0.9, 0.999), lo=0.0, hi=1.0)
        if optimizer == "adamw" and "momentum" in t:
            r.problem("training.momentum", "applies only with optimizer = 'sgd' (adamw uses training.betas)")
        if optimizer == "sgd" and "betas" in t:
            r.problem("training.betas", "applies only with optimizer = 'adamw' (sgd uses training.momentum)")
        warmup = r.integer(t, "warmup_steps", p, 0, lo=0, hi=MAX_STEPS)
        decay = r.choice(t, "lr_decay", p, LR_DECAYS, "none")
        min_lr = r.number(t, "min_lr", p, 0.0, lo=0.0, hi=1e3)
        grad_clip = r.number(t, "grad_clip", p, 0.0, lo=0.0, hi=1e6)
        precision = r.choice(t, "precision", p, PRECISIONS, "fp32")
        compression = r.choice(t, "compression", p, COMPRESSIONS, "none")
        topk = r.number(t, "topk_fraction", p, 0.01, lo=0.0, lo_open=True, hi=1.0)
        if "topk_fraction" in t and compression not in ("topk", None):
            r.problem("training.topk_fraction", "applies only with compression = 'topk'")
        schedule = r.choice(t, "schedule", p, SCHEDULES, "auto")
        eval_interval = r.integer(t, "eval_interval_steps", p, 0, lo=0, hi=MAX_STEPS)
        eval_iters = r.integer(t, "eval_iters", p, 20, lo=0, hi=100_000)
        replicas = self._replicas(t)
        sync = r.choice(t, "sync", p, REPLICA_SYNCS, "auto")
        diloco = self._diloco(t)
        use_all = r.boolean(t, "use_all_devices", p, False)
        if replicas == 1 and sync == "diloco":
            r.problem("training.sync", "'diloco' needs training.replicas >= 2 or 'auto'; one pipeline has no peer")
        if "diloco" in t and sync == "every_step":
            r.problem("training.diloco", "applies only with training.sync = 'diloco' or 'auto'")
        share = replicas * micro if isinstance(replicas, int) and replicas > 1 and micro is not None else None
        if share is not None and batch is not None and batch % share:
            r.problem(
                "training.replicas",
                f"training.batch_size = {batch} does not split into {replicas} replicas x {micro} "
                f"micro-batches; batch_size must be a multiple of {share}",
            )

        if batch is not None and micro is not None:
            if micro > batch:
                r.problem(
                    "training.micro_batches",
                    f"{micro} micro-batches exceed training.batch_size = {batch}; allowed: 1..{batch}",
                )
            elif batch % micro:
                divisors = [d for d in range(1, min(batch, 64) + 1) if batch % d == 0]
                r.problem(
                    "training.micro_batches",
                    f"training.batch_size = {batch} is not divisible by {micro}; micro-batches must be "
                    f"equal, "
                    f"e.g. one of {divisors}",
                )
        if isinstance(data, MnistDataSpec) and batch is not None and batch > data.train_count:
            r.problem(
                "training.batch_size",
                f"{batch} exceeds data.train_count = {data.train_count}; allowed: 1..{data.train_count}",
            )
        if lr is not None and min_lr is not None and min_lr > lr:
            r.problem("training.min_lr", f"{min_lr} is above training.lr = {lr}; allowed: 0..lr")
        steps = self._resolve_steps(t, steps, epochs, batch, data, model, facts)
        if steps is not None and warmup is not None and warmup > steps:
            r.problem("training.warmup_steps", f"{warmup} exceeds the run's {steps} steps; allowed: 0..{steps}")
        kw: dict[str, Any] = {
            "steps": steps,
            "batch_size": batch,
            "micro_batches": micro,
            "optimizer": optimizer,
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "betas": betas,
            "warmup_steps": warmup,
            "lr_decay": decay,
            "min_lr": min_lr,
            "grad_clip": grad_clip,
            "precision": precision,
            "compression": compression,
            "topk_fraction": topk,
            "schedule": schedule,
            "eval_interval_steps": eval_interval,
            "eval_iters": eval_iters,
            "replicas": replicas,
            "sync": sync,
            "diloco": diloco,
            "use_all_devices": use_all,
        }
        given = t.get("diloco")
        inner_given = isinstance(given, dict) and "inner_steps" in given
        if inner_given and steps is not None and diloco is not None and diloco.inner_steps > steps:
            r.problem(
                "training.diloco.inner_steps",
                f"{diloco.inner_steps} exceeds the run's {steps} steps: the replicas would never sync; "
                f"allowed: 1..{steps}",
            )
        if any(v is None for v in kw.values()):
            return None
        return TrainingSpec(epochs=epochs, **kw)

    def _replicas(self, t: Mapping[str, Any]) -> int | str | None:
        value = t.get("replicas", 1)
        if value == "auto":
            return "auto"
        if isinstance(value, str):
            self.r.problem("training.replicas", f"got {value!r}; allowed: an integer 1..{MAX_REPLICAS} or 'auto'")
            return None
        return self.r.integer(t, "replicas", "training", 1, lo=1, hi=MAX_REPLICAS)

    def _diloco(self, t: Mapping[str, Any]) -> DiLoCoSpec | None:
        r, p = self.r, "training.diloco"
        tbl = r.table(t, "diloco", "training", required=False)
        if tbl is None:
            return None if "diloco" in t else DiLoCoSpec()
        r.unknown_keys(tbl, DILOCO_KEYS, p)
        inner = r.integer(tbl, "inner_steps", p, 500, lo=1, hi=MAX_STEPS)
        outer_lr = r.number(tbl, "outer_lr", p, 0.7, lo=0.0, lo_open=True, hi=10.0)
        momentum = r.number(tbl, "outer_momentum", p, 0.9, lo=0.0, hi=1.0, hi_open=True)
        compression = r.choice(tbl, "compression", p, DILOCO_COMPRESSIONS, "int8")
        if inner is None or outer_lr is None or momentum is None or compression is None:
            return None
        return DiLoCoSpec(inner, outer_lr, momentum, compression)  # type: ignore[arg-type]

    def _resolve_steps(
        self,
        t: Mapping[str, Any],
        steps: int | None,
        epochs: int | None,
        batch: int | None,
        data: DataSpec | None,
        model: _Model | None,
        facts: MnistFacts | TextFacts | TokensFacts | None,
    ) -> int | None:
        r = self.r
        if "steps" not in t and "epochs" not in t:
            r.problem("training.steps", "missing: give training.steps or training.epochs")
            return None
        if isinstance(data, TokensDataSpec) and "epochs" in t:
            r.problem("training.epochs", "a tokens data set counts no epochs yet; give training.steps")
            return None
        if epochs is None or batch is None or data is None:
            return steps
        per_epoch: int | None = None
        if isinstance(data, MnistDataSpec):
            per_epoch = epoch_steps(data.train_count, batch) if batch <= data.train_count else None
        elif isinstance(facts, TextFacts) and model is not None and model.gpt is not None:
            block = model.gpt["block_size"]
            if block is not None:
                per_epoch = window_epoch_steps(facts.train_tokens, block, batch)
        if per_epoch is None:
            if steps is None and isinstance(data, TextDataSpec) and not self.check_files:
                r.problem("training.epochs", "a text job without its file cannot count epochs; give training.steps")
            return steps
        if steps is not None and steps != epochs * per_epoch:
            r.problem(
                "training.steps",
                f"{steps} contradicts training.epochs = {epochs} x {per_epoch} steps per epoch = "
                f"{epochs * per_epoch}; give only one of them",
            )
            return None
        return epochs * per_epoch

    # -- [checkpoint], [admission]
    def _checkpoint(self) -> CheckpointSpec | None:
        r = self.r
        t = r.table(self.doc, "checkpoint", "", required=False)
        if t is None:
            return CheckpointSpec() if "checkpoint" not in self.doc else None
        r.unknown_keys(t, CHECKPOINT_KEYS, "checkpoint")
        interval = r.integer(t, "interval_steps", "checkpoint", 100, lo=0, hi=MAX_STEPS)
        keep = r.integer(t, "keep", "checkpoint", 3, lo=1, hi=1000)
        if interval is None or keep is None:
            return None
        return CheckpointSpec(interval_steps=interval, keep=keep)

    def _admission(self) -> AdmissionSpec | None:
        r = self.r
        t = r.table(self.doc, "admission", "", required=False)
        if t is None:
            return AdmissionSpec() if "admission" not in self.doc else None
        r.unknown_keys(t, ADMISSION_KEYS, "admission")
        mode = r.choice(t, "mode", "admission", ADMISSION_MODES, "open")
        if mode == "open":
            if "peers" in t:
                r.problem("admission.peers", "applies only with mode = 'allowlist'")
            return AdmissionSpec()
        if mode != "allowlist":
            return None
        peers = t.get("peers")
        if not isinstance(peers, list) or not peers:
            r.problem("admission.peers", f"mode 'allowlist' needs a non-empty list of peer ids, got {peers!r}")
            return None
        bad = [p for p in peers if not (isinstance(p, str) and _PEER_ID_RE.match(p))]
        if bad:
            r.problem("admission.peers", f"{bad[0]!r} is not a peer id; allowed: 32 lowercase hex characters")
            return None
        if len(set(peers)) != len(peers) or len(peers) > 4096:
            r.problem("admission.peers", "peer ids must be unique and at most 4096")
            return None
        return AdmissionSpec(mode="allowlist", peers=tuple(sorted(peers)))

    # -- [needs]
    def _needs(self) -> NeedsSpec | None:
        r = self.r
        t = r.table(self.doc, "needs", "", required=False)
        if t is None:
            return NeedsSpec() if "needs" not in self.doc else None
        r.unknown_keys(t, NEEDS_KEYS, "needs")
        total = r.integer(t, "memory_total_mib", "needs", 0, lo=0, hi=MAX_MEMORY_MIB)
        per_device = r.integer(t, "memory_per_device_mib", "needs", 0, lo=0, hi=MAX_MEMORY_MIB)
        lo = r.integer(t, "min_members", "needs", 1, lo=1, hi=MAX_MEMBERS)
        hi = r.integer(t, "max_members", "needs", 0, lo=0, hi=MAX_MEMBERS)
        deadline = r.number(t, "deadline_hours", "needs", 0.0, lo=0.0, hi=24.0 * 366)
        price = r.number(t, "max_price_per_hour", "needs", 0.0, lo=0.0, hi=1e4)
        budget = r.number(t, "budget_usd", "needs", 0.0, lo=0.0, hi=1e9)
        kinds = t.get("device_kinds", [])
        if not isinstance(kinds, list) or not all(k in DEVICE_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            r.problem(
                "needs.device_kinds", f"got {kinds!r}; allowed: a list of distinct kinds from {', '.join(DEVICE_KINDS)}"
            )
            return None
        if lo is not None and hi is not None and hi and hi < lo:
            r.problem("needs.max_members", f"must be >= min_members ({lo}) or 0 (no maximum), got {hi}")
            return None
        if None in (total, per_device, lo, hi, deadline, price, budget):
            return None
        return NeedsSpec(
            memory_total_mib=total or 0,
            memory_per_device_mib=per_device or 0,
            device_kinds=tuple(sorted(kinds, key=DEVICE_KINDS.index)),
            min_members=lo or 1,
            max_members=hi or 0,
            deadline_hours=deadline or 0.0,
            max_price_per_hour=price or 0.0,
            budget_usd=budget or 0.0,
        )

    # -- cross-section checks; builds the model config
    def _cross_check(
        self,
        model: _Model | None,
        data: DataSpec | None,
        facts: MnistFacts | TextFacts | TokensFacts | None,
        training: TrainingSpec | None,
    ) -> MLPConfig | GPTConfig | HFModelConfig | None:
        r = self.r
        if model is None:
            return None
        if data is not None:
            want = {"mlp": "mnist", "gpt": "text", "hf": "tokens"}[model.kind]
            if data.kind != want:
                r.problem("model.type", f"{model.kind!r} needs data.kind = {want!r}, got {data.kind!r}")
                return None
        if model.kind == "mlp":
            return self._check_mlp(model, data, facts, training)
        if model.kind == "hf":
            if model.hf is not None:
                spec_hf.check_hf(r, model.hf, facts if isinstance(facts, TokensFacts) else None)
                spec_hf.check_hf_training(r, model.hf, training)
            return model.hf
        return self._check_gpt(model, data, facts, training)

    def _check_mlp(
        self,
        model: _Model,
        data: DataSpec | None,
        facts: MnistFacts | TextFacts | TokensFacts | None,
        training: TrainingSpec | None,
    ) -> MLPConfig | None:
        r = self.r
        sizes = model.layer_sizes
        if sizes is None:
            return None
        if isinstance(data, MnistDataSpec):
            inputs = facts.features if isinstance(facts, MnistFacts) else MNIST_MLP_INPUTS
            if sizes[0] != inputs:
                r.problem(
                    "model.layer_sizes",
                    f"first size is {sizes[0]} but MNIST images have {inputs} pixels; allowed: {inputs}",
                )
            if sizes[-1] != NUM_CLASSES:
                r.problem(
                    "model.layer_sizes",
                    f"last size is {sizes[-1]} but MNIST has {NUM_CLASSES} classes; allowed: {NUM_CLASSES}",
                )
            if isinstance(facts, MnistFacts) and data.train_count + data.holdout_count > facts.count:
                r.problem(
                    "data.train_count",
                    f"train_count + holdout_count = {data.train_count + data.holdout_count} exceeds the "
                    f"{facts.count} examples in {facts.images}",
                )
        return MLPConfig(layer_sizes=sizes)

    def _check_gpt(
        self,
        model: _Model,
        data: DataSpec | None,
        facts: MnistFacts | TextFacts | TokensFacts | None,
        training: TrainingSpec | None,
    ) -> GPTConfig | None:
        r = self.r
        g = dict(model.gpt or {})
        block = g.get("block_size")
        if isinstance(facts, TextFacts):
            if model.vocab_auto:
                g["vocab_size"] = facts.vocab_size
            elif g["vocab_size"] is not None and g["vocab_size"] < facts.vocab_size:
                r.problem(
                    "model.vocab_size",
                    f"{g['vocab_size']} is smaller than the text's {facts.vocab_size} distinct characters; "
                    f"allowed: >= {facts.vocab_size} or 'auto'",
                )
            if block is not None and facts.train_tokens < block + 1:
                r.problem(
                    "data.path",
                    f"the training split has {facts.train_tokens} characters, fewer than "
                    f"model.block_size + 1 = "
                    f"{block + 1}; use a longer text or a smaller block_size",
                )
            evaluates = training is None or training.eval_iters > 0
            if block is not None and evaluates and facts.val_tokens < block + 1:
                r.problem(
                    "data.val_fraction",
                    f"the validation split has {facts.val_tokens} characters, fewer than "
                    f"model.block_size + 1 "
                    f"= {block + 1}; raise val_fraction, or set training.eval_iters = 0",
                )
        elif model.vocab_auto and not self.check_files:
            r.problem(
                "model.vocab_size",
                "'auto' needs the text file to count characters; give an integer when there is no file",
            )
            return None
        if r.problems or any(v is None for v in g.values()):
            return None
        try:
            return GPTConfig(**g)
        except ValueError as e:  # the constructor's invariants, already checked field by field above
            r.problem("model", str(e))
            return None


def _with_facts(data: DataSpec, facts: MnistFacts | TextFacts | TokensFacts | None) -> DataSpec:
    """Record what inspecting the files resolved: the MNIST file names and the content digest."""
    if isinstance(data, MnistDataSpec) and isinstance(facts, MnistFacts):
        return MnistDataSpec(
            dir=data.dir,
            train_count=data.train_count,
            holdout_count=data.holdout_count,
            mean=data.mean,
            std=data.std,
            split_seed=data.split_seed,
            images=facts.images,
            labels=facts.labels,
            sha256=facts.sha256,
        )
    if isinstance(data, TokensDataSpec) and isinstance(facts, TokensFacts):
        return spec_hf.with_tokens_facts(data, facts)
    if isinstance(data, TextDataSpec) and isinstance(facts, TextFacts):
        return TextDataSpec(path=data.path, val_fraction=data.val_fraction, sha256=facts.sha256)
    return data


__all__ = ["MAX_MEMBERS", "MAX_MEMORY_MIB", "parse_document"]
