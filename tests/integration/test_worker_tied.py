"""Tied embeddings split across real stage-worker processes equal a plain single-process ``transformers`` loop.

A tiny tied GPT-2 in 2 stages (also as 2 data-parallel replicas) and a tiny tied Llama in 3 stages train on
tokenized Tiny Shakespeare over the authenticated transport: the first and the last stage sum their gradients of
the tied weight over their ``tie`` stream each step. Every worker's losses and the final weights (gathered from
the workers' last checkpoint shards) match ``AutoModelForCausalLM`` trained on the same batches within 1e-5; the
embedding's and the head's copies are bit-identical; the export folder stores the weight once and
``from_pretrained`` loads it tied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from arceusd.files.checkpoint import step_dir
from arceusd.jobs.procs.export import assemble
from arceusd.jobs.spec.schema import JobSpec
from arceusd.models.build import build_blocks
from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.export import write_hf_export
from arceusd.models.hf.keys import hf_key, tied_names
from arceusd.worker.protocol import ReplicaSyncConfig, StepEvent
from tests.integration.worker_harness import Layout, WorkerJob, stock_lm_spec, transformers_sgd_run

pytestmark = pytest.mark.slow

STEPS = 3
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": 2048,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 32,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    },
    "llama": {
        "model_type": "llama",
        "vocab_size": 2048,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    },
}


def tied_spec(tmp: Path, name: str) -> JobSpec:
    """SGD with clipping below the gradient's norm (it sees a tied weight counted twice; AdamW would turn 1e-9
    noise on rare embedding rows into whole steps, as test_worker_exact says)."""
    return stock_lm_spec(tmp, f"tied-{name}", CONFIGS[name], STEPS)


def transformers_run(spec: JobSpec) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The plain loop: ``AutoModelForCausalLM`` from the Arceus blocks' initial tensors, the job's batches."""
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(transformers_config(cfg))  # type: ignore[no-untyped-call]
    initial: dict[str, torch.Tensor] = {}
    for i, block in enumerate(build_blocks(cfg, spec.seed)):
        for local, p in block.named_parameters():
            initial[hf_key(cfg, i, local)] = p.detach().clone()
    missing, unexpected = model.load_state_dict(initial, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected, (missing, unexpected)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # type: ignore[no-untyped-call]
    return transformers_sgd_run(model, spec, STEPS)


@pytest.mark.parametrize(
    ("name", "layout", "replicas"),
    [
        ("gpt2", [(0, 2, None), (2, 4, None)], 1),
        ("llama", [(0, 1, None), (1, 3, None), (3, 5, None)], 1),
        ("gpt2", [(0, 2, None), (2, 4, None)], 2),
    ],
    ids=["gpt2-2-stages", "llama-3-stages", "gpt2-2-stages-x2-replicas"],
)
def test_a_tied_model_split_over_worker_processes_equals_plain_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, layout: Layout, replicas: int
) -> None:
    monkeypatch.setenv("ARCEUS_TOKEN_CACHE", str(tmp_path / "tokens"))  # the workers inherit it
    spec = tied_spec(tmp_path, name)
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    ref_losses, ref_state = transformers_run(spec)
    sync = ReplicaSyncConfig(mode="allreduce", bucket_bytes=4096) if replicas > 1 else None
    with WorkerJob(
        tmp_path, spec, layout, schedule="1f1b", checkpoint_interval=STEPS, replicas=replicas, replica_sync=sync
    ) as job:
        job.start(timeout=120)
        job.run(timeout=240)
        for w in job.workers:
            losses = [e.loss for e in w.of(StepEvent)]
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=1e-5)
        got = job.gathered_params(STEPS)  # "<block>.<local>", the head's copy included
        shards = [p.read_bytes() for p in sorted(step_dir(job.checkpoint_dir, STEPS).glob("stage*.safetensors"))]
    names = tied_names(cfg)
    assert names is not None
    last = layout[-1][1] - 1
    owner, copy = got[f"0.{names[0]}"], got[f"{last}.{names[1]}"]
    assert torch.equal(owner, copy)  # the two copies, bit for bit
    state = {hf_key(cfg, int(key.partition(".")[0]), key.partition(".")[2]): v for key, v in got.items()}
    assert set(state) == set(ref_state)
    for key, value in ref_state.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-5, msg=key)

    exported = write_hf_export(tmp_path / "export", cfg, assemble(cfg, shards))  # the tied weight stored once
    from safetensors import safe_open

    with safe_open(str(exported), framework="pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"))
    weights = dict(loaded.named_parameters(remove_duplicate=False))
    assert weights["lm_head.weight"] is weights[hf_key(cfg, 0, names[0])]  # tied again
    assert torch.equal(weights["lm_head.weight"].detach(), owner)
