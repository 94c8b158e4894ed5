"""Stock causal LMs: initial weights under the architecture's keys (checked, read per block) and the export folder
that ``transformers`` loads with no Arceus code (config.json, model.safetensors, tokenizer files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from arceusd.models.build import build_blocks, build_reference_model
from arceusd.models.hf.blocks import transformers_config
from arceusd.models.hf.config import parse_hf_config
from arceusd.models.hf.export import write_hf_export
from arceusd.models.hf.keys import expected_tensors
from arceusd.models.hf.weights_check import weights_problems
from arceusd.worker.stage import StageSpec, build_stage
from tests.unit import hf_cases

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "data" / "tokenizers" / "shakespeare-bpe.json"


@pytest.mark.parametrize(("name", "tied"), [("llama", False), ("gpt2", True), ("qwen2", False), ("mistral", False)])
def test_the_export_loads_in_transformers_and_computes_the_same_logits(name: str, tied: bool, tmp_path: Path) -> None:
    cfg = hf_cases.config(name, vocab_size=2048, tie_word_embeddings=tied)
    model = build_reference_model(cfg, seed=5)
    write_hf_export(tmp_path, cfg, dict(model.state_dict()), TOKENIZER)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tok("ROMEO: But soft", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=0, atol=1e-6)
    assert tok.decode(ids[0]) == "ROMEO: But soft"
    # the exported config.json is a valid model.config again (fine-tuning the result)
    again = parse_hf_config(
        json.loads((tmp_path / "config.json").read_text()),
        cfg.block_size,
        "model.config",
        lambda p, m: pytest.fail(f"{p}: {m}"),
    )
    assert again == cfg


def test_initial_weights_are_read_per_block_and_checked_against_the_config(tmp_path: Path) -> None:
    cfg = hf_cases.config("llama")
    source = AutoModelForCausalLM.from_config(transformers_config(cfg))  # type: ignore[no-untyped-call]
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(weights))
    assert weights_problems(weights, cfg) == []
    stage = build_stage(cfg, 0, StageSpec(2, 4), weights=weights)  # decoder layers 1 and 2 only
    for key, (block, local, _) in expected_tensors(cfg).items():
        if 2 <= block < 4:
            assert torch.equal(dict(stage.blocks[str(block)].named_parameters())[local], source.state_dict()[key])
    full = build_blocks(cfg, 0, weights=weights)
    with torch.no_grad():
        x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
        y = x
        for b in full:
            y = b(y)
        torch.testing.assert_close(y, source(x).logits, rtol=0, atol=1e-6)

    wrong = hf_cases.config("llama", intermediate_size=40)
    problems = weights_problems(weights, wrong)
    assert problems and "model.layers.0.mlp.down_proj.weight has shape [32, 48], the config says [32, 40]" in problems
    assert weights_problems(tmp_path / "nope.safetensors", cfg)


def test_a_tied_checkpoint_starts_an_untied_head_as_a_copy_of_the_embedding(tmp_path: Path) -> None:
    tied = hf_cases.config("gpt2", tie_word_embeddings=True)
    source = AutoModelForCausalLM.from_config(transformers_config(tied))  # type: ignore[no-untyped-call]
    weights = tmp_path / "model.safetensors"
    state = {k: v.contiguous() for k, v in source.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(weights))  # as the library saves a tied model: the head is not stored
    untied = hf_cases.config("gpt2", tie_word_embeddings=False)
    assert weights_problems(weights, untied) == []
    head = build_stage(untied, 0, StageSpec(3, 4), weights=weights).blocks["3"]
    assert torch.equal(dict(head.named_parameters())["lm_head.weight"], state["transformer.wte.weight"])
