"""Real daemons fine-tune LoRA adapters on a frozen tiny Llama from a spec with ``[lora]``: the checkpoints hold
the adapters alone, the export folder loads with ``PeftModel.from_pretrained`` on the base and its ``merged/`` with
``AutoModelForCausalLM`` (the same logits), and the daemons never import torch, transformers or peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arceusd.swarm import LocalSwarm
from tests.integration.test_hf_job import CONFIG
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


def _base(path: Path) -> None:
    """The base: the architecture's initial tensors of another seed, under its own keys."""
    from safetensors.torch import save_file

    from arceusd.models.build import build_blocks
    from arceusd.models.hf.config import hf_config_from_dict
    from arceusd.models.hf.keys import hf_key

    config = hf_config_from_dict(CONFIG, 32)
    save_file(
        {
            hf_key(config, i, k): p.detach().contiguous()
            for i, b in enumerate(build_blocks(config, 11))
            for k, p in b.named_parameters()
        },
        str(path),
    )


def _member_read_only_its_slice(tmp: Path, state: Path, configs: list[Path], files: list[Path]) -> None:
    """Issue 30: the member's worker read the base from a file in its own state directory holding only the
    tensors of its place (fetched from the owner and checked against the signed spec), never the owner's file."""
    from safetensors import safe_open

    from arceusd.models.hf.config import hf_config_from_dict
    from arceusd.models.hf.weights_slice import digest_file, place_keys

    assert configs and files
    table = digest_file(tmp / "base.safetensors")[1]
    config = hf_config_from_dict(CONFIG, 32)
    for path in configs:
        worker = json.loads(path.read_text())
        weights = Path(worker["spec"]["model"]["weights"])
        assert weights.is_relative_to(state) and weights.parent.name == "weights", weights
        stage = next(st for st in worker["stages"] if any(m["peer_id"] == worker["peer_id"] for m in st["members"]))
        assert 0 < stage["end"] - stage["start"] < 2 + int(str(CONFIG["num_hidden_layers"])), (
            stage
        )  # a part of the model
        with safe_open(str(weights), framework="pt") as f:
            assert sorted(f.keys()) == list(place_keys(config, stage["start"], stage["end"], table))
    assert [p.name for p in files] == [Path(json.loads(configs[-1].read_text())["spec"]["model"]["weights"]).name]


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
        member_files = sorted((s.state_dir(1) / "jobs" / job_id / "weights").iterdir())
    finally:
        s.close()
    _member_read_only_its_slice(tmp_path, s.state_dir(1), member_configs, member_files)
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
