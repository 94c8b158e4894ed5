"""A member's slice of a job's initial weights (issue 30): the tensors its place reads, cut from the owner's file
by byte ranges, checked tensor by tensor against the digests the signed spec records, and kept as a file of its
own that the worker reads like the owner's (``arceusd/models/hf/weights_slice.py``; torch only in the test)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from arceusd.jobs.plans.initial_weights import Place, needs_weights, place_layout, standby_copies, worker_spec_weights
from arceusd.jobs.spec.schema import JobSpecError, load_spec, spec_from_dict, to_dict
from arceusd.models.hf import weights_slice
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import expected_tensors
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.models.hf.weights import load_block_tensors
from arceusd.models.hf.weights_chunks import chunk_digests, chunking, chunks_root
from arceusd.models.hf.weights_slice import (
    SliceEntry,
    WeightsSliceError,
    assemble_slice,
    digest_file,
    place_keys,
    read_slice,
    slice_file_matches,
    slice_layout,
    slice_size,
)
from tests.unit import hf_cases

ROOT = Path(__file__).resolve().parents[2]


def _weights(path: Path, cfg: HFModelConfig, drop: tuple[str, ...] = (), bf16: str = "") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    tensors = {
        k: torch.randn(shape, generator=gen) for k, (_, _, shape) in expected_tensors(cfg).items() if k not in drop
    }
    if bf16:
        tensors[bf16] = tensors[bf16].to(torch.bfloat16)
    save_file(tensors, str(path))
    return tensors


def _table(path: Path, cfg: HFModelConfig) -> dict[str, tuple[str, str]]:
    return digest_file(path, cfg)[1]


def _served(path: Path, cfg: HFModelConfig, start: int, end: int) -> tuple[bytes, tuple[SliceEntry, ...]]:
    table = _table(path, cfg)
    layout = slice_layout(cfg, place_keys(cfg, start, end, table), table)
    size = slice_size(layout)
    data = b"".join(read_slice(path, layout, o, 1000) for o in range(0, size, 1000))  # in chunks, as served
    return data, layout


def test_digests_cover_the_file_and_each_tensor_in_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = hf_cases.config("llama")
    tensors = _weights(tmp_path / "w.safetensors", cfg, bf16="model.norm.weight")
    whole, table = digest_file(tmp_path / "w.safetensors", cfg)
    assert whole == hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    assert set(table) == set(tensors)
    norm = tensors["model.norm.weight"]
    assert table["model.norm.weight"] == ("BF16", hashlib.sha256(norm.view(torch.int16).numpy().tobytes()).hexdigest())
    for key in ("model.layers.0.self_attn.o_proj.weight", "model.layers.2.mlp.up_proj.weight"):  # a split cuts
        c = chunking(cfg, key)  # them: signed as the root of their chunks' digests
        assert c is not None and table[key] == ("F32", chunks_root(chunk_digests(tensors[key].numpy().tobytes(), c, 4)))
    monkeypatch.setattr(weights_slice, "_READ", 16)  # rows longer than a read: each chunk's part read on its own
    assert digest_file(tmp_path / "w.safetensors", cfg) == (whole, table)


def test_a_middle_stage_gets_its_layers_tensors_only_and_its_worker_reads_them(tmp_path: Path) -> None:
    cfg = hf_cases.config("llama")  # 3 layers: blocks 0 (embedding), 1-3 (layers), 4 (norm + head)
    tensors = _weights(tmp_path / "w.safetensors", cfg, bf16="model.layers.1.mlp.up_proj.weight")
    data, layout = _served(tmp_path / "w.safetensors", cfg, 2, 4)
    body = assemble_slice(data, layout)
    (tmp_path / "mine.safetensors").write_bytes(body)
    got = load_file(str(tmp_path / "mine.safetensors"))
    assert set(got) == {k for k in tensors if k.startswith(("model.layers.1.", "model.layers.2."))}
    for key, t in got.items():
        assert torch.equal(t, tensors[key]), key
    for index in (2, 3):  # the worker's reader finds every tensor of its blocks in the member's file
        mine = load_block_tensors(tmp_path / "mine.safetensors", cfg, index)
        whole = load_block_tensors(tmp_path / "w.safetensors", cfg, index)
        assert mine.keys() == whole.keys() and all(torch.equal(mine[k], whole[k]) for k in mine)
    assert slice_file_matches(tmp_path / "mine.safetensors", layout)
    raw = bytearray(body)
    raw[-1] ^= 1
    (tmp_path / "mine.safetensors").write_bytes(bytes(raw))
    assert not slice_file_matches(tmp_path / "mine.safetensors", layout)


def test_a_head_reads_the_embedding_when_tied_or_when_the_file_stores_no_head(tmp_path: Path) -> None:
    tied = hf_cases.config("gpt2", tie_word_embeddings=True)
    _weights(tmp_path / "t.safetensors", tied)
    assert place_keys(tied, 3, 4, _table(tmp_path / "t.safetensors", tied)) == (
        "transformer.ln_f.bias",
        "transformer.ln_f.weight",
        "transformer.wpe.weight",  # block 0 is built to copy its embedding (tie_hf_blocks)
        "transformer.wte.weight",
    )
    untied = hf_cases.config("llama")
    _weights(tmp_path / "u.safetensors", untied, drop=("lm_head.weight",))
    assert place_keys(untied, 4, 5, _table(tmp_path / "u.safetensors", untied)) == (
        "model.embed_tokens.weight",
        "model.norm.weight",
    )
    with pytest.raises(WeightsSliceError, match=r"no tensor model\.layers\.0"):
        place_keys(untied, 1, 2, {"model.norm.weight": ("F32", "0" * 64)})


def test_a_tampered_slice_is_refused_with_one_line_naming_the_tensor(tmp_path: Path) -> None:
    cfg = hf_cases.config("llama")
    _weights(tmp_path / "w.safetensors", cfg)
    data, layout = _served(tmp_path / "w.safetensors", cfg, 0, 2)
    tampered = bytearray(data)
    tampered[layout[0].nbytes + 5] ^= 0x40  # a byte of the second tensor
    with pytest.raises(WeightsSliceError) as info:
        assemble_slice(bytes(tampered), layout, "the leader 0123456789ab")
    line = str(info.value)
    assert "\n" not in line
    assert line.startswith(
        f"initial weights from the leader 0123456789ab: tensor {layout[1].key} does not match the job's signed digest"
    )
    assert line.endswith("; refused")
    with pytest.raises(WeightsSliceError, match="bytes where the signed tensors are"):
        assemble_slice(data + b"\0", layout)
    # a leader whose file holds another dtype under the same key (same size: F16 for BF16) serves nothing
    table = dict(_table(tmp_path / "w.safetensors", cfg))
    key = layout[0].key
    table[key] = ("F16", table[key][1])
    relabelled = slice_layout(cfg, [key], table)
    with pytest.raises(WeightsSliceError, match="is not the tensor the job signed"):
        read_slice(tmp_path / "w.safetensors", relabelled, 0, 10)


def test_the_spec_signs_each_tensor_and_a_spec_from_the_wire_must_carry_the_digests(tmp_path: Path) -> None:
    cfg = hf_cases.config("llama", vocab_size=2048, max_position_embeddings=256)
    _weights(tmp_path / "w.safetensors", cfg)
    (tmp_path / "config.json").write_text(
        json.dumps({**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256})
    )
    text = (ROOT / "examples" / "llama-shakespeare.toml").read_text()
    text = text.replace('config = "llama-tiny.config.json"', 'config = "config.json"')
    text = text.replace("../data/", str(ROOT / "data") + "/")
    text = text.replace("block_size = 128\n", 'block_size = 128\nweights = "w.safetensors"\n')
    (tmp_path / "job.toml").write_text(text)
    spec = load_spec(tmp_path / "job.toml")
    assert isinstance(spec.model, HFModelConfig) and spec.model.weights_tensors is not None
    wire = to_dict(spec)
    table = wire["model"]["weights_tensors"]
    assert {k: tuple(v) for k, v in table.items()} == _table(tmp_path / "w.safetensors", cfg)
    assert spec_from_dict(json.loads(json.dumps(wire))) == spec
    assert not standby_copies(spec.model)  # a takeover resumes from a checkpoint: it holds every trained tensor
    lora = dataclasses.replace(spec.model, lora=LoraSpec(r=4, alpha=8, targets=("q_proj",), dropout=0.0, merge=False))
    assert standby_copies(lora) and needs_weights(lora, resuming=True) and not needs_weights(spec.model, True)
    layout = place_layout(spec.model, Place(1, 2))
    assert [e.key for e in layout] == sorted(k for k in table if k.startswith("model.layers.0."))
    del wire["model"]["weights_tensors"]
    with pytest.raises(JobSpecError, match=r"model\.weights_tensors: missing"):
        spec_from_dict(wire)
    wire["model"]["weights_tensors"] = {"model.nope.weight": ["F32", "0" * 64]}
    with pytest.raises(JobSpecError, match="is no tensor of this config"):
        spec_from_dict(wire)
    worker = to_dict(spec)
    worker_spec_weights(worker, tmp_path / "mine.safetensors")
    assert worker["model"]["weights"] == str(tmp_path / "mine.safetensors")
    worker_spec_weights(worker, None)  # resuming a full-training job: the checkpoint holds every tensor
    assert not {"weights", "weights_sha256", "weights_tensors"} & set(worker["model"])
    assert spec_from_dict(worker).model.weights is None  # type: ignore[union-attr]
