"""The job spec's ``[lora]`` section: read, bounded, checked against the architecture by name, part of the job's
identity, and costed as a frozen base (issue 30 item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from arceusd.jobs.spec.schema import JobSpecError, load_spec, parse_spec, spec_from_dict, spec_hash, to_dict
from arceusd.models.costs import block_costs
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.lora_keys import lora_blocks, lora_tensors, peft_key
from arceusd.models.hf.lora_spec import LoraSpec
from tests.unit import hf_cases
from tests.unit.test_jobspec_hf import _problems

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-shakespeare-lora.toml"


def _weights(path: Path) -> None:
    """A base checkpoint of the example's config (the seed's initial tensors)."""
    from safetensors.torch import save_file

    from arceusd.models.build import build_blocks
    from arceusd.models.hf.config import hf_config_from_dict
    from arceusd.models.hf.keys import hf_key

    config = hf_config_from_dict(json.loads((ROOT / "examples" / "llama-tiny.config.json").read_text()), 128)
    tensors = {
        hf_key(config, i, k): p.detach().contiguous()
        for i, b in enumerate(build_blocks(config, 0))
        for k, p in b.named_parameters()
    }
    save_file(tensors, str(path))


def _write(tmp_path: Path, lora: str | None = None, model_type: str | None = None) -> Path:
    """The example in ``tmp_path`` with its base weights there; ``lora`` replaces its [lora] section's body."""
    if not (tmp_path / "base.safetensors").exists():
        _weights(tmp_path / "base.safetensors")
    text = EXAMPLE.read_text().replace("../data/", str(ROOT / "data") + "/")
    config = ROOT / "examples" / "llama-tiny.config.json"
    text = text.replace('config = "llama-tiny.config.json"', f'config = "{config}"')
    text = text.replace('weights = "llama-shakespeare-base.safetensors"', 'weights = "base.safetensors"')
    if lora is not None:
        head, _, rest = text.partition("[lora]\n")
        text = head + "[lora]\n" + lora + "\n\n[training]" + rest.partition("[training]")[2]
    spec = tmp_path / "job.toml"
    spec.write_text(text)
    return spec


def test_the_example_reads_travels_inline_and_is_part_of_the_identity(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path))
    assert isinstance(spec.model, HFModelConfig)
    assert spec.model.lora == LoraSpec(r=8, alpha=16, targets=("q_proj", "v_proj"), dropout=0.0, merge=True)
    assert spec.model.weights_sha256 is not None  # the base is hashed into the job, as without LoRA
    wire = to_dict(spec)
    assert wire["lora"] == {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "merge": True}
    again = spec_from_dict(json.loads(json.dumps(wire)))
    assert again == spec and spec_hash(again) == spec_hash(spec)
    other = spec_from_dict({**wire, "lora": {**wire["lora"], "r": 4}})
    assert spec_hash(other) != spec_hash(spec)
    plain = {k: v for k, v in wire.items() if k != "lora"}
    assert spec_hash(spec_from_dict(plain)) != spec_hash(spec)
    adapters = sum(sum(a * b for a, b in lora_tensors(spec.model, i).values()) for i in range(6))
    assert adapters == 14_336  # the example's comment
    assert lora_blocks(spec.model) == {1, 2, 3, 4}


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        (
            'target_modules = ["qkv"]',
            "lora.target_modules",
            "'qkv' names no module of a llama decoder layer; "
            "use one of: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
        ),
        ('target_modules = ["c_attn"]', "lora.target_modules", "'c_attn' names no module of a llama decoder"),
        ('target_modules = ["lm_head"]', "lora.target_modules", "names no module of a llama decoder layer"),
        ("target_modules = []", "lora.target_modules", "must be a list of 1 to 16 module names"),
        ('target_modules = ["q_proj", "q_proj"]', "lora.target_modules", "names a module twice"),
        ("r = 4", "lora.target_modules", "missing required field: the layers to adapt"),
        ('r = 0\ntarget_modules = ["q_proj"]', "lora.r", "must be >= 1 and <= 1024, got 0"),
        ('r = 5000\ntarget_modules = ["q_proj"]', "lora.r", "must be >= 1 and <= 1024, got 5000"),
        ('r = 256\ntarget_modules = ["q_proj"]', "lora.r", "exceeds the model's hidden size 128; allowed: 1..128"),
        ('r = 8.5\ntarget_modules = ["q_proj"]', "lora.r", "must be an integer"),
        ('alpha = 0\ntarget_modules = ["q_proj"]', "lora.alpha", "must be >= 1 and <= 65536"),
        ('dropout = 0.9\ntarget_modules = ["q_proj"]', "lora.dropout", "must be"),
        ('merge = "yes"\ntarget_modules = ["q_proj"]', "lora.merge", "must be true or false"),
        ('rank = 8\ntarget_modules = ["q_proj"]', "lora.rank", "unknown key"),
    ],
)
def test_a_bad_lora_field_is_one_line_naming_it_and_the_fix(tmp_path: Path, body: str, field: str, says: str) -> None:
    problems = _problems(_write(tmp_path, lora=body))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{field}: ") and says in problems[0], problems


def test_lora_on_a_model_that_is_not_a_stock_lm_is_refused() -> None:
    raw = tomllib.loads((ROOT / "examples" / "shakespeare-gpt.toml").read_text())
    raw["lora"] = {"target_modules": ["c_attn"]}
    with pytest.raises(JobSpecError) as info:
        parse_spec(raw, base_dir=ROOT / "examples")
    assert [p.path for p in info.value.problems] == ["lora"]
    assert 'use [model] type = "hf" or remove [lora]' in str(info.value.problems[0])


@pytest.mark.parametrize(
    ("name", "targets", "paths"),
    [
        ("gpt2", ("c_proj",), ["attn.c_proj", "mlp.c_proj"]),
        ("gpt2", ("attn.c_proj",), ["attn.c_proj"]),
        ("llama", ("q_proj", "down_proj"), ["self_attn.q_proj", "mlp.down_proj"]),
    ],
)
def test_targets_match_as_peft_matches_them(name: str, targets: tuple[str, ...], paths: list[str]) -> None:
    cfg = replace(hf_cases.config(name), lora=LoraSpec(r=2, alpha=4, targets=targets))
    tensors = lora_tensors(cfg, 1)
    assert sorted({k.split(".lora_")[0] for k in tensors}) == sorted(f"layer.{p}" for p in paths)
    assert lora_tensors(cfg, 0) == {} and lora_tensors(cfg, cfg.n_layer + 1) == {}
    key = peft_key(cfg, 1, f"layer.{paths[0]}.lora_A.default.weight")
    layer = "transformer.h.0." if name == "gpt2" else "model.layers.0."
    assert key == f"base_model.model.{layer}{paths[0]}.lora_A.weight"


def test_costs_count_the_base_held_and_only_the_adapters_trained() -> None:
    cfg = hf_cases.config("llama")
    tuned = replace(cfg, lora=LoraSpec(r=4, alpha=8, targets=("q_proj", "v_proj")))
    full, lora = block_costs(cfg), block_costs(tuned)
    for i, (a, b) in enumerate(zip(full, lora, strict=True)):
        adapters = sum(x * y for x, y in lora_tensors(tuned, i).values()) * 4
        assert b.param_bytes == a.param_bytes + adapters  # the frozen base is still held
        assert b.optimizer_bytes == adapters * 3  # AdamW: gradient + two moments, adapters only
        assert b.forward_flops_per_sample >= a.forward_flops_per_sample
        assert b.backward_flops_per_sample < a.backward_flops_per_sample  # no weight gradients of the base
        assert b.stash_bytes_per_sample == a.stash_bytes_per_sample
    assert lora[0].backward_flops_per_sample == 0.0  # nothing before the embeddings trains


def test_the_lora_spec_modules_import_no_torch() -> None:
    code = (
        "import sys; import arceusd.jobs.spec.lora, arceusd.models.hf.lora_keys, arceusd.models.hf.lora_costs; "
        "import arceusd.jobs.spec.schema; assert 'torch' not in sys.modules and 'peft' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_lora_on_a_tied_model_is_refused_with_one_line(tmp_path: Path) -> None:
    wire = to_dict(load_spec(_write(tmp_path)))
    wire["model"]["config"]["tie_word_embeddings"] = True
    with pytest.raises(JobSpecError) as info:
        spec_from_dict(wire)
    assert [str(p) for p in info.value.problems] == [
        "lora: LoRA with model.config.tie_word_embeddings = true is not supported yet; set it to false (the LM head "
        "then starts as a copy of the embedding)"
    ]
