"""Stage-worker processes: each holds only its slice, peers are authenticated, ``stop`` exits 0, int8 wire.

Real processes and real gRPC on 127.0.0.1 (``worker_harness`` plays the daemon).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
import torch
import trio

from arceusd.base.identity import Identity
from arceusd.models.build import build_reference_model
from arceusd.transport import Stream, open_transport
from arceusd.worker.protocol import CheckpointEvent, DoneEvent, ErrorEvent, StepEvent
from protocol.errors import RemoteProtocolError
from tests.integration.worker_harness import WorkerJob, gpt_spec, mnist_spec

pytestmark = pytest.mark.slow


def test_each_of_three_workers_holds_at_most_half_of_the_model(tmp_path: Path) -> None:
    spec = gpt_spec(2, n_layer=4, n_head=4, n_embd=32, block=16, batch=8, micro=2)
    layout = [(0, 2, None), (2, 4, None), (4, 6, None)]
    with WorkerJob(tmp_path, spec, layout, schedule="1f1b") as job:
        job.start()
        job.run(timeout=60)
        model = build_reference_model(spec.model, spec.seed)
        full = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # params + AdamW m and v
        held = []
        for w in job.workers:
            (ckpt,) = w.of(CheckpointEvent)
            assert ckpt.optimizer_bytes == 2 * ckpt.param_bytes > 0
            held.append(ckpt.param_bytes + ckpt.optimizer_bytes)
            assert held[-1] <= full / 2, f"worker {w.stage} holds {held[-1]} of {full} bytes"
        assert sum(held) == full  # together they hold the whole model exactly once


async def _stranger_is_refused(address: str, purpose: bytes, peer_id: str) -> bool:
    """Open a stream to a worker with a key the plan does not name; True if the worker hung up at once."""

    async def no_calls(request: bytes) -> bytes:
        return b""

    async def no_streams(stream: Stream) -> None:
        return None

    async with open_transport(
        Identity.generate(), "127.0.0.1", 0, unary_handler=no_calls, stream_handler=no_streams
    ) as transport:
        with trio.fail_after(10):
            stream = await transport.connect_stream(address, purpose, expect_peer_id=peer_id)
            try:
                await stream.send(b"\x00" * 13, b"")
                await stream.receive()
            except (trio.EndOfChannel, RemoteProtocolError):
                return True
            finally:
                await stream.aclose()
    return False


def test_a_stranger_is_refused_and_training_goes_on(tmp_path: Path) -> None:
    spec = mnist_spec([784, 16, 10], 3, batch=16, micro=2)
    with WorkerJob(tmp_path, spec, [(0, 1, None), (1, 2, None)], job_id="job-auth") as job:
        addresses = job.start()
        last = job.workers[1]
        assert trio.run(_stranger_is_refused, addresses[last.peer_id], b"job-auth/1/act", last.peer_id)
        job.run(timeout=60)
        assert len(last.of(StepEvent)) == 3


def test_a_wrong_peer_at_an_address_is_refused(tmp_path: Path) -> None:
    spec = mnist_spec([784, 16, 10], 3, batch=16, micro=2)
    with WorkerJob(tmp_path, spec, [(0, 1, None), (1, 2, None)]) as job:
        a, b = job.workers
        job.spawn()
        real = job.wait_listening()
        swapped = {a.peer_id: real[b.peer_id], b.peer_id: real[a.peer_id]}
        for w in job.workers:
            w.send(f'{{"cmd":"start","addresses":{_json(swapped)}}}')
        deadline = time.monotonic() + 30
        for w in job.workers:
            events = []
            while (ev := w.next_event(deadline)) is not None:
                events.append(ev)
            errors = [e for e in events if isinstance(e, ErrorEvent)]
            assert errors, (events, w.log())
            # the answering worker refuses a hello meant for another peer (or the client refuses the answer)
            assert "peer" in errors[0].message
            assert "wrong_recipient" in errors[0].message or "unexpected_peer" in errors[0].message
            assert not any(isinstance(e, StepEvent) for e in events)
            assert w.proc is not None and w.proc.wait(timeout=10) != 0


def _json(d: dict[str, str]) -> str:
    import json

    return json.dumps(d)


def test_stop_exits_zero_before_start_and_during_training(tmp_path: Path) -> None:
    spec = mnist_spec([784, 16, 10], 400, batch=16, micro=2)
    with WorkerJob(tmp_path / "idle", spec, [(0, 1, None), (1, 2, None)]) as idle:
        idle.spawn()
        idle.wait_listening()
        for w in idle.workers:
            idle.stop(w)
        for w in idle.workers:
            assert w.proc is not None and w.proc.wait(timeout=15) == 0
    with WorkerJob(tmp_path / "busy", spec, [(0, 1, None), (1, 2, None)]) as busy:
        busy.start()
        first = busy.workers[0]
        deadline = time.monotonic() + 30
        while not isinstance(first.next_event(deadline), StepEvent):
            pass
        began = time.monotonic()
        last = busy.workers[-1]
        busy.stop(last)  # the next stage stops first and ends its streams; the first is told a moment later
        assert last.proc is not None and last.proc.wait(timeout=15) == 0
        time.sleep(0.2)
        busy.stop(first)
        assert first.proc is not None and first.proc.wait(timeout=15) == 0
        assert time.monotonic() - began < 15
        assert not any(isinstance(e, DoneEvent) for w in busy.workers for e in w.events)


def test_a_neighbour_that_dies_fails_a_worker_that_was_not_told_to_stop(tmp_path: Path) -> None:
    spec = mnist_spec([784, 16, 10], 400, batch=16, micro=2)
    with WorkerJob(tmp_path, spec, [(0, 1, None), (1, 2, None)]) as job:
        job.start()
        first, last = job.workers
        deadline = time.monotonic() + 30
        while not isinstance(first.next_event(deadline), StepEvent):
            pass
        assert last.proc is not None
        last.proc.kill()
        assert first.proc is not None and first.proc.wait(timeout=30) != 0
        deadline = time.monotonic() + 10
        while first.next_event(deadline) is not None:  # read to the end of its output
            pass
        errors = [e for e in first.events if isinstance(e, ErrorEvent)]
        assert errors and last.peer_id in errors[0].message


def test_int8_wire_compression_stays_within_two_percent_of_fp32(tmp_path: Path) -> None:
    """Per-step relative loss difference <= 2% on every step (no warm-up exclusion needed)."""
    steps = 8
    curves = {}
    for compression in ("none", "int8"):
        spec = gpt_spec(steps, n_layer=2, n_head=4, n_embd=32, block=32, batch=8, micro=2, compression=compression)
        with WorkerJob(tmp_path / compression, spec, [(0, 2, None), (2, 4, None)], schedule="1f1b") as job:
            job.start()
            job.run(timeout=60)
            curves[compression] = torch.tensor([e.loss for e in job.workers[0].of(StepEvent)])
    fp32, int8 = curves["none"], curves["int8"]
    assert len(fp32) == len(int8) == steps
    assert fp32[-1] < fp32[0]  # it trains
    rel = ((int8 - fp32).abs() / fp32).max().item()
    assert rel <= 0.02, f"int8 loss curve deviates {rel:.4f} from fp32"
    assert not torch.equal(fp32[1:], int8[1:])  # the codec really was on the wire


def _thread_cores(pid: int) -> dict[str, str]:
    """Every thread of process ``pid``: its name and allowed cores (``Cpus_allowed_list`` of /proc)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            out[f"{fields['Name'].strip()}/{tid}"] = fields["Cpus_allowed_list"].strip()
    return out


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_workers_pinned_to_cores_run_every_thread_there(tmp_path: Path) -> None:
    """``cpus`` in the worker config pins the whole process: its transport, event-loop and compute threads all
    run on the given core (checked from /proc while the job trains), and the job still trains to the end."""
    cores = sorted(os.sched_getaffinity(0))
    cpus = [(cores[0],), (cores[-1],)]
    spec = gpt_spec(30, n_layer=2, n_head=2, n_embd=16, block=8, batch=4, micro=2, eval_iters=0)
    with WorkerJob(tmp_path, spec, [(0, 2, None), (2, 4, None)], schedule="1f1b", cpus=cpus) as job:
        job.start()
        first = job.workers[0].next_event(time.monotonic() + 60)  # a step: every thread has started
        assert isinstance(first, StepEvent), first
        for w, (core,) in zip(job.workers, cpus, strict=True):
            assert w.proc is not None
            threads = _thread_cores(w.proc.pid)
            assert len(threads) >= 4, threads  # main (trio), compute, grpc's: not just the first thread
            assert set(threads.values()) == {str(core)}, threads
        job.run(timeout=60)
    assert len(job.workers[1].of(StepEvent)) == 30
