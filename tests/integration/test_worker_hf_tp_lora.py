"""LoRA on a tensor-parallel stage, trained by real stage-worker processes over the authenticated transport,
equals one ``peft.get_peft_model`` process (issue 30 item 6).

The tiny Llama of ``test_worker_hf_tp`` with adapters on every projection: the embedding and the first decoder
layer on one worker, the other two layers and the head split over two ranks (one KV head each, MLP columns
30/18; ``lora_B`` of q/k/v/gate/up and ``lora_A`` of o/down split with them). Every worker's losses and the
adapters gathered from the last checkpoint's shards (as the export does) match peft trained on the same batches
within 1e-4, and the export from them loads in ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import AutoModelForCausalLM, PreTrainedModel

from arceusd.jobs.spec.schema import JobSpec
from arceusd.models.build import build_blocks
from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import hf_key
from arceusd.models.hf.lora_export import write_lora_export
from arceusd.models.hf.lora_keys import peft_key
from tests.integration.test_worker_hf_tp import CONFIG, STEPS, TOL, split_stage_state
from tests.integration.worker_harness import stock_lm_spec, transformers_sgd_run

pytestmark = pytest.mark.slow

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_spec(tmp: Path) -> JobSpec:
    return stock_lm_spec(tmp, "tp-llama-lora", CONFIG, STEPS, lora={"r": 4, "alpha": 8, "target_modules": TARGETS})


def base_model(cfg: HFModelConfig, seed: int) -> PreTrainedModel:
    """``AutoModelForCausalLM`` holding the Arceus blocks' frozen base (built from the job's seed)."""
    base: PreTrainedModel = AutoModelForCausalLM.from_config(transformers_config(cfg))  # type: ignore[no-untyped-call]
    initial = {}
    for i, block in enumerate(build_blocks(cfg, seed)):
        for local, t in [*block.named_parameters(), *block.named_buffers()]:
            if ".lora_" not in local and not local.startswith("rotary."):
                initial[hf_key(cfg, i, local.replace(".base_layer.", "."))] = t.detach().clone()
    missing, unexpected = base.load_state_dict(initial, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return base


def peft_run(spec: JobSpec) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One peft process from the Arceus blocks' initial adapters, on the job's batches: losses, adapters."""
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig) and cfg.lora is not None
    model = get_peft_model(
        base_model(cfg, spec.seed),
        LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=0.0, target_modules=list(cfg.lora.targets)),
    )
    start = {
        peft_key(cfg, i, local): p.detach().clone()
        for i, block in enumerate(build_blocks(cfg, spec.seed))
        for local, p in block.named_parameters()
    }
    assert not set_peft_model_state_dict(model, start).unexpected_keys  # type: ignore[attr-defined]
    losses, _ = transformers_sgd_run(model, spec, STEPS)
    return losses, {k: v.detach() for k, v in get_peft_model_state_dict(model).items()}


def test_a_tensor_parallel_lora_stage_over_worker_processes_equals_one_peft_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARCEUS_TOKEN_CACHE", str(tmp_path / "tokens"))  # the workers inherit it
    spec = lora_spec(tmp_path)
    cfg = spec.model
    assert isinstance(cfg, HFModelConfig)
    ref_losses, ref_adapters = peft_run(spec)
    state = split_stage_state(tmp_path, spec, ref_losses)  # "<block>.<local>", the split adapters gathered
    got = {peft_key(cfg, int(k.partition(".")[0]), k.partition(".")[2]): v for k, v in state.items()}
    assert set(got) == set(ref_adapters)
    for key, value in ref_adapters.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=TOL, msg=key)
    assert any(".lora_B." in k and float(v.abs().max()) > 0 for k, v in got.items())
    write_lora_export(tmp_path / "export", cfg, state, None, spec.seed, None)
    loaded = PeftModel.from_pretrained(base_model(cfg, spec.seed), str(tmp_path / "export"))
    key = "base_model.model.model.layers.2.mlp.down_proj.lora_A.weight"
    assert torch.equal(get_peft_model_state_dict(loaded)[key], got[key])
