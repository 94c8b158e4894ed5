"""Real daemons fine-tune LoRA adapters on a frozen tiny Llama from a spec with ``[lora]``: the checkpoints hold
the adapters alone, the export folder loads with ``PeftModel.from_pretrained`` on the base and its ``merged/`` with
``AutoModelForCausalLM`` (the same logits), and the daemons never import torch, transformers or peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arceusd.cli.swarm import LocalSwarm
from arceusd.jobs.plans.job_paths import WEIGHTS_COPY_NAME
from tests.integration.test_hf_job import CONFIG, _base, member_read_only_its_slice
from tests.integration.test_recovery import submit, wait_end

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SPEC = """
name = "tiny-llama-lora"
seed = 5
[model]
type = "hf"
config = "config.json"
block_size = 32
weights = "base.safetensors"
[data]
kind = "tokens"
path = "shakespeare.txt"
tokenizer = "{tokenizer}"
val_fraction = 0.1
[lora]
r = 4
alpha = 8
target_modules = ["q_proj", "v_proj"]
merge = true
[training]
use_all_devices = true
steps = 8
batch_size = 8
micro_batches = 2
optimizer = "adamw"
lr = 1e-2
eval_iters = 2
[checkpoint]
interval_steps = 4
"""


@pytest.mark.timeout(600)
def test_daemons_fine_tune_lora_adapters_whose_export_loads_in_peft(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "shakespeare.txt").write_text((ROOT / "data" / "tinyshakespeare" / "input.txt").read_text()[:40000])
    _base(tmp_path / "base.safetensors")
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC.format(tokenizer=ROOT / "data" / "tokenizers" / "shakespeare-bpe.json"))
    s = LocalSwarm(
        tmp_path / "swarm", 2, ["--auto-join"], preset="lan", env={"ARCEUS_TOKEN_CACHE": str(tmp_path / "tokens")}
    )
    try:
        s.start()
        s.wait_converged()
        job_id = submit(s, spec, members=2)
        end = wait_end(s, job_id, timeout=450)
        assert end["state"] == "done", end
        for i in range(s.size):
            packages = s.call(i, "modules")["packages"]
            assert not {"torch", "transformers", "peft"} & set(packages), packages
        folder = Path(end["model_path"]).parent
        shards = sorted(folder.parent.glob("checkpoints/step-*/stage*.safetensors"))
        member_configs = sorted((s.state_dir(1) / "jobs" / job_id).glob("worker-*.json"))
        weights_dir = s.state_dir(1) / "jobs" / job_id / "weights"
        # the standby of a LoRA job also keeps the whole frozen base, checked, to lead and export from after a
        # take-over (job_paths.weights_copy); its worker reads only its place's slice
        if end["standby"] == s.call(1, "status")["peer_id"]:
            assert (weights_dir / WEIGHTS_COPY_NAME).is_file(), sorted(weights_dir.iterdir())
        member_files = sorted(p for p in weights_dir.iterdir() if p.name != WEIGHTS_COPY_NAME)
    finally:
        s.close()
    member_read_only_its_slice(tmp_path / "base.safetensors", s.state_dir(1), member_configs, member_files)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "merged"} <= {
        p.name for p in folder.iterdir()
    }

    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert shards
    for shard in shards:  # adapters and their optimizer state only: nothing of the frozen base
        assert all(".lora_A." in k or ".lora_B." in k for k in load_file(str(shard))), shard
    adapters = load_file(str(folder / "adapter_model.safetensors"))
    assert any(".lora_B." in k and float(v.abs().max()) > 0 for k, v in adapters.items())  # they trained
    base = AutoModelForCausalLM.from_pretrained(str(folder / "merged"))  # for its config; the base tensors next
    base.load_state_dict(load_file(str(tmp_path / "base.safetensors")), strict=True)
    tuned = PeftModel.from_pretrained(base, str(folder))
    merged = AutoModelForCausalLM.from_pretrained(str(folder / "merged"))
    ids = AutoTokenizer.from_pretrained(str(folder))("ROMEO: my lord", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(tuned(input_ids=ids).logits, merged(input_ids=ids).logits, rtol=0, atol=1e-5)
