"""A tensor-parallel rank's initial weights (issue 30): its slice holds only its shards of the split tensors (and
the replicated ones whole), and the worker builds from it exactly the shard it builds from the owner's whole file
(``arceusd/models/hf/weights_slice.py``; ``build_hf_shard`` in ``arceusd/worker/hf_tensor_parallel.py`` builds
the layer at the rank's size, the same module the full layer cut gives)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from arceusd.models.build import build_block
from arceusd.models.hf.blocks import HFDecoderBlock
from arceusd.models.hf.config import HFModelConfig
from arceusd.models.hf.keys import block_tensors, hf_key
from arceusd.models.hf.lora_spec import LoraSpec
from arceusd.models.hf.weights_slice import (
    assemble_slice,
    digest_file,
    place_keys,
    read_slice,
    slice_layout,
    slice_size,
)
from arceusd.worker.collective import InMemoryAllReduce
from arceusd.worker.hf_tensor_parallel import shard_hf_block
from arceusd.worker.hf_tp_tensors import shard_hf_tensor
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tp_split import TPSplit
from tests.unit import hf_cases
from tests.unit.test_initial_weights_slice import _weights

LORA = LoraSpec(r=4, alpha=8, targets=("q_proj", "o_proj", "up_proj", "down_proj"), dropout=0.0, merge=False)
CASES: list[tuple[str, dict[str, object], TPSplit, bool]] = [
    ("llama", {}, TPSplit((1, 1), (30, 18)), False),  # 2 KV heads, 48 columns (chunks of 1: exactly the shard)
    ("llama", {}, TPSplit((1, 1), (30, 18)), True),  # a LoRA job's frozen base
    ("gpt2", {"n_inner": 128}, TPSplit((3, 1), (99, 29)), False),  # columns in blocks of 2: one ends inside one
]


def _config(name: str, overrides: dict[str, object], lora: bool) -> HFModelConfig:
    cfg = hf_cases.config(name, **overrides)
    return dataclasses.replace(cfg, lora=LORA) if lora else cfg


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach() for n, t in module.state_dict().items() if ".rotary." not in n}


@pytest.mark.parametrize(("name", "overrides", "split", "lora"), CASES)
def test_a_rank_built_from_its_shards_equals_the_rank_cut_from_the_whole_file(
    tmp_path: Path, name: str, overrides: dict[str, object], split: TPSplit, lora: bool
) -> None:
    cfg = _config(name, overrides, lora)
    path = tmp_path / "w.safetensors"
    tensors = _weights(path, cfg)
    table = digest_file(path, cfg)[1]
    start, end = 1, 3  # two decoder layers, split over two ranks
    whole = slice_layout(cfg, place_keys(cfg, start, end, table), table)
    group = InMemoryAllReduce(split.world_size)
    for rank in range(split.world_size):
        layout = slice_layout(cfg, place_keys(cfg, start, end, table), table, (split.heads, split.columns, rank))
        data = read_slice(path, layout, 0, slice_size(layout))
        mine = tmp_path / f"rank{rank}.safetensors"
        mine.write_bytes(assemble_slice(data, layout))
        kept = sum(e.kept_nbytes for e in layout)
        assert kept < 0.8 * slice_size(whole)  # its share of the layers' bytes, not all of them
        digest_lists = sum(32 * e.chunks.count for e in layout if e.chunks is not None)
        extra = slice_size(layout) - kept - digest_lists  # parts of the chunks a range ends inside
        widest = sum(
            2 * len(e.ranges) * max(e.chunks.chunk_nbytes(i, 4) for i in range(e.chunks.count))
            for e in layout
            if e.chunks is not None
        )
        assert 0 <= extra <= widest
        if name == "llama":
            assert extra == 0  # the shard's bytes and the chunk digests, no more
        with safe_open(str(mine), framework="pt") as f:
            for index in range(start, end):
                for local in block_tensors(cfg, index):
                    key = hf_key(cfg, index, local)
                    expected = shard_hf_tensor(local, tensors[key], cfg, split, rank)
                    assert torch.equal(f.get_tensor(key), expected), key  # the shard as the split layer holds it
        spec = StageSpec(start, end, split, rank)
        from_shards = build_stage(cfg, 0, spec, group.rank_view(rank), weights=mine)
        from_whole = build_stage(cfg, 0, spec, group.rank_view(rank), weights=path)
        a, b = _state(from_shards), _state(from_whole)
        assert a.keys() == b.keys() and len(a) > 10
        for n in a:
            assert torch.equal(a[n], b[n]), n
        for index in range(start, end):  # what cutting the full block read from the whole file gives (the old way)
            full = build_block(cfg, index, 0, path)
            assert isinstance(full, HFDecoderBlock)
            cut = shard_hf_block(full, cfg, split, rank, group.rank_view(rank))
            built = from_shards.blocks[str(index)]
            assert repr(built) == repr(cut)
            mine_buffers, cut_buffers = dict(built.named_buffers()), dict(cut.named_buffers())  # rotary's included
            assert mine_buffers.keys() == cut_buffers.keys()
            assert all(torch.equal(mine_buffers[n], cut_buffers[n]) for n in mine_buffers)
            ref = _state(cut)
            assert ref.keys() == {n.removeprefix(f"blocks.{index}.") for n in a if n.startswith(f"blocks.{index}.")}
            for n, t in ref.items():
                assert torch.equal(a[f"blocks.{index}.{n}"], t), n
        # and both hold the initial weights, not the seed's draw (a LoRA base is a buffer under base_layer)
        q = "layer.attn.c_attn" if cfg.is_gpt2 else "layer.self_attn.q_proj"
        base = f"blocks.{start}.{q}.base_layer.weight" if lora else f"blocks.{start}.{q}.weight"
        key = hf_key(cfg, start, f"{q}.weight")
        assert torch.equal(a[base], shard_hf_tensor(f"{q}.weight", tensors[key], cfg, split, rank))


def test_a_file_holding_another_ranks_shard_is_refused_with_one_line(tmp_path: Path) -> None:
    cfg = hf_cases.config("llama")
    path = tmp_path / "w.safetensors"
    _weights(path, cfg)
    table = digest_file(path, cfg)[1]
    split = TPSplit((1, 1), (30, 18))
    layout = slice_layout(cfg, place_keys(cfg, 1, 2, table), table, (split.heads, split.columns, 1))
    theirs = tmp_path / "rank1.safetensors"
    theirs.write_bytes(assemble_slice(read_slice(path, layout, 0, slice_size(layout)), layout))
    with pytest.raises(ValueError, match=r"mlp\.(gate|up)_proj\.weight has shape \[18, 32\]; rank 0 holds \[30, 32\]"):
        build_stage(cfg, 0, StageSpec(1, 2, split, 0), InMemoryAllReduce(2).rank_view(0), weights=theirs)
