"""Initial weights between daemons (issue 30; ``arceusd/jobs/common/transfers.py``, torch-free): a member fetches only
its place's tensors from the leader into its own job directory (the leader works out the place from its plan; the
member names an offset only; a tensor-parallel rank only its shards, chunk by chunk checked), the whole file goes
to the standby alone and is checked against the signed ``weights_sha256``, and a standby's checked copy is what it
serves once it leads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
from safetensors import safe_open

from arceusd.jobs.common.transfers import Transfers, job_weights
from arceusd.jobs.core import JobCore, JobState, Role, Stamp
from arceusd.jobs.plans.initial_weights import Place, place_layout, place_of
from arceusd.jobs.record.job import Job
from arceusd.jobs.spec.schema import load_spec
from arceusd.models.hf.weights_slice import WeightsSliceError, place_keys, slice_size
from protocol.job_wire import JobAck, ShardData, WeightsRequest
from tests.unit import hf_cases
from tests.unit.test_initial_weights_slice import ROOT, _table, _weights

JOB, LEADER, MEMBER, STANDBY, STRANGER = "a" * 32, "b" * 32, "c" * 32, "d" * 32, "e" * 32


def _spec(tmp: Path) -> Any:
    raw = {**hf_cases.RAW["llama"], "vocab_size": 2048, "max_position_embeddings": 256}
    _weights(tmp / "w.safetensors", hf_cases.config("llama", vocab_size=2048, max_position_embeddings=256))
    (tmp / "config.json").write_text(json.dumps(raw))
    text = (ROOT / "examples" / "llama-shakespeare.toml").read_text()
    text = text.replace('config = "llama-tiny.config.json"', 'config = "config.json"')
    text = text.replace("../data/", str(ROOT / "data") + "/")
    text = text.replace("block_size = 128\n", 'block_size = 128\nweights = "w.safetensors"\n')
    (tmp / "job.toml").write_text(text)
    return load_spec(tmp / "job.toml")


def _stage(start: int, end: int, *devices: str, heads: tuple[int, ...] = (), columns: tuple[int, ...] = ()) -> Any:
    """A plan's stage as the planner gives it (``partitioner.Stage``'s fields the job reads): a tensor-parallel
    one's devices with their key/value heads and MLP columns per block."""
    n = end - start
    shares = tuple(
        SimpleNamespace(
            peer_id=d, heads=(heads[k] if heads else 0,) * n, mlp_columns=(columns[k] if columns else 0,) * n
        )
        for k, d in enumerate(devices)
    )
    return SimpleNamespace(start=start, end=end, devices=devices, shares=shares, time_s=None)


def _job(spec: Any, directory: Path, me: str, leader: str, role: Role) -> Job:
    core = JobCore(me, LEADER, 100, role, JobState.RUNNING, Stamp(2, 3), leader)
    job = Job(JOB, spec, b"{}", "0" * 64, LEADER, "127.0.0.1:1", directory, core, total_steps=100)
    stages = (_stage(0, 2, LEADER), _stage(2, 4, STANDBY), _stage(4, 5, MEMBER))
    job.replica_plan = cast(Any, SimpleNamespace(replicas=(SimpleNamespace(stages=stages),)))
    core.standby = STANDBY  # (the core's: the leader chose it, a member was told it in the start)
    return job


class Wire:
    """Every request reaches the holder's handler as if sent by ``sender``."""

    def __init__(self, holder: Transfers, sender: str) -> None:
        self.holder, self.sender = holder, sender

    async def request(self, address: str, peer: str, msg: Any, **_: Any) -> Any:
        assert isinstance(msg, WeightsRequest)
        return await self.holder.on_weights_request(cast(Any, SimpleNamespace(sender=self.sender)), msg)


async def _never(*_: Any) -> bool:
    return False


def _pair(tmp: Path, me: str) -> tuple[Transfers, Job, Transfers, Job]:
    spec = _spec(tmp)
    leader_job = _job(spec, tmp / "leader", LEADER, LEADER, Role.OWNER)
    leader = Transfers(cast(Any, None), {JOB: leader_job}, LEADER, _never)
    job = _job(spec, tmp / me, me, LEADER, Role.MEMBER)
    return leader, leader_job, Transfers(cast(Any, Wire(leader, me)), {JOB: job}, me, _never), job


def test_a_member_fetches_only_its_place_into_its_own_job_directory(tmp_path: Path) -> None:
    _, _, member, job = _pair(tmp_path, MEMBER)
    path = trio.run(member.fetch_weights, job, LEADER, Place(4, 5))
    assert path.parent == tmp_path / MEMBER / "weights"
    cfg = hf_cases.config("llama", vocab_size=2048, max_position_embeddings=256)
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == list(place_keys(cfg, 4, 5, _table(tmp_path / "w.safetensors", cfg)))
        assert sorted(f.keys()) == ["lm_head.weight", "model.norm.weight"]
    assert job_weights(job) is None  # a member holds no whole file to serve


def test_the_leader_serves_places_of_its_plan_only_and_the_whole_file_to_the_standby(tmp_path: Path) -> None:
    leader, _, _, _ = _pair(tmp_path, MEMBER)

    def ask(sender: str, msg: WeightsRequest) -> ShardData | JobAck:
        return trio.run(leader.on_weights_request, cast(Any, SimpleNamespace(sender=sender)), msg)

    assert isinstance(ask(MEMBER, WeightsRequest(JOB, 3)), ShardData)
    assert ask(STRANGER, WeightsRequest(JOB, 3)) == JobAck(False, "that device has no place in the current plan")
    assert ask(MEMBER, WeightsRequest(JOB, 2)) == JobAck(False, "that device has no place in the current plan")
    refused = ask(MEMBER, WeightsRequest(JOB, 3, whole=True))
    assert refused == JobAck(False, "the whole weights file goes to the job's standby only")
    whole = ask(STANDBY, WeightsRequest(JOB, 3, whole=True))
    assert isinstance(whole, ShardData) and whole.total == (tmp_path / "w.safetensors").stat().st_size


def test_the_standby_keeps_a_checked_whole_copy_and_serves_it_once_it_leads(tmp_path: Path) -> None:
    _, leader_job, standby, job = _pair(tmp_path, STANDBY)
    job.core.standby = STANDBY
    assert trio.run(standby.copy_weights, job, LEADER)
    assert job.paths.weights_copy.read_bytes() == (tmp_path / "w.safetensors").read_bytes()
    job.core.leader, job.core.role = STANDBY, Role.MEMBER  # it took over: it serves its copy
    assert job_weights(job) == job.paths.weights_copy
    (tmp_path / "w.safetensors").write_bytes(b"\0" * 64)  # the owner's file changed: the copy is not taken
    job.paths.weights_copy.unlink()
    job.core.leader = LEADER
    assert not trio.run(standby.copy_weights, job, LEADER) and not job.paths.weights_copy.exists()
    with pytest.raises(WeightsSliceError, match="did not serve"):  # nor a slice of a changed file
        trio.run(standby.fetch_weights, job, LEADER, Place(2, 4))
    assert leader_job.role == Role.OWNER


class Lying(Wire):
    """A leader that flips one byte at ``at`` of the slice it serves."""

    def __init__(self, holder: Transfers, sender: str, at: int) -> None:
        super().__init__(holder, sender)
        self.at = at

    async def request(self, address: str, peer: str, msg: Any, **kw: Any) -> Any:
        reply = await super().request(address, peer, msg, **kw)
        if isinstance(reply, ShardData) and msg.offset <= self.at < msg.offset + len(reply.data):
            data = bytearray(reply.data)
            data[self.at - msg.offset] ^= 0x08
            reply = ShardData(reply.total, bytes(data))
        return reply


def test_a_tensor_parallel_rank_receives_only_its_shards_and_refuses_a_tampered_chunk(tmp_path: Path) -> None:
    leader, leader_job, member, job = _pair(tmp_path, MEMBER)
    split_stage = _stage(2, 4, MEMBER, STRANGER, heads=(1, 1), columns=(30, 18))  # layers 1 and 2 over two ranks
    plan = SimpleNamespace(
        replicas=(SimpleNamespace(stages=(_stage(0, 2, LEADER), split_stage, _stage(4, 5, STANDBY))),)
    )
    leader_job.replica_plan = job.replica_plan = cast(Any, plan)
    place = place_of(job.replica_plan, MEMBER)
    assert place == Place(2, 4, ((1, 1), (30, 18), 0))
    path = trio.run(member.fetch_weights, job, LEADER, place)
    layout, whole = place_layout(job.spec.model, place), place_layout(job.spec.model, Place(2, 4))
    shards = sum(e.kept_nbytes for e in layout)
    digests = sum(32 * e.chunks.count for e in layout if e.chunks is not None)
    assert member.weights_received == shards + digests  # its shards and their chunk digests, nothing more
    assert shards < 0.7 * slice_size(whole) and member.weights_received < slice_size(whole)
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == [e.key for e in layout]
        assert tuple(f.get_slice("model.layers.1.self_attn.q_proj.weight").get_shape()) == (16, 32)  # 2 of 4 heads
        assert tuple(f.get_slice("model.layers.1.mlp.up_proj.weight").get_shape()) == (30, 32)  # 30 of 48 columns
        assert tuple(f.get_slice("model.layers.1.mlp.down_proj.weight").get_shape()) == (32, 30)
        assert tuple(f.get_slice("model.layers.1.input_layernorm.weight").get_shape()) == (32,)  # replicated
    first = next(i for i, e in enumerate(layout) if e.ranges)
    at = slice_size(layout[:first]) + 32 * cast(Any, layout[first].chunks).count + 7  # inside its first chunk
    member.peers = cast(Any, Lying(leader, MEMBER, at))
    with pytest.raises(WeightsSliceError) as info:
        trio.run(member.fetch_weights, job, LEADER, place)
    line = str(info.value)
    assert "\n" not in line and line.endswith("; refused"), line
    assert line.startswith(f"the leader {LEADER[:12]} served chunk 0 of {layout[first].key} not matching the job's")
    assert member.weights_refused == 1 and member.weights_received == shards + digests
    assert member.counters() == {"weights_received_bytes": shards + digests, "weights_refused": 1}  # (status)
