"""The Python API end to end: a real daemon trains a tiny transformers Llama submitted as a model object through
``arceus`` (``members=1``); its progress is followed to the end and the export loads with
``AutoModelForCausalLM.from_pretrained``. The daemon imports neither torch nor transformers. Then the spec file
written beside the model is submitted for two members (it waits), cancelled, and both jobs are listed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

import arceus
from arceusd.cli.swarm import LocalSwarm

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.mark.timeout(600)
def test_a_model_object_trains_on_a_daemon_and_its_export_loads(tmp_path: Path) -> None:
    data = tmp_path / "shakespeare.txt"
    data.write_text((ROOT / "data" / "tinyshakespeare" / "input.txt").read_text()[:20000])
    tok = Tokenizer.from_file(str(ROOT / "data" / "tokenizers" / "shakespeare-bpe.json"))
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    swarm = LocalSwarm(tmp_path / "swarm", 1, preset="lan", env={"ARCEUS_TOKEN_CACHE": str(tmp_path / "tokens")})
    try:
        swarm.start()
        client = arceus.connect(swarm.state_dir(0))
        job = client.submit_model(
            model,
            tok,
            data,
            members=1,
            folder=tmp_path / "job",
            block_size=32,
            training={"steps": STEPS, "batch_size": 4, "lr": 3e-3, "eval_iters": 1},
            checkpoint={"interval_steps": 3},
        )
        began = time.monotonic()
        seen = list(job.progress(poll_s=0.5, timeout_s=450))  # 2 min on a 2-core machine at load 13
        took = time.monotonic() - began
        status = job.wait(timeout_s=10)
        packages = swarm.call(0, "modules")["packages"]
        assert "torch" not in packages and "transformers" not in packages, packages
        folder = job.export_path()
        loaded = job.load()
        waiting = client.submit(tmp_path / "job" / "job.json", members=2)  # a spec file; no second device joins
        assert waiting.status().state is arceus.JobState.WAITING and waiting.cancel() is arceus.JobState.CANCELLED
        listed = {j.job_id: j.state for j in client.jobs()}
        assert listed == {job.job_id: arceus.JobState.DONE, waiting.job_id: arceus.JobState.CANCELLED}, listed
        assert client.job(job.job_id[:8]).job_id == job.job_id
    finally:
        swarm.close()
    assert seen[-1].state is arceus.JobState.DONE and seen[-1].step == STEPS, seen
    steps = [p.step for p in seen]
    assert steps == sorted(steps) and all(p.total_steps == STEPS for p in seen if p.total_steps), seen
    assert status.loss is not None and status.model_path is not None, status
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "job.json"} <= {
        p.name for p in (tmp_path / "job").iterdir()
    }
    assert isinstance(loaded, LlamaForCausalLM) and loaded.config.vocab_size == tok.get_vocab_size()
    moved = (loaded.model.embed_tokens.weight - model.model.embed_tokens.weight).abs().max().item()
    assert moved > 0, "the export starts from the submitted weights and trains them"
    ids = torch.tensor([tok.encode("ROMEO:").ids])
    with torch.no_grad():
        assert loaded.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    print(f"progress: {len(seen)} snapshots in {took:.1f} s")
