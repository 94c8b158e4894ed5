"""Re-slicing a checkpoint for a new plan: pipeline and tensor-parallel layouts round-trip the full state exactly,
and resume descriptions from the wire are checked before use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arceusd.base.identity import Identity
from arceusd.files.checkpoint import Manifest, commit_manifest, write_shard
from arceusd.files.safetensors_io import load_bytes, save_bytes
from arceusd.jobs.plans.recovery import (
    ResumeError,
    ResumePoint,
    check_file,
    corrupt_shards,
    prepare_resume,
)
from arceusd.jobs.procs.reslice import ResliceError, full_state, parse_shard, slice_state
from arceusd.models.build import build_reference_model, num_blocks
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.worker.protocol import MemberConfig, StageConfig

GPT = GPTConfig(n_layer=2, n_head=4, n_embd=16, block_size=8, vocab_size=11)
MLP = MLPConfig(layer_sizes=(12, 8, 6, 3))
Relayout = tuple[list[int], dict[int, list[tuple[int, int]]]]  # layout()'s cuts and tp


def training_state(config: GPTConfig | MLPConfig) -> dict[str, torch.Tensor]:
    """Every parameter and two AdamW-like buffers per parameter, all distinct values."""
    model = build_reference_model(config, seed=3)
    gen = torch.Generator().manual_seed(5)
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"param.blocks.{name}"] = p.detach().clone()
        for buf in ("exp_avg", "exp_avg_sq"):
            out[f"optim.blocks.{name}.{buf}"] = torch.randn(p.shape, generator=gen)
    return out


def layout(config: GPTConfig | MLPConfig, cuts: list[int], tp: dict[int, list[tuple[int, int]]]) -> list[StageConfig]:
    """Stages from block cut points; ``tp[s]`` gives (heads, columns) per rank of stage s."""
    bounds = [0, *cuts, num_blocks(config)]
    stages = []
    for s in range(len(bounds) - 1):
        members = tuple(MemberConfig(f"peer-{s}-{r}", h, c) for r, (h, c) in enumerate(tp.get(s, [(0, 0)])))
        stages.append(StageConfig(bounds[s], bounds[s + 1], members))
    return stages


def shards_of(config: GPTConfig | MLPConfig, full: dict[str, torch.Tensor], stages: list[StageConfig]) -> list[bytes]:
    out = []
    for s, stage in enumerate(stages):
        split = stage.split()
        for r in range(len(stage.members)):
            meta = {
                "stage": str(s),
                "rank": str(r),
                "start": str(stage.start),
                "end": str(stage.end),
                "tp_heads": ",".join(map(str, split.heads)) if split else "",
                "tp_columns": ",".join(map(str, split.columns)) if split else "",
            }
            out.append(save_bytes(slice_state(config, full, stage, r), meta))
    return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (([1, 2], {}), ([2], {})),  # 3 stages -> 2
        (([2], {}), ([1, 3], {1: [(1, 20), (3, 44)]})),  # pipeline -> pipeline + uneven TP
        (([1, 3], {1: [(2, 32), (2, 32)]}), ([], {0: [(3, 40), (1, 24)]})),  # TP -> different TP over everything
    ],
)
def test_gpt_state_survives_any_relayout(old: Relayout, new: Relayout) -> None:
    full = training_state(GPT)
    before = layout(GPT, *old)
    gathered = full_state(GPT, [parse_shard(d) for d in shards_of(GPT, full, before)])
    assert_same(gathered, full)
    after = layout(GPT, *new)
    again = full_state(GPT, [parse_shard(d) for d in shards_of(GPT, gathered, after)])
    assert_same(again, full)


def test_tp_slices_are_smaller_and_split_like_their_parameter() -> None:
    full = training_state(GPT)
    stage = layout(GPT, [1, 3], {1: [(1, 16), (3, 48)]})[1]
    rank0 = slice_state(GPT, full, stage, 0)
    qkv = "param.blocks.1.attn.c_attn.weight"
    assert rank0[qkv].shape[0] == 3 * (GPT.n_embd // GPT.n_head) * 1  # one head of q, k and v
    assert rank0["optim.blocks.1.attn.c_attn.weight.exp_avg"].shape == rank0[qkv].shape
    assert rank0["optim.blocks.1.mlp.c_fc.weight.exp_avg_sq"].shape[0] == 16


def test_mlp_params_only_drops_optimizer_state() -> None:
    full = training_state(MLP)
    shards = [parse_shard(d) for d in shards_of(MLP, full, layout(MLP, [1], {}))]
    params = full_state(MLP, shards, params_only=True)
    assert params and all(k.startswith("param.") for k in params)


def test_a_missing_stage_or_rank_is_named() -> None:
    full = training_state(GPT)
    data = shards_of(GPT, full, layout(GPT, [1, 3], {1: [(2, 32), (2, 32)]}))
    with pytest.raises(ResliceError, match="block"):
        full_state(GPT, [parse_shard(d) for d in data[:1] + data[3:]])  # stage 1 entirely missing
    with pytest.raises(ResliceError, match="ranks"):
        full_state(GPT, [parse_shard(d) for i, d in enumerate(data) if i != 1])  # stage 1 rank 0 missing
    with pytest.raises(ResliceError, match="safetensors"):
        parse_shard(b"\xff" * 40)


def commit(
    root: Path,
    identity: Identity,
    step: int,
    config: GPTConfig | MLPConfig,
    full: dict[str, torch.Tensor],
    stages: list[StageConfig],
) -> None:
    records = []
    for data in shards_of(config, full, stages):
        meta, tensors = parse_shard(data)
        records.append(write_shard(root, step, f"stage{meta['stage']}-rank{meta['rank']}.safetensors", tensors, meta))
    commit_manifest(root, Manifest("job", 1, 1, step, tuple(records), {"cursor": {"step": step}}), identity)


def test_prepare_resume_writes_one_verified_slice_per_new_worker(tmp_path: Path) -> None:
    identity = Identity.generate()
    full = training_state(GPT)
    commit(tmp_path / "checkpoints", identity, 20, GPT, full, layout(GPT, [1, 2], {}))
    new = layout(GPT, [2], {1: [(2, 32), (2, 32)]})
    point = prepare_resume(tmp_path, GPT, new, epoch=2, trusted=[identity.peer_id])
    assert point is not None and point.step == 20 and point.cursor == {"step": 20}
    assert set(point.files) == {m.peer_id for s in new for m in s.members}
    for stage in new:
        for r, member in enumerate(stage.members):
            data = (point.directory / point.files[member.peer_id].name).read_bytes()
            check_file(data, point.files[member.peer_id])
            assert_same(load_bytes(data), slice_state(GPT, full, stage, r))
    # the description survives the wire; a tampered file is refused
    wire = ResumePoint.from_wire(point.to_wire())
    assert wire is not None and wire.files == point.files and wire.step == 20
    some = next(iter(point.files.values()))
    with pytest.raises(ResumeError, match="does not match"):
        check_file(b"x" * some.size, some)


def test_prepare_resume_refuses_a_checkpoint_holding_a_non_finite_value_and_writes_no_slice(tmp_path: Path) -> None:
    """Slices are cut from the whole state: a NaN anywhere in it (a bug, a disk fault) is refused once, before
    any slice is written."""
    identity = Identity.generate()
    full = training_state(MLP)
    key = next(k for k, v in full.items() if v.is_floating_point() and v.numel() > 1)
    full[key] = full[key].clone()
    full[key].view(-1)[1] = float("nan")
    stages = layout(MLP, [1, 2], {})
    commit(tmp_path / "checkpoints", identity, 10, MLP, full, stages)
    with pytest.raises(ResumeError, match=f"non-finite values \\({key}\\)"):
        prepare_resume(tmp_path, MLP, stages, 2, [identity.peer_id])
    assert not list((tmp_path / "resume").glob("epoch-2/*")), "no slice written"


def test_prepare_resume_ignores_untrusted_manifests_and_uses_replicas(tmp_path: Path) -> None:
    ours, stranger = Identity.generate(), Identity.generate()
    full = training_state(MLP)
    stages = layout(MLP, [1, 2], {})
    commit(tmp_path / "checkpoints", stranger, 10, MLP, full, stages)
    assert prepare_resume(tmp_path, MLP, stages, 1, [ours.peer_id]) is None  # signed by someone else
    job = tmp_path / "job"
    commit(job / "checkpoints", ours, 10, MLP, full, stages)
    replica = tmp_path / "replica"
    commit(replica, ours, 10, MLP, full, stages)
    shard = job / "checkpoints" / "step-0000000010" / "stage1-rank0.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4] + b"oops")
    step, bad = corrupt_shards(job / "checkpoints", [ours.peer_id])
    assert step == 10 and [r.name for r in bad] == ["stage1-rank0.safetensors"]
    assert prepare_resume(job, MLP, stages, 1, [ours.peer_id]) is None  # the only step is corrupt locally
    point = prepare_resume(job, MLP, stages, 1, [ours.peer_id], [replica])
    assert point is not None and point.step == 10


@pytest.mark.parametrize(
    "wire",
    [
        b"{",
        b'{"step": -1, "files": {}}',
        b'{"step": 1, "files": {"p": ["../x.safetensors", "' + b"0" * 64 + b'", 1]}}',
        b'{"step": 1, "files": {"p": ["a.safetensors", "short", 1]}}',
        b'{"files": {}}',
    ],
)
def test_malformed_resume_descriptions_are_refused(wire: bytes) -> None:
    with pytest.raises(ResumeError):
        ResumePoint.from_wire(wire)


def test_empty_description_is_a_fresh_start() -> None:
    assert ResumePoint.from_wire(b"") is None
