"""Data-parallel replicas as real worker processes over the authenticated transport (loopback).

2 replicas x 2 stages, the same stage of both replicas joined by a ring of ``ring`` streams: with the
gradients all-reduced every step they equal a plain single-process loop on the whole global batch within 1e-5
(losses of every worker, final parameters); with DiLoCo the ring carries only the int8 pseudo-gradients, once
every ``h`` steps, and the bytes each worker handed to its ring stream are counted in its ``step`` events.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from arceusd.files.checkpoint import step_dir
from arceusd.files.safetensors_io import load_bytes
from arceusd.worker.protocol import (
    CheckpointEvent,
    DoneEvent,
    DropReplicaCommand,
    ErrorEvent,
    EvalEvent,
    GrowReplicaCommand,
    Listening,
    MemberConfig,
    ReplicaSyncConfig,
    ResumeConfig,
    RetireCommand,
    StageConfig,
    StartCommand,
    StepEvent,
    WitnessEvent,
)
from tests.integration.worker_harness import Layout, WorkerJob, gpt_spec, mnist_spec, reference_run

pytestmark = pytest.mark.slow


def _stage_values(job: WorkerJob, step: int, stage: int) -> int:
    shard = load_bytes((step_dir(job.checkpoint_dir, step) / f"stage{stage}-rank0.safetensors").read_bytes())
    return sum(t.numel() for k, t in shard.items() if k.startswith("param."))


@pytest.mark.parametrize("case", ["mlp-gpipe", "gpt-1f1b"])
def test_two_replicas_of_two_stages_over_the_wire_equal_one_process(tmp_path: Path, case: str) -> None:
    steps = 3
    if case == "mlp-gpipe":
        spec = mnist_spec([784, 32, 16, 10], steps, batch=32, micro=4)
        layout: Layout = [(0, 1, None), (1, 3, None)]
        schedule = "gpipe"
    else:  # SGD for the reason test_worker_exact gives (AdamW turns 1e-9 noise on rare rows into full steps)
        spec = gpt_spec(steps, batch=8, micro=2, grad_clip=0.5, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.0)
        layout = [(0, 2, None), (2, 4, None)]
        schedule = "1f1b"
    # small buckets: every stage's gradients travel in several ring rounds
    sync = ReplicaSyncConfig(mode="allreduce", bucket_bytes=4096)
    with WorkerJob(tmp_path, spec, layout, schedule=schedule, replicas=2, replica_sync=sync) as job:
        job.start()
        job.run(timeout=120)
        ref_losses, ref_params = reference_run(spec, steps)
        for w in job.workers:
            events = w.of(StepEvent)
            assert [e.step for e in events] == list(range(steps))
            torch.testing.assert_close(
                torch.tensor([e.loss for e in events]), torch.tensor(ref_losses), rtol=0, atol=1e-5
            )
            assert events[0].ring_bytes > 0 and events[-1].ring_bytes == steps * events[0].ring_bytes
            assert events[0].samples == spec.training.batch_size // 2  # each replica trains on half the batch
        params = job.gathered_params(steps)
        assert set(params) == set(ref_params)
        for name, p in ref_params.items():
            torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=f"parameter {name}")
        finals = {(e.val_loss, e.val_accuracy) for w in job.workers for e in w.of(EvalEvent) if e.step == steps}
        assert len(finals) == 1, f"the replicas evaluated to different models: {finals}"
        # all-reduce of fp32 gradients: each rank sends 2 (R - 1) / R = 1 x its stage's values per step
        for w in job.workers:
            values = _stage_values(job, steps, w.stage)
            assert values * 4 <= w.of(StepEvent)[0].ring_bytes <= values * 4 * 1.05 + 4096


def test_diloco_over_the_wire_syncs_every_h_steps_with_int8_pseudo_gradients(tmp_path: Path) -> None:
    steps, h = 4, 2
    spec = gpt_spec(steps, batch=8, micro=2)
    sync = ReplicaSyncConfig(mode="diloco", diloco_h=h, codec="int8")
    with WorkerJob(tmp_path, spec, [(0, 2, None), (2, 4, None)], schedule="1f1b", replicas=2, replica_sync=sync) as job:
        job.start()
        job.run(timeout=120)
        for w in job.workers:
            sent = [e.ring_bytes for e in w.of(StepEvent)]
            per_step = [b - a for a, b in zip([0, *sent], sent, strict=False)]
            # only the outer steps (after steps h, 2h) talk to the other replica, and they carry as much
            assert per_step[0] == per_step[2] == 0 and per_step[1] == per_step[3] > 0, per_step
            values = _stage_values(job, steps, w.stage)
            fp32_allreduce_per_step = values * 4  # what all-reduce would send every step (R = 2)
            # int8 with a scale per block: about a quarter of fp32, once per h steps
            assert per_step[1] < 0.3 * fp32_allreduce_per_step, (per_step[1], fp32_allreduce_per_step)
            assert per_step[1] >= values
            assert sum(per_step) < 0.16 * fp32_allreduce_per_step * steps  # vs all-reduce every step
        finals = {e.val_loss for w in job.workers for e in w.of(EvalEvent) if e.step == steps}
        assert len(finals) == 1, f"after the outer step both replicas hold the anchor: {finals}"
        losses = [[e.loss for e in w.of(StepEvent)] for w in job.workers if w.stage == 0]
        assert losses[0] != losses[1]  # each replica trained on its own half between the syncs


def test_a_dropped_replica_leaves_the_others_training_over_a_smaller_ring(tmp_path: Path) -> None:
    """3 replicas x 1 stage; replica 2's worker is killed after step 1 and the daemon's ``drop_replica`` reaches
    the other two: they redo the broken all-reduce over a ring of two and train to the end, alike."""
    steps = 8
    spec = mnist_spec([784, 32, 10], steps, batch=24, micro=2)
    sync = ReplicaSyncConfig(mode="allreduce", bucket_bytes=8192)
    with WorkerJob(
        tmp_path, spec, [(0, 2, None)], replicas=3, replica_sync=sync, checkpoint_interval=4, link_timeout_s=30
    ) as job:
        job.start()
        survivors, dead = job.workers[:2], job.workers[2]
        deadline = time.monotonic() + 60
        job.wait_past(1, deadline)
        assert dead.proc is not None
        dead.proc.kill()
        for w in survivors:
            w.send(DropReplicaCommand(replicas=3, index=2).to_line())
        for w in survivors:
            job.until_done(w, deadline)
            assert "replica 2 of 3 dropped" in w.log()
        first, second = ([e.loss for e in w.of(StepEvent)] for w in survivors)
        assert len(first) == steps and first == second  # the same averaged loss on both: one ring
        # a ring of three sends 4/3 of the stage's values a step, a ring of two 1x (2 (R - 1) / R)
        sent = [e.ring_bytes for e in survivors[0].of(StepEvent)]
        per_step = [b - a for a, b in zip([0, *sent], sent, strict=False)]
        values = _stage_values(job, steps, 0) * 4
        assert per_step[0] > 1.25 * values and values <= per_step[-1] < 1.1 * values + 8192, (per_step, values)
        witnesses = [{e.step: e.digest for e in w.of(WitnessEvent)} for w in survivors]
        assert witnesses[0] == witnesses[1] and set(witnesses[0]) == {4, steps}  # the replicas left hold alike
        assert [e.step for e in survivors[0].of(CheckpointEvent)] == [4, steps]  # replica 0 still writes them
        assert not survivors[1].of(CheckpointEvent)


def test_a_dropped_replica_is_rebuilt_from_a_checkpoint_while_the_other_holds(tmp_path: Path) -> None:
    """2 replicas x 1 stage; replica 1's worker is killed, and the drop asks the survivor to hold after its
    checkpoint. A new worker (a new device) starts in slot 1 from that checkpoint's shard, in the ring's next
    generation; the survivor's ``grow_replica`` brings it into the ring, and both train to the end alike, each on
    its own share of every batch, in the same processes."""
    steps, interval = 14, 6
    spec = mnist_spec([784, 32, 10], steps, batch=24, micro=2)
    sync = ReplicaSyncConfig(mode="allreduce", bucket_bytes=8192)
    with WorkerJob(
        tmp_path, spec, [(0, 2, None)], replicas=2, replica_sync=sync, checkpoint_interval=interval, link_timeout_s=30
    ) as job:
        real = job.start()
        survivor, dead = job.workers
        deadline = time.monotonic() + 60
        job.wait_past(1, deadline)
        assert dead.proc is not None
        dead.proc.kill()
        survivor.send(DropReplicaCommand(replicas=2, index=1, hold_at=interval).to_line())
        while not survivor.of(EvalEvent):  # its checkpoint's eval: then it holds
            ev = survivor.next_event(deadline)
            assert ev is not None and not isinstance(ev, ErrorEvent), f"{ev}\n{survivor.log()}"
        held = survivor.of(CheckpointEvent)[0].step
        assert held == interval and [e.step for e in survivor.of(StepEvent)][-1] == held - 1
        pid, state = job.new_identity("rebuilt")
        base = job.configs[survivor.peer_id]
        mine = (StageConfig(0, 2, (MemberConfig(pid, 0, 0),)),)
        shard = step_dir(job.checkpoint_dir, held) / "stage0-rank0.safetensors"
        config = replace(
            base,
            peer_id=pid,
            state_dir=str(state),
            stages=mine,
            replicas=(base.stages, mine),
            replica_slots=(0, 1),
            data_shares=2,
            ring_generation=2,
            checkpoint_dir=str(tmp_path / "rebuilt-checkpoints"),
            resume=ResumeConfig(held, str(shard)),
        )
        rebuilt = job.add_worker(config, "rebuilt", replica=1)
        listening = rebuilt.next_event(deadline)
        assert isinstance(listening, Listening), rebuilt.log()
        address = f"127.0.0.1:{listening.port}"
        time.sleep(0.5)
        assert not survivor.of(StepEvent)[-1].step >= held, "the survivor went on instead of holding"
        rebuilt.send(StartCommand({**real, pid: address}).to_line())
        survivor.send(GrowReplicaCommand(held, 1, 2, ((pid,),), {pid: address}).to_line())
        for w in (survivor, rebuilt):
            job.until_done(w, deadline)
        assert "the replica of slot 1 was rebuilt at step 6" in survivor.log()
        after = [(e.step, e.loss) for e in survivor.of(StepEvent) if e.step >= held]
        assert after == [(e.step, e.loss) for e in rebuilt.of(StepEvent)]  # one ring again: the same averaged loss
        assert [e.step for e in rebuilt.of(StepEvent)] == list(range(held, steps))
        witnesses = [{e.step: e.digest for e in w.of(WitnessEvent)} for w in (survivor, rebuilt)]
        assert witnesses[0] == witnesses[1] and set(witnesses[0]) == {12, steps}  # they hold alike again
        assert next(e.samples for e in rebuilt.of(StepEvent)) == 12  # its own half of each batch


def test_the_data_owners_replica_dropped_its_worker_serves_the_others_to_the_end(tmp_path: Path) -> None:
    """2 replicas x 2 stages; the owner's replica loses its second stage. The owner's worker, whose links broke,
    waits to be retired instead of failing; retired, it serves the other replica's data until that one is done,
    which trains on alone and writes the checkpoint shards now (it is the first replica left)."""
    steps, interval = 12, 4
    spec = mnist_spec([784, 32, 10], steps, batch=24, micro=2)
    sync = ReplicaSyncConfig(mode="allreduce", bucket_bytes=8192)
    with WorkerJob(
        tmp_path,
        spec,
        [(0, 1, None), (1, 2, None)],
        replicas=2,
        replica_sync=sync,
        checkpoint_interval=interval,
        link_timeout_s=30,
    ) as job:
        job.start()
        owner, lost, first, second = job.workers
        deadline = time.monotonic() + 60
        job.wait_past(1, deadline)
        assert lost.proc is not None
        lost.proc.kill()
        time.sleep(0.5)  # the owner's links break first; it waits instead of failing
        owner.send(RetireCommand().to_line())
        for w in (first, second):
            w.send(DropReplicaCommand(replicas=2, index=0).to_line())
        for w in (first, second, owner):
            job.until_done(w, deadline)
        assert "waiting to be retired" in owner.log() and "retired at step" in owner.log()
        assert owner.of(DoneEvent)[0].step < steps
        assert [e.step for e in first.of(StepEvent)] == list(range(steps))
        # the replica left is the first now: its devices write the shards of the later checkpoints
        written = [e.step for e in first.of(CheckpointEvent)]
        assert written and written[-1] == steps and written == [e.step for e in second.of(CheckpointEvent)]
        assert not first.of(WitnessEvent) or first.of(WitnessEvent)[-1].step < written[0]  # no one to witness for
