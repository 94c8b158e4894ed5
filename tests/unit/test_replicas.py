"""Data-parallel replicas: the ring schedule and all-reduce, DiLoCo's arithmetic, and 2 replicas x 2 stages
equal to one process on the same global batch (in-process threads over in-memory links and rings)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arceusd.worker.collective import InMemoryAllReduce
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import InMemoryFabric
from arceusd.worker.optim import LRSchedule
from arceusd.worker.pending_step import StepResult
from arceusd.worker.replicas import (
    DiLoCoConfig,
    ReplicaCodec,
    ReplicaConfig,
    ReplicaSync,
    SyncMode,
    bucket_ranges,
    outer_nesterov_step_,
    pseudo_gradient,
)
from arceusd.worker.ring import (
    InMemoryRing,
    Phase,
    RingChange,
    RingError,
    chunk_bounds,
    ring_allreduce_,
    ring_steps,
)
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from protocol.compression import Int8BlockCodec
from protocol.tensors import encode_tensor_frame
from tests.unit.test_engine import CASES, OPTIMIZERS, SEED, Case, _batches, gathered_params, prefixed, reference_run

# -- pure pieces -----------------------------------------------------------------------------------------------


@given(st.integers(0, 200), st.integers(1, 9))
def test_chunk_bounds_cover_in_order(numel: int, world: int) -> None:
    bounds = chunk_bounds(numel, world)
    assert len(bounds) == world and bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=50)
@given(st.integers(1, 7), st.integers(0, 40), st.integers(0, 2**31))
def test_ring_schedule_simulated_on_numbers_sums_everywhere(world: int, numel: int, seed: int) -> None:
    """Run every rank's ``ring_steps`` in lock step on plain lists: each ends with the elementwise sum."""
    gen = torch.Generator().manual_seed(seed)
    data = [torch.randint(-50, 50, (numel,), generator=gen).tolist() for _ in range(world)]
    want = [sum(col) for col in zip(*data, strict=True)] if numel else []
    bounds = chunk_bounds(numel, world)
    plans = [ring_steps(r, world) for r in range(world)]
    assert all(len(p) == 2 * (world - 1) for p in plans)
    for k in range(2 * (world - 1)):
        sent = [data[r][slice(*bounds[plans[r][k].send_chunk])] for r in range(world)]
        for r in range(world):
            step = plans[r][k]
            got = sent[(r - 1) % world]
            a, b = bounds[step.recv_chunk]
            assert plans[(r - 1) % world][k].send_chunk == step.recv_chunk  # the predecessor sends what r expects
            if step.phase is Phase.REDUCE_SCATTER:
                data[r][a:b] = [x + y for x, y in zip(data[r][a:b], got, strict=True)]
            else:
                data[r][a:b] = got
    assert all(d == want for d in data)


def test_bucket_ranges() -> None:
    assert bucket_ranges(10, 4, 16) == ((0, 4), (4, 8), (8, 10))
    assert bucket_ranges(3, 4, 1) == ((0, 1), (1, 2), (2, 3))
    assert bucket_ranges(0, 4, 16) == ()


def test_outer_nesterov_step_is_torch_sgd_nesterov() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(7, generator=gen)
    ref = torch.nn.Parameter(w.clone())
    opt = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    anchor, mom = w.clone(), torch.zeros(7)
    for _ in range(4):
        g = torch.randn(7, generator=gen)
        ref.grad = g.clone()
        opt.step()
        outer_nesterov_step_(anchor, mom, g, 0.7, 0.9)
        torch.testing.assert_close(anchor, ref.detach(), rtol=0, atol=1e-6)


def test_pseudo_gradient_with_lr_one_and_no_momentum_lands_on_the_average() -> None:
    anchor = torch.tensor([1.0, 2.0])
    replicas = [torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0])]
    avg = (pseudo_gradient(anchor, replicas[0]) + pseudo_gradient(anchor, replicas[1])) / 2
    outer_nesterov_step_(anchor, torch.zeros(2), avg, 1.0, 0.0)
    assert anchor.tolist() == [0.5, 1.0]


def test_config_bounds() -> None:
    with pytest.raises(ValueError, match="h must be"):
        DiLoCoConfig(h=0)
    with pytest.raises(ValueError, match="outer_momentum"):
        DiLoCoConfig(outer_momentum=1.0)
    with pytest.raises(ValueError, match="replicas must be"):
        ReplicaConfig(replicas=0)


# -- the ring over threads ---------------------------------------------------------------------------------------


def _run_threads(world: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def guarded(r: int) -> None:
        try:
            work(r)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    assert all(not t.is_alive() for t in threads), "a ring rank hung"


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("lossy", [False, True])
def test_ring_allreduce_sums_and_every_rank_gets_the_same_bits(world: int, lossy: bool) -> None:
    gen = torch.Generator().manual_seed(world)
    inputs = [torch.randn(1001, generator=gen) for _ in range(world)]
    outs = [t.clone() for t in inputs]
    ring = InMemoryRing(world, timeout_s=10)
    codec = Int8BlockCodec(64) if lossy else None
    _run_threads(world, lambda r: ring_allreduce_(outs[r], ring.link(r), *([codec] if codec else [])))
    want = torch.stack(inputs).sum(0)
    for out in outs:
        assert torch.equal(out, outs[0])
        torch.testing.assert_close(out, want, rtol=0, atol=0.1 * world if lossy else 1e-5)
    # each rank sends 2 (R - 1) chunks of ~numel / R values: 2 (R - 1) / R of the tensor
    assert ring.frames_sent == 2 * world * (world - 1)
    if world > 1 and not lossy:
        assert ring.bytes_sent >= 2 * (world - 1) * 1001 * 4


def test_a_frame_of_the_wrong_size_is_refused() -> None:
    ring = InMemoryRing(2, timeout_s=5)
    ring.link(1).send_next(encode_tensor_frame(torch.zeros(3)))
    with pytest.raises(RingError, match="does not fit"):
        ring_allreduce_(torch.zeros(8), ring.link(0))


# -- replicas of a pipeline equal one process ----------------------------------------------------------------------


def build_replicas(
    case: Case,
    replicas: int,
    schedule: ScheduleKind,
    config: ReplicaConfig,
    opt_name: str,
    lr: LRSchedule | None,
    clip: float | None,
    changes: dict[tuple[int, int, int], RingChange] | None = None,
) -> tuple[list[list[list[StageEngine]]], list[InMemoryRing]]:
    """``replicas`` pipelines of ``case.layout``; tensor-parallel rank k of stage s of every replica on one
    ring. Returns engines[replica][stage][rank] and the rings. ``changes``: (replica, stage, rank) -> where that
    engine's sync takes a smaller ring from."""
    widths = [1 if split is None else split.world_size for _, _, split in case.layout]
    rings = {(s, k): InMemoryRing(replicas, timeout_s=20) for s, w in enumerate(widths) for k in range(w)}
    pipelines = []
    for rep in range(replicas):
        fabric = InMemoryFabric(widths, timeout_s=20)
        stages = []
        for s, (start, end, split) in enumerate(case.layout):
            group = InMemoryAllReduce(widths[s], timeout_s=20) if split is not None else None
            ranks = []
            for k in range(widths[s]):
                module = build_stage(
                    case.model, SEED, StageSpec(start, end, split, k), group.rank_view(k) if group else None
                )
                engine_config = EngineConfig(
                    stage=s,
                    num_stages=len(case.layout),
                    num_micro_batches=case.micro_batches,
                    schedule=schedule,
                    optimizer=OPTIMIZERS[opt_name],
                    lr_schedule=lr,
                    max_grad_norm=clip,
                )
                change = changes.get((rep, s, k)) if changes is not None else None
                sync = ReplicaSync(config, rings[(s, k)].link(rep), change, change_timeout_s=20)
                ranks.append(StageEngine(module, fabric.links(s, k), engine_config, replicas=sync))
            stages.append(ranks)
        pipelines.append(stages)
    return pipelines, list(rings.values())


def drive_replicas(
    pipelines: list[list[list[StageEngine]]], batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[list[StepResult]]:
    """Every rank of every stage of every replica in its own thread; replica r gets the r-th equal share of
    each batch. Returns each replica's stage-0 rank-0 results."""
    replicas, last = len(pipelines), len(pipelines[0]) - 1
    results: dict[tuple[int, int, int], list[StepResult]] = {}
    workers = [(r, s, k) for r in range(replicas) for s in range(last + 1) for k in range(len(pipelines[r][s]))]

    def work(i: int) -> None:
        r, s, k = workers[i]
        out = []
        for x, y in batches:
            xs, ys = x.chunk(replicas)[r], y.chunk(replicas)[r]
            out.append(pipelines[r][s][k].run_step(xs if s == 0 else None, ys if s == last else None))
        results[(r, s, k)] = out

    _run_threads(len(workers), work)
    for (r, _, _), out in results.items():
        assert [o.loss for o in out] == [o.loss for o in results[(r, 0, 0)]]
    return [results[(r, 0, 0)] for r in range(replicas)]


@pytest.mark.parametrize("case_name", ["mlp-2", "gpt-2", "gpt-2-tp"])
@pytest.mark.parametrize("schedule", list(ScheduleKind))
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_two_replicas_of_two_stages_equal_one_process(case_name: str, schedule: ScheduleKind, opt_name: str) -> None:
    base = CASES[case_name]
    case = Case(base.model, base.layout, micro_batches=2, batch=8 if case_name.startswith("mlp") else 6)
    opt = OPTIMIZERS[opt_name]
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr / 10, warmup_steps=1, decay_steps=3)
    clip = 0.5
    ref_losses, ref_norms, ref_params = reference_run(case, opt, lr, clip)
    config = ReplicaConfig(replicas=2, bucket_bytes=1000)  # several buckets per stage
    pipelines, rings = build_replicas(case, 2, schedule, config, opt_name, lr, clip)
    per_replica = drive_replicas(pipelines, _batches(case.model, case.batch))
    for results in per_replica:
        torch.testing.assert_close(torch.tensor([r.loss for r in results]), torch.tensor(ref_losses), rtol=0, atol=1e-5)
        torch.testing.assert_close(
            torch.tensor([r.grad_norm for r in results]), torch.tensor(ref_norms), rtol=1e-5, atol=1e-5
        )
    assert max(ref_norms) > clip
    for rep in range(2):
        params = gathered_params(case, pipelines[rep])
        for name, p in ref_params.items():
            torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=prefixed(f"replica {rep} {name}"))
    first, second = (gathered_params(case, p) for p in pipelines)
    assert all(torch.equal(first[n], second[n]) for n in first)  # the replicas never drift apart
    assert all(ring.frames_sent > 0 for ring in rings)
    # the all-reduce overlaps the backward: buckets leave before the optimizer step
    assert all(e.replicas is not None and e.replicas.overlapped_buckets > 0 for p in pipelines for s in p for e in s)


def test_without_overlap_the_allreduce_runs_at_the_step_and_is_as_exact() -> None:
    case = Case(CASES["gpt-2"].model, CASES["gpt-2"].layout, micro_batches=2, batch=6)
    opt = OPTIMIZERS["sgd"]
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr, warmup_steps=0, decay_steps=1)
    ref_losses, _, ref_params = reference_run(case, opt, lr, None)
    config = ReplicaConfig(replicas=2, bucket_bytes=1000, overlap=False)
    pipelines, _ = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "sgd", lr, None)
    per_replica = drive_replicas(pipelines, _batches(case.model, case.batch))
    for results in per_replica:
        torch.testing.assert_close(torch.tensor([r.loss for r in results]), torch.tensor(ref_losses), rtol=0, atol=1e-5)
    params = gathered_params(case, pipelines[0])
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5)
    assert all(e.replicas is not None and e.replicas.overlapped_buckets == 0 for p in pipelines for s in p for e in s)


def test_compressed_gradient_allreduce_keeps_replicas_identical_with_a_quarter_of_the_bytes() -> None:
    case = Case(CASES["mlp-2"].model, CASES["mlp-2"].layout, micro_batches=2, batch=8)
    runs = {}
    for codec in (ReplicaCodec.RAW, ReplicaCodec.INT8):
        config = ReplicaConfig(replicas=2, bucket_bytes=1 << 20, grad_codec=codec)
        pipelines, rings = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "sgd", None, None)
        drive_replicas(pipelines, _batches(case.model, case.batch)[:2])
        first, second = (gathered_params(case, p) for p in pipelines)
        assert all(torch.equal(first[n], second[n]) for n in first)  # lossy, yet the same bits everywhere
        runs[codec] = (first, sum(r.bytes_sent for r in rings))
    (raw, raw_bytes), (int8, int8_bytes) = runs[ReplicaCodec.RAW], runs[ReplicaCodec.INT8]
    assert int8_bytes < 0.3 * raw_bytes
    assert any(not torch.equal(raw[n], int8[n]) for n in raw)  # the codec was used
    for n in raw:
        torch.testing.assert_close(int8[n], raw[n], rtol=0, atol=0.05)


def test_diloco_syncs_every_h_steps_and_leaves_replicas_identical() -> None:
    case = Case(CASES["mlp-2"].model, CASES["mlp-2"].layout, micro_batches=2, batch=8)
    config = ReplicaConfig(replicas=2, mode=SyncMode.DILOCO, diloco=DiLoCoConfig(h=2, codec=ReplicaCodec.INT8))
    pipelines, rings = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "adamw", None, None)
    batches = _batches(case.model, case.batch)[:2]  # two steps: one outer step at the end
    before = {n: p.clone() for n, p in gathered_params(case, pipelines[0]).items()}
    per_replica = drive_replicas(pipelines, batches)
    assert per_replica[0][0].loss != per_replica[1][0].loss  # each replica trains on its own share
    first, second = (gathered_params(case, p) for p in pipelines)
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert any(not torch.equal(first[n], before[n]) for n in first)
    assert all(e.replicas is not None and e.replicas.outer_steps == 1 for p in pipelines for st_ in p for e in st_)
    assert all(ring.frames_sent == 2 * 2 * 1 for ring in rings)  # one bucket, 2 ranks x 2 steps


def test_diloco_resumes_exactly_from_its_shards() -> None:
    """A shard carries DiLoCo's anchor and outer momentum (as optimizer buffers): stopping after 3 of 4 steps
    (mid-round, h = 2) and resuming from the shards ends where the straight run does, bit for bit."""
    case = Case(CASES["gpt-2"].model, CASES["gpt-2"].layout, micro_batches=2, batch=6)
    config = ReplicaConfig(replicas=2, mode=SyncMode.DILOCO, diloco=DiLoCoConfig(h=2, codec=ReplicaCodec.INT8))
    batches = _batches(case.model, case.batch) + _batches(case.model, case.batch)[:1]  # 4 steps
    straight, _ = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "adamw", None, None)
    drive_replicas(straight, batches)
    first, _ = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "adamw", None, None)
    drive_replicas(first, batches[:3])
    shards = [[{k: v.clone() for k, v in e.state_tensors().items()} for e in stage[0:1]] for p in first for stage in p]
    assert any(k.endswith(".outer_momentum") for k in shards[0][0])
    resumed, _ = build_replicas(case, 2, ScheduleKind.ONE_F_ONE_B, config, "adamw", None, None)
    flat = [e for p in resumed for stage in p for e in stage]
    for e, (state,) in zip(flat, shards, strict=True):
        e.load_state_tensors(state, step=3)
    drive_replicas(resumed, batches[3:])
    for a, b in zip(straight, resumed, strict=True):
        pa, pb = gathered_params(case, a), gathered_params(case, b)
        assert all(torch.equal(pa[n], pb[n]) for n in pa)
