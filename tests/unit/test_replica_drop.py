"""A replica dropped while the others train on (issue 22): the ring breaks, every survivor takes the smaller ring
the leader's drop brings (``ring.RingChange``), checks that its peers completed as many syncs as it did, and
redoes the failed sync over it (in-process threads over in-memory rings).

Exactness: after replica 2 of 3 is dropped at step 1, the survivors train exactly as one process does on the
first two shares of each batch (the lost share is skipped, the average taken over the two replicas left)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from arceusd.models.build import build_reference_model, loss_mean
from arceusd.worker.optim import LRSchedule
from arceusd.worker.protocol import DropReplicaCommand, WorkerProtocolError, parse_command
from arceusd.worker.replicas import DiLoCoConfig, ReplicaConfig, ReplicaSync, SyncMode, outer_nesterov_step_
from arceusd.worker.ring import InMemoryRing, RingChange, RingError
from arceusd.worker.ring_links import drop_from, generation_of, ring_kind
from arceusd.worker.schedule import ScheduleKind
from tests.unit.test_engine import (
    CASES,
    OPTIMIZERS,
    SEED,
    STEPS,
    Case,
    _batches,
    _torch_optimizer,
    gathered_params,
    prefixed,
)
from tests.unit.test_replicas import _run_threads, build_replicas


def _drop_later(old: list[InMemoryRing], changes: dict[int, RingChange], world: int, after: float = 0.2) -> None:
    """In ``after`` seconds: break the old rings (the dead replica's links end) and offer each survivor its
    rank in a new ring of ``world`` (one per old ring, same order)."""

    def drop() -> None:
        time.sleep(after)
        for ring in old:
            ring.break_("replica 2 died")
        new = [InMemoryRing(world, timeout_s=20) for _ in old]
        for rank, change in sorted(changes.items()):
            for ring in new:
                change.offer(ring.link(rank))

    threading.Thread(target=drop, daemon=True).start()


def _ignore(_: object) -> None:
    return None


def _grad(p: nn.Parameter) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def _linear_syncs(
    config: ReplicaConfig, survivors: int, overlap_params: list[list[nn.Parameter]] | None = None
) -> tuple[InMemoryRing, list[ReplicaSync], dict[int, RingChange]]:
    ring = InMemoryRing(config.replicas, timeout_s=20)
    changes = {r: RingChange() for r in range(survivors)}
    syncs = [ReplicaSync(config, ring.link(r), changes.get(r), change_timeout_s=20) for r in range(config.replicas)]
    if overlap_params is not None:
        for sync, params in zip(syncs, overlap_params, strict=True):
            sync.attach(params, micro_batches=1)
    return ring, syncs, changes


@pytest.mark.parametrize("overlap", [False, True])
def test_a_broken_allreduce_is_redone_over_the_replicas_left(overlap: bool) -> None:
    models = [nn.Linear(7, 3) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    params = [list(m.parameters()) for m in models]
    config = ReplicaConfig(replicas=3, bucket_bytes=40, overlap=overlap)
    ring, syncs, changes = _linear_syncs(config, 2, params if overlap else None)
    gen = torch.Generator().manual_seed(5)

    def backward(r: int) -> None:
        models[r].zero_grad()
        models[r](torch.randn(4, 7, generator=gen)).square().sum().backward()

    # step 0: all three replicas
    for r in range(3):
        backward(r)
    _run_threads(3, lambda r: _ignore(syncs[r].average_grads(params[r], float(r))))
    assert all(s.rounds == 1 for s in syncs)
    # step 1: replica 2 is gone; its ring breaks, the survivors redo the step over a ring of two
    for r in range(2):
        backward(r)
    local = [[_grad(p).clone() for p in params[r]] for r in range(2)]
    reports: dict[int, float] = {}
    _drop_later([ring], changes, 2)
    _run_threads(2, lambda r: reports.__setitem__(r, syncs[r].average_grads(params[r], 10.0 * (r + 1))))
    assert reports == {0: 15.0, 1: 15.0}
    for i in range(len(params[0])):
        want = (local[0][i] + local[1][i]) / 2
        for r in range(2):
            torch.testing.assert_close(params[r][i].grad, want, rtol=0, atol=1e-6)
    assert [(s.world, s.redone, s.rounds) for s in syncs[:2]] == [(2, 1, 2), (2, 1, 2)]
    # step 2 runs over the smaller ring (overlapped again when it was)
    for r in range(2):
        backward(r)
    _run_threads(2, lambda r: _ignore(syncs[r].average_grads(params[r], 1.0)))
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(params[0], params[1], strict=True))  # type: ignore[arg-type]
    assert [s.rounds for s in syncs[:2]] == [3, 3]


def test_diloco_outer_step_is_redone_over_the_replicas_left() -> None:
    config = ReplicaConfig(replicas=3, mode=SyncMode.DILOCO, bucket_bytes=24, diloco=DiLoCoConfig(h=2))
    ring, syncs, changes = _linear_syncs(config, 2)
    start = torch.randn(10, generator=torch.Generator().manual_seed(1))
    params = [[nn.Parameter(start.clone())] for _ in range(3)]
    for sync, ps in zip(syncs, params, strict=True):
        sync.start(ps)
    moved = [start - 0.1 * (r + 1) for r in range(3)]
    for r in range(2):
        with torch.no_grad():
            params[r][0].copy_(moved[r])
    assert not any(s.after_step(p, 1) for s, p in zip(syncs[:2], params[:2], strict=True))  # not an outer step yet
    _drop_later([ring], changes, 2)
    _run_threads(2, lambda r: _ignore(syncs[r].after_step(params[r], 2)))
    anchor, momentum = start.clone(), torch.zeros(10)
    outer_nesterov_step_(anchor, momentum, ((start - moved[0]) + (start - moved[1])) / 2, 0.7, 0.9)
    for r in range(2):
        torch.testing.assert_close(params[r][0].detach(), anchor, rtol=0, atol=1e-6)
        assert syncs[r].outer_steps == 1 and syncs[r].redone == 1


def test_survivors_that_completed_different_syncs_refuse_to_redo() -> None:
    config = ReplicaConfig(replicas=3, overlap=False)
    ring, syncs, changes = _linear_syncs(config, 2)
    syncs[0].rounds = 1  # this one finished the sync the other could not: no common redo exists
    params = [[nn.Parameter(torch.ones(4))] for _ in range(2)]
    for ps in params:
        ps[0].grad = torch.ones(4)
    _drop_later([ring], changes, 2)
    errors: list[BaseException] = []

    def work(r: int) -> None:
        try:
            syncs[r].average_grads(params[r], 0.0)
        except RingError as exc:
            errors.append(exc)

    _run_threads(2, work)
    assert len(errors) == 2 and all("completed different numbers of syncs" in str(e) for e in errors)


def test_without_a_change_or_an_offer_a_broken_ring_fails_the_sync() -> None:
    config = ReplicaConfig(replicas=2, overlap=False)
    ring = InMemoryRing(2, timeout_s=20)
    plain = ReplicaSync(config, ring.link(0))
    ring.break_("peer gone")
    param = nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    with pytest.raises(RingError, match="peer gone"):
        plain.average_grads([param], 0.0)
    waiting = ReplicaSync(config, ring.link(0), RingChange(), change_timeout_s=0.2)
    with pytest.raises(RingError, match=r"no smaller ring was offered within 0\.2s"):
        waiting.average_grads([param], 0.0)


@pytest.mark.parametrize("schedule", list(ScheduleKind))
def test_survivors_of_a_dropped_replica_train_like_one_process_on_their_shares(schedule: ScheduleKind) -> None:
    base = CASES["mlp-2"]
    case = Case(base.model, base.layout, micro_batches=2, batch=12)
    opt = OPTIMIZERS["adamw"]
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr / 10, warmup_steps=1, decay_steps=3)
    clip = 0.5
    batches = _batches(case.model, case.batch)
    # one process: step 0 on the whole batch, then the first two thirds (the survivors' shares)
    ref_model = build_reference_model(case.model, SEED)
    ref_opt = _torch_optimizer(opt, ref_model)
    for step, (x, y) in enumerate(batches):
        if step > 0:
            x, y = x[:8], y[:8]
        for g in ref_opt.param_groups:
            g["lr"] = lr(step)
        ref_opt.zero_grad()
        loss_mean(ref_model(x), y).backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), clip)
        ref_opt.step()
    changes = {(r, s, 0): RingChange() for r in range(2) for s in range(2)}
    config = ReplicaConfig(replicas=3, bucket_bytes=1000)
    pipelines, rings = build_replicas(case, 3, schedule, config, "adamw", lr, clip, changes)
    workers = [(r, s) for r in range(3) for s in range(2)]

    def work(i: int) -> None:
        r, s = workers[i]
        for step, (x, y) in enumerate(batches if r < 2 else batches[:1]):  # replica 2 dies after step 0
            xs, ys = x.chunk(3)[r], y.chunk(3)[r]
            pipelines[r][s][0].run_step(xs if s == 0 else None, ys if s == 1 else None)
            del step

    dead_done = threading.Event()

    def drop() -> None:
        dead_done.wait(60)
        time.sleep(0.2)
        for ring in rings:
            ring.break_("replica 2 died")
        for s in range(2):
            new = InMemoryRing(2, timeout_s=20)
            for r in range(2):
                changes[(r, s, 0)].offer(new.link(r))

    threading.Thread(target=drop, daemon=True).start()
    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t, (r, _) in zip(threads, workers, strict=True):
        if r == 2:
            t.join(60)
    dead_done.set()
    for t in threads:
        t.join(60)
    assert all(not t.is_alive() for t in threads), "a survivor hung"
    ref = {n: p.detach() for n, p in ref_model.named_parameters()}
    for rep in range(2):
        params = gathered_params(case, pipelines[rep])
        for name, p in ref.items():
            torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=prefixed(f"replica {rep} {name}"))
    assert STEPS > 2
    syncs = [pipelines[r][s][0].replicas for r in range(2) for s in range(2)]
    assert all(sync is not None and sync.world == 2 and sync.redone == 1 for sync in syncs)


def test_ring_generations_and_drops_are_checked() -> None:
    assert [generation_of(ring_kind(g)) for g in (0, 1, 7)] == [0, 1, 7]
    assert [generation_of(k) for k in ("ring.0", "ring.-1", "ring.x", "ringx", "ring.99999", "act")] == [None] * 6
    assert drop_from((0, 1, 2), 3, 1, mine=0) == (0, 2)
    assert drop_from((0, 2), 2, 0, mine=2) == (2,)
    for args, match in [((3, 1, 2), "this ring has 2"), ((2, 2, 0), "no replica 2"), ((2, 0, 0), "its own")]:
        with pytest.raises(ValueError, match=match):
            drop_from((0, 2), *args[:2], mine=args[2])
    assert parse_command('{"cmd": "drop_replica", "replicas": 3, "index": 2}') == DropReplicaCommand(3, 2)
    for bad in (
        '{"cmd": "drop_replica", "replicas": 1, "index": 0}',
        '{"cmd": "drop_replica", "replicas": 3}',
        '{"cmd": "drop_replica", "replicas": 3, "index": 3}',
    ):
        with pytest.raises(WorkerProtocolError):
            parse_command(bad)


def test_after_the_ring_grows_back_a_later_drop_finds_old_and_rebuilt_ranks_alike() -> None:
    """A rebuilt replica starts counting its syncs at 0; the replicas that held for it count from 0 again, so a
    later drop's agreement check passes between an old rank and the rebuilt one."""
    config = ReplicaConfig(replicas=3, overlap=False)
    old = InMemoryRing(3, timeout_s=20)
    changes = {0: RingChange(), 2: RingChange()}
    syncs = [ReplicaSync(config, old.link(r), changes.get(r), change_timeout_s=20) for r in range(3)]
    syncs[0].rounds = syncs[1].rounds = 7  # the replicas that held, after many syncs; syncs[2] is the rebuilt one
    grown = InMemoryRing(3, timeout_s=20)
    for r, sync in enumerate(syncs):
        sync.grown(grown.link(r))
    params = [[nn.Parameter(torch.ones(4))] for _ in range(3)]
    for r, ps in enumerate(params):
        ps[0].grad = torch.full((4,), float(r))
    _run_threads(3, lambda r: _ignore(syncs[r].average_grads(params[r], 0.0)))
    assert [s.rounds for s in syncs] == [1, 1, 1]
    # an old replica (1) is lost now: the other old one and the rebuilt one redo the next sync over a ring of two
    left = [0, 2]
    for r in left:
        params[r][0].grad = torch.full((4,), float(r))

    def drop() -> None:
        time.sleep(0.2)
        grown.break_("replica 1 died")
        smaller = InMemoryRing(2, timeout_s=20)
        for rank, r in enumerate(left):
            changes[r].offer(smaller.link(rank))

    threading.Thread(target=drop, daemon=True).start()
    _run_threads(2, lambda i: _ignore(syncs[left[i]].average_grads(params[left[i]], 0.0)))
    assert [syncs[r].redone for r in left] == [1, 1] and [syncs[r].rounds for r in left] == [2, 2]
    assert all(torch.equal(_grad(params[r][0]), torch.ones(4)) for r in left)  # the mean of 0 and 2
