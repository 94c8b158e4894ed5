"""Job specs of stock transformers causal LMs (``[model] type = "hf"``) on tokenized data (``kind = "tokens"``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arceusd.jobs.spec.parsed import TokensDataSpec
from arceusd.jobs.spec.schema import JobSpecError, load_spec, spec_from_dict, spec_hash, to_dict
from arceusd.models.costs import block_costs
from arceusd.models.hf.config import HFModelConfig
from tests.unit import hf_cases

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-shakespeare.toml"


def test_the_example_reads_with_its_files_and_travels_inline() -> None:
    spec = load_spec(EXAMPLE)
    assert isinstance(spec.model, HFModelConfig) and spec.model.model_type == "llama"
    assert spec.model.block_size == 128 and spec.model.n_layer == 4
    assert isinstance(spec.data, TokensDataSpec) and spec.data.sha256 and spec.data.tokenizer_sha256
    wire = to_dict(spec)
    assert wire["model"]["config"]["hidden_size"] == 128  # the config inline, not a path
    again = spec_from_dict(json.loads(json.dumps(wire)))
    assert again == spec and spec_hash(again) == spec_hash(spec)
    costs = block_costs(spec.model)
    assert [c.name for c in costs] == ["embedding", "layer0", "layer1", "layer2", "layer3", "head"]
    assert (
        sum(c.param_bytes for c in costs) // 4
        == 2048 * 128 * 2 + 4 * (128 * 128 * 2 + 2 * 128 * 64 + 3 * 128 * 344 + 2 * 128) + 128
    )


def _write(tmp_path: Path, config: dict[str, object], **model: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = EXAMPLE.read_text().replace('config = "llama-tiny.config.json"', 'config = "config.json"')
    text = text.replace("../data/", str(ROOT / "data") + "/")
    for key, value in model.items():
        text = text.replace("block_size = 128\n", f"block_size = 128\n{key} = {json.dumps(value)}\n")
    spec = tmp_path / "job.toml"
    spec.write_text(text)
    return spec


def _problems(path: Path) -> list[str]:
    with pytest.raises(JobSpecError) as info:
        load_spec(path)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"model_type": "bert"}, "model.config.model_type", "Arceus trains gpt2, llama, qwen2, mistral"),
        ({"num_hidden_layers": 5000}, "model.config.num_hidden_layers", "out of bounds; allowed: 1..1024"),
        ({"num_key_value_heads": 3}, "model.config.num_key_value_heads", "does not divide"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "model.config.rope_scaling", "set rope_scaling to null"),
        ({"hidden_act": "gelu"}, "model.config.hidden_act", "supports only"),
        ({"vocab_size": 1000}, "model.config.vocab_size", "smaller than the tokenizer's 2048 tokens"),
        ({"max_position_embeddings": 64}, "model.block_size", "exceeds the architecture's max_position_embeddings"),
        ({"some_new_switch": True}, "model.config.some_new_switch", "unknown config field"),
    ],
)
def test_an_unsupported_config_is_one_clear_line(
    tmp_path: Path, change: dict[str, object], field: str, says: str
) -> None:
    config = {**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256, **change}
    problems = _problems(_write(tmp_path, config))
    assert len(problems) == 1, problems
    assert problems[0].startswith(field) and says in problems[0], problems


def test_a_tied_config_trains_and_its_replicas_sync_every_step(tmp_path: Path) -> None:
    """Tied embeddings split across stages sum their gradients every step (worker/tied.py): 'auto' plans replicas
    that all-reduce every step, and 'diloco' (each copy averaged on its own ring) is refused in one line."""
    from arceusd.jobs.plans.planning import _replica_choices
    from arceusd.market.needs import JobNeeds
    from arceusd.models.hf.config import num_hf_blocks
    from arceusd.models.hf.keys import param_count
    from partitioner import ReplicaSyncMode

    config = {**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256, "tie_word_embeddings": True}
    path = _write(tmp_path, config)
    spec = load_spec(path)
    assert isinstance(spec.model, HFModelConfig) and spec.model.tied
    assert _replica_choices(spec)[2] is ReplicaSyncMode.ALLREDUCE
    v, c = spec.model.vocab_size, spec.model.hidden
    head = block_costs(spec.model)[-1]  # the last stage's own copy of the tied weight (models/hf/costs.py)
    assert head.param_bytes == (v * c + c) * 4 and head.optimizer_bytes > 0
    distinct = sum(param_count(spec.model, i) for i in range(num_hf_blocks(spec.model)))
    assert JobNeeds.from_spec("job", "owner", spec, 1).model_params == distinct  # the weight counted once
    path.write_text(path.read_text().replace("[training]\n", '[training]\nreplicas = 2\nsync = "diloco"\n'))
    problems = _problems(path)
    assert len(problems) == 1 and problems[0].startswith("training.sync") and "every_step" in problems[0], problems


def test_initial_weights_are_checked_and_hashed_into_the_identity(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from arceusd.models.build import build_reference_model
    from arceusd.models.hf.export import hf_state

    cfg = hf_cases.config("llama", vocab_size=2048, max_position_embeddings=256)
    tensors = hf_state(cfg, dict(build_reference_model(cfg, 3).state_dict()))
    save_file(tensors, str(tmp_path / "w.safetensors"))
    config = {**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256}
    spec = load_spec(_write(tmp_path, config, weights="w.safetensors"))
    assert isinstance(spec.model, HFModelConfig) and spec.model.weights_sha256 is not None
    plain = load_spec(_write(tmp_path, config))
    assert spec_hash(spec) != spec_hash(plain)
    tensors["model.norm.weight"] = torch.ones(7)
    save_file(tensors, str(tmp_path / "w.safetensors"))
    problems = _problems(_write(tmp_path, config, weights="w.safetensors"))
    assert problems == [
        "model.weights: model.norm.weight has shape [7], the config says [32]; give the weights of "
        "this config (the architecture's own keys)"
    ]


def test_tokens_data_needs_a_stock_model_and_steps(tmp_path: Path) -> None:
    config = {**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256}
    path = _write(tmp_path, config)
    path.write_text(path.read_text().replace("steps = 1000", "epochs = 2"))
    assert any(p.startswith("training.epochs") for p in _problems(path))
    gpt = EXAMPLE.parent / "shakespeare-gpt.toml"
    text = gpt.read_text().replace('kind = "text"', 'kind = "tokens"\ntokenizer = "x.json"')
    (tmp_path / "g.toml").write_text(text.replace("../data/", str(ROOT / "data") + "/"))
    assert any("model.type" in p for p in _problems(tmp_path / "g.toml"))


def test_the_11m_example_is_a_10_to_20m_llama_on_the_shipped_tokenizer_and_its_lora_follows_it() -> None:
    """Issue 30 item 9: the example sized for five minutes on two CPU daemons (``bench/example_llama.py`` runs it)
    is a Llama of 10-20 M parameters with the shipped BPE; its LoRA spec fine-tunes that model's export."""
    spec = load_spec(ROOT / "examples" / "llama-shakespeare-11m.toml")
    assert isinstance(spec.model, HFModelConfig) and spec.model.model_type == "llama"
    assert isinstance(spec.data, TokensDataSpec) and spec.data.tokenizer.endswith("shakespeare-bpe.json")
    params = sum(c.param_bytes for c in block_costs(spec.model)) // 4
    assert 10_000_000 <= params <= 20_000_000, params
    lora = (ROOT / "examples" / "llama-shakespeare-11m-lora.toml").read_text()
    assert 'config = "llama-11m.config.json"' in lora and 'weights = "llama-shakespeare-11m-base.safetensors"' in lora
