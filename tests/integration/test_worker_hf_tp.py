"""A stock Llama (grouped-query attention) with a tensor-parallel stage, trained by real stage-worker processes
over the authenticated transport, equals a plain single-process ``transformers`` loop.

Three workers: the embedding and the first decoder layer on one, the other two layers and the head split over
two ranks (one KV head and its two query heads each, MLP columns 30/18). Every worker's losses and the weights
gathered from the workers' last checkpoint shards (``reslice``, as the export does) match
``AutoModelForCausalLM`` trained on the same batches within 1e-4, and the export loads in ``from_pretrained``.
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
from arceusd.models.hf.keys import hf_key
from arceusd.worker.protocol import StepEvent
from arceusd.worker.tp_split import TPSplit
from tests.integration.worker_harness import Layout, WorkerJob, stock_lm_spec, transformers_sgd_run

pytestmark = pytest.mark.slow

STEPS = 3
TOL = 1e-4
CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 2048,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def llama_spec(tmp: Path) -> JobSpec:
    return stock_lm_spec(tmp, "tp-llama", CONFIG, STEPS)


def transformers_run(spec: JobSpec) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The plain loop: ``AutoModelForCausalLM`` from the Arceus blocks' initial tensors, the job's batches."""
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(transformers_config(cfg))  # type: ignore[no-untyped-call]
    initial = {
        hf_key(cfg, i, local): p.detach().clone()
        for i, block in enumerate(build_blocks(cfg, spec.seed))
        for local, p in block.named_parameters()
    }
    missing, unexpected = model.load_state_dict(initial, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return transformers_sgd_run(model, spec, STEPS)


def split_stage_state(tmp_path: Path, spec: JobSpec, ref_losses: list[float]) -> dict[str, torch.Tensor]:
    """Train ``spec`` over worker processes, its first two blocks whole and the rest split over two tensor ranks;
    every worker's losses must be ``ref_losses`` (within :data:`TOL`); the checkpoint's state, the split gathered."""
    layout: Layout = [(0, 2, None), (2, 5, TPSplit(heads=(1, 1), columns=(30, 18)))]
    with WorkerJob(tmp_path, spec, layout, schedule="1f1b", checkpoint_interval=STEPS) as job:
        job.start(timeout=120)
        job.run(timeout=240)
        for w in job.workers:
            losses = [e.loss for e in w.of(StepEvent)]
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=0, atol=TOL)
        shards = [p.read_bytes() for p in sorted(step_dir(job.checkpoint_dir, STEPS).glob("stage*.safetensors"))]
    assert len(shards) == 3
    return assemble(spec.model, shards)


def test_a_tensor_parallel_llama_stage_over_worker_processes_equals_plain_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCEUS_TOKEN_CACHE", str(tmp_path / "tokens"))  # the workers inherit it
    spec = llama_spec(tmp_path)
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    ref_losses, ref_state = transformers_run(spec)
    state = split_stage_state(tmp_path, spec, ref_losses)  # "<block>.<local>", the split layers gathered
    got = {hf_key(cfg, int(k.partition(".")[0]), k.partition(".")[2]): v for k, v in state.items()}
    assert set(got) == set(ref_state)
    for key, value in ref_state.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=TOL, msg=key)
    write_hf_export(tmp_path / "export", cfg, state)
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"))
    q = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(dict(loaded.named_parameters())[q].detach(), got[q])
