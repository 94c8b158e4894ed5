"""The Python API's specs (``arceus``): a transformers model object + a tokenizer become config.json, safetensors
weights, tokenizer.json and a spec the daemon's own checks accept; bad input is refused in one error naming the
field and the fix, before anything is written or sent. Offline: a tiny random Llama, a BPE trained here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import arceus
from arceus.model_job import ModelJob, prepare_model_job
from arceus.specs import spec_file, validate
from arceusd.jobs.spec.parsed import TokensDataSpec
from arceusd.jobs.spec.schema import load_spec, spec_hash
from arceusd.models.hf.config import HFModelConfig

ROOT = Path(__file__).resolve().parents[2]
TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40
VOCAB = 300


def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE of at most ``VOCAB`` tokens, trained offline on ``TEXT`` (as data/tokenizers/ makes its)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    return tok


def tiny_llama(vocab: int = VOCAB, **overrides: Any) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **overrides,
    )
    return LlamaForCausalLM(config)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "hamlet.txt"
    path.parent.mkdir()
    path.write_text(TEXT)
    return path


def test_a_model_object_becomes_files_and_a_spec_the_daemons_checks_accept(tmp_path: Path, data: Path) -> None:
    model, tok = tiny_llama(), tiny_tokenizer()
    job = ModelJob(data=data, training={"steps": 5, "batch_size": 2}, checkpoint={"interval_steps": 5})
    prepared = prepare_model_job(model, tok, job, tmp_path / "job")
    folder = prepared.folder
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "job.json"}
    spec = load_spec(prepared.spec_path)  # what the daemon reads
    assert spec_hash(spec) == spec_hash(prepared.spec)
    assert spec.name == "llama-hamlet" and spec.training.steps == 5 and spec.training.optimizer == "adamw"
    assert isinstance(spec.model, HFModelConfig) and spec.model.model_type == "llama"
    assert (spec.model.n_layer, spec.model.hidden, spec.model.vocab_size) == (2, 32, VOCAB)
    assert spec.model.block_size == 64  # min(128, the architecture's 64 positions)
    assert spec.model.weights is not None and spec.model.weights_sha256 is not None
    assert isinstance(spec.data, TokensDataSpec) and spec.data.format == "text"
    assert Path(spec.data.path) == data and spec.data.sha256 is not None
    doc = json.loads(prepared.spec_path.read_text())
    assert doc["model"]["config"] == str(folder / "config.json")  # absolute: the daemon may read it from anywhere
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab() == tok.get_vocab()
    with safe_open(str(folder / "model.safetensors"), "pt") as f:  # the architecture's own keys, every parameter
        assert set(f.keys()) == set(model.state_dict())
        weight = f.get_tensor("model.embed_tokens.weight")
    assert bool((weight == model.model.embed_tokens.weight.detach()).all())


def test_a_transformers_fast_tokenizer_and_jsonl_data_work_too(tmp_path: Path) -> None:
    lines = tmp_path / "d.jsonl"
    lines.write_text("".join(json.dumps({"body": line}) + "\n" for line in TEXT.splitlines()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer())  # type: ignore[no-untyped-call]
    job = ModelJob(
        data=lines,
        name="mine",
        text_field="body",
        block_size=16,
        training={"steps": 3},
        lora={"r": 4, "target_modules": ["q_proj", "v_proj"]},
    )
    spec = prepare_model_job(tiny_llama(), fast, job, tmp_path / "j", weights=False).spec
    assert isinstance(spec.model, HFModelConfig) and spec.model.lora is not None and spec.model.lora.r == 4
    assert isinstance(spec.data, TokensDataSpec) and (spec.data.format, spec.data.text_field) == ("jsonl", "body")
    assert spec.name == "mine" and isinstance(spec.model, HFModelConfig) and spec.model.block_size == 16
    assert spec.model.weights is None and not (tmp_path / "j" / "model.safetensors").exists()


def test_other_architectures_and_tokenizers_are_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, data: Path
) -> None:
    class Bert:
        class config:  # a transformers config's shape
            model_type = "bert"

        def named_parameters(self) -> list[Any]:
            return []

    folder = tmp_path / "job"
    with pytest.raises(
        arceus.UnsupportedModelError,
        match=r"^Arceus trains gpt2, llama, qwen2, mistral models; "
        r"this Bert is 'bert'$",
    ):
        prepare_model_job(Bert(), tiny_tokenizer(), ModelJob(data=data), folder)
    with pytest.raises(arceus.UnsupportedModelError, match="fast tokenizer"):
        prepare_model_job(tiny_llama(), object(), ModelJob(data=data), folder)
    with pytest.raises(arceus.UnsupportedModelError, match="transformers causal LM"):
        prepare_model_job("gpt2", tiny_tokenizer(), ModelJob(data=data), folder)
    assert not folder.exists()


def test_a_bad_field_is_one_error_naming_it_and_the_fix_before_the_weights_are_written(
    tmp_path: Path, data: Path
) -> None:
    folder = tmp_path / "job"
    with pytest.raises(arceus.SpecError) as err:  # the tokenizer has more ids than the model's embedding
        prepare_model_job(tiny_llama(vocab=100), tiny_tokenizer(), ModelJob(data=data), folder)
    assert err.value.fields == ["model.config.vocab_size"]
    assert "allowed: >= " in str(err.value)
    assert not (folder / "model.safetensors").exists()
    with pytest.raises(arceus.SpecError) as err:
        prepare_model_job(tiny_llama(), tiny_tokenizer(), ModelJob(data=data, training={"batch_size": 0}), folder)
    assert err.value.fields == ["training.batch_size"] and isinstance(err.value, ValueError)


def _dict_spec(data: Path) -> dict[str, Any]:
    return {
        "name": "dict-gpt",
        "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "vocab_size": "auto"},
        "data": {"kind": "text", "path": data.name},
        "training": {"steps": 4, "batch_size": 2, "lr": 1e-3, "optimizer": "adamw"},
    }


def test_a_dict_spec_resolves_from_base_dir_and_is_written_as_the_file_the_daemon_reads(
    tmp_path: Path, data: Path
) -> None:
    doc = _dict_spec(data)
    spec = validate(doc, base_dir=data.parent)
    path = spec_file(doc, tmp_path / "out", base_dir=data.parent)
    assert path == tmp_path / "out" / "job.json" and spec_hash(load_spec(path)) == spec_hash(spec)
    assert json.loads(path.read_text())["data"]["path"] == str(data)
    assert doc["data"]["path"] == data.name  # the caller's dict is left as it was


def test_the_client_refuses_a_bad_spec_before_it_looks_for_a_daemon_and_writes_nothing(
    tmp_path: Path, data: Path
) -> None:
    client = arceus.Client(tmp_path / "state")
    bad = {**_dict_spec(data), "training": {"steps": 0, "batch_size": 2, "lr": 1e-3, "optimizer": "adamw"}}
    with pytest.raises(arceus.SpecError, match=r"training\.steps") as err:
        client.submit(bad, base_dir=data.parent)
    assert err.value.fields == ["training.steps"]
    with pytest.raises(arceus.NoDaemonError, match=r"no daemon is running for .*arceusd start"):
        client.submit(_dict_spec(data), base_dir=data.parent)
    with pytest.raises(arceus.NoDaemonError):
        client.submit_model(tiny_llama(), tiny_tokenizer(), data)
    with pytest.raises(ValueError, match=r"members must be an integer 1\.\.256"):
        client.submit(_dict_spec(data), members=0, base_dir=data.parent)
    assert not (tmp_path / "state").exists()


def test_quote_needs_no_daemon_and_says_what_submit_quote_says(tmp_path: Path, data: Path) -> None:
    est = arceus.quote(_dict_spec(data), members=2, state_dir=tmp_path / "state", base_dir=data.parent)
    assert est.devices == 2 and est.quote.flops > 0 and est.quote.hours > 0
    assert est.lines()[0].startswith("quote for dict-gpt (not announced): 2 device(s)")
    quoted = arceus.Client(tmp_path / "state").submit_model(
        tiny_llama(), tiny_tokenizer(), data, quote=True, training={"steps": 7}
    )
    assert quoted.name == "llama-hamlet" and quoted.devices == 1
    assert not list((tmp_path / "state" / "submissions").iterdir())  # a quote's files are not kept


def test_importing_arceus_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, arceus; print(sorted(m for m in ('torch', 'transformers', 'safetensors', 'tokenizers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
