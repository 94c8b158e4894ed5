"""Asynchronous sends of the wire links: order per route, back-pressure, no swallowed failure, exactness.

``RouteQueues`` alone with a recording sink (pure hand-off logic), then ``WireFabric`` for real over the
in-memory transport twin (same handshake and per-frame MAC as gRPC, no sockets): compute threads run the
engines exactly as the worker process does (``trio.to_thread.run_sync``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import pytest
import torch
import trio

from arceusd.base.identity import Identity
from arceusd.transport import MemoryNetwork, Stream
from arceusd.worker.engine import EngineConfig, StageEngine
from arceusd.worker.links import LinkError
from arceusd.worker.optim import AdamWConfig, LRSchedule
from arceusd.worker.pending_step import StepResult
from arceusd.worker.protocol import MemberConfig, StageConfig, WorkerConfig
from arceusd.worker.route_queues import RouteQueues
from arceusd.worker.schedule import ScheduleKind
from arceusd.worker.stage import StageSpec, build_stage
from arceusd.worker.tensor_parallel import TPSplit
from arceusd.worker.wire_links import WireFabric
from tests.unit.test_engine import CASES, STEPS, Case, _batches, gathered_params, reference_run

ROUTE = ("act", "peer-b")


class RecordingSink:
    """Records frames; each send first waits for ``gate``; ``fail_at`` makes that send (0-based) raise."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.frames: list[tuple[bytes, bytes]] = []
        self.gate = trio.Event()
        self.fail_at = fail_at
        self.calls = 0

    async def send(self, header: bytes, payload: bytes | bytearray | memoryview = b"") -> None:
        await self.gate.wait()
        n, self.calls = self.calls, self.calls + 1
        if n == self.fail_at:
            raise trio.ClosedResourceError("the stream is closed for sending")
        self.frames.append((header, bytes(payload)))


async def _wait_until(condition: Callable[[], bool], what: str) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.005)


def _queues(capacity: int = 8) -> RouteQueues:
    return RouteQueues([], [ROUTE], timeout_s=10, capacity=capacity, token=trio.lowlevel.current_trio_token())


def test_post_returns_before_the_send_and_frames_leave_in_order() -> None:
    trio.run(_post_returns_before_the_send_and_frames_leave_in_order)


async def _post_returns_before_the_send_and_frames_leave_in_order() -> None:
    queues, sink = _queues(), RecordingSink()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queues.run_sender, ROUTE, sink)

        def compute() -> None:
            for i in range(5):
                queues.post(ROUTE, f"h{i}".encode(), bytes([i]) * 3)

        with trio.fail_after(10):  # every post returned although no send could complete (gate closed)
            await trio.to_thread.run_sync(compute)
        assert sink.frames == []
        sink.gate.set()
        with trio.fail_after(10):
            await trio.to_thread.run_sync(queues.flush)
        assert sink.frames == [(f"h{i}".encode(), bytes([i]) * 3) for i in range(5)]
        assert await queues.drain_senders(10)


def test_post_waits_for_room_when_the_route_is_full() -> None:
    trio.run(_post_waits_for_room_when_the_route_is_full)


async def _post_waits_for_room_when_the_route_is_full() -> None:
    queues, sink = _queues(capacity=2), RecordingSink()
    posted: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queues.run_sender, ROUTE, sink)

        def compute() -> None:
            for i in range(4):
                queues.post(ROUTE, bytes([i]), b"")
                posted.append(i)

        nursery.start_soon(trio.to_thread.run_sync, compute)
        await _wait_until(lambda: len(posted) == 2, "two posts")
        await trio.sleep(0.2)
        assert posted == [0, 1]  # the third post waits: two frames are queued or being sent
        sink.gate.set()
        await _wait_until(lambda: len(sink.frames) == 4, "all four frames")
        assert [h for h, _ in sink.frames] == [bytes([i]) for i in range(4)]
        await queues.drain_senders(10)


def test_a_failed_send_is_raised_on_the_compute_thread_naming_the_peer() -> None:
    trio.run(_a_failed_send_is_raised_on_the_compute_thread_naming_the_peer)


async def _a_failed_send_is_raised_on_the_compute_thread_naming_the_peer() -> None:
    queues, sink = _queues(), RecordingSink(fail_at=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queues.run_sender, ROUTE, sink)
        errors: list[str] = []

        def post_three() -> None:  # the gate is shut: all three are queued before the second send fails
            for i in range(3):
                queues.post(ROUTE, bytes([i]), b"")

        def after_the_failure() -> None:
            for call in (queues.flush, lambda: queues.post(ROUTE, b"late", b""), queues.check):
                try:
                    call()
                except LinkError as exc:
                    errors.append(str(exc))

        with trio.fail_after(10):
            await trio.to_thread.run_sync(post_three)
            sink.gate.set()
            await trio.to_thread.run_sync(after_the_failure)
    assert len(errors) == 3  # flush, a later post and check all raise it: nothing is swallowed
    assert all("sending act to peer peer-b failed" in e and "ClosedResourceError" in e for e in errors)
    assert sink.frames == [(b"\x00", b"")]


def test_a_receive_waiting_for_a_frame_sees_a_failed_send_at_once() -> None:
    trio.run(_a_receive_waiting_for_a_frame_sees_a_failed_send_at_once)


async def _a_receive_waiting_for_a_frame_sees_a_failed_send_at_once() -> None:
    queues = RouteQueues([("grad", "peer-b")], [ROUTE], timeout_s=30, token=trio.lowlevel.current_trio_token())
    sink = RecordingSink(fail_at=0)
    sink.gate.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(queues.run_sender, ROUTE, sink)

        def compute() -> str:
            queues.post(ROUTE, b"x", b"")
            try:
                queues.take(("grad", "peer-b"))
            except LinkError as exc:
                return str(exc)
            return "no error"

        with trio.fail_after(10):  # far below the 30 s receive timeout
            message = await trio.to_thread.run_sync(compute)
    assert "sending act to peer peer-b failed" in message


# ---------------------------------------------------------------------------------------------- over the wire


def _plan(ids: Sequence[Sequence[str]], layout: Sequence[tuple[int, int, TPSplit | None]]) -> list[StageConfig]:
    stages = []
    for (start, end, split), members in zip(layout, ids, strict=True):
        stages.append(
            StageConfig(
                start,
                end,
                tuple(
                    MemberConfig(p, split.heads[r], split.columns[r]) if split else MemberConfig(p)
                    for r, p in enumerate(members)
                ),
            )
        )
    return stages


def _config(stages: list[StageConfig], me: str, micro: int, schedule: str, timeout: float) -> WorkerConfig:
    return WorkerConfig(
        job_id="job-async",
        term=1,
        epoch=1,
        spec={},
        stages=tuple(stages),
        micro_batches=micro,
        schedule=schedule,
        peer_id=me,
        state_dir="/nonexistent",
        listen_host="127.0.0.1",
        owner=stages[0].members[0].peer_id,
        checkpoint_dir="/nonexistent",
        checkpoint_interval=0,
        total_steps=STEPS,
        link_timeout_s=timeout,
    )


async def _refuse(request: bytes) -> bytes:
    return b""


async def with_fabrics(
    layout: Sequence[tuple[int, int, TPSplit | None]],
    body: Callable[[list[WireFabric]], Awaitable[Any]],
    *,
    micro: int = 2,
    schedule: str = "1f1b",
    timeout: float = 20.0,
    tied: bool = False,
) -> Any:
    """One connected ``WireFabric`` per worker (global order) on an in-memory network, for ``body``; ``tied``:
    the model ties a weight of the first stage to one of the last (the fabrics open the ``tie`` streams)."""
    sizes = [1 if split is None else split.world_size for _, _, split in layout]
    identities = [[Identity.generate() for _ in range(n)] for n in sizes]
    stages = _plan([[i.peer_id for i in ids] for ids in identities], layout)
    network = MemoryNetwork()
    fabrics = [
        WireFabric(_config(stages, ident.peer_id, micro, schedule, timeout), tied=tied)
        for ids in identities
        for ident in ids
    ]
    flat = [ident for ids in identities for ident in ids]
    async with trio.open_nursery() as nursery:
        addresses: dict[str, str] = {}
        ready = trio.Event()
        done = trio.Event()

        async def serve(ident: Identity, fabric: WireFabric) -> None:
            async with network.open_transport(
                ident, "127.0.0.1", 0, unary_handler=_refuse, stream_handler=fabric.handle_stream
            ) as transport:
                addresses[ident.peer_id] = transport.address
                if len(addresses) == len(flat):
                    ready.set()
                await done.wait()

        for ident, fabric in zip(flat, fabrics, strict=True):
            nursery.start_soon(serve, ident, fabric)
        await ready.wait()
        async with trio.open_nursery() as connecting:
            for fabric in fabrics:
                connecting.start_soon(
                    fabric.connect, network.transports[addresses[fabric.config.peer_id]], addresses, nursery
                )
        try:
            return await body(fabrics)
        finally:
            for fabric in fabrics:
                await fabric.aclose()
            done.set()


@pytest.mark.parametrize("case_name", ["mlp-2", "gpt-2-tp"])
@pytest.mark.parametrize("schedule", list(ScheduleKind))
def test_async_wire_training_equals_plain_pytorch(case_name: str, schedule: ScheduleKind) -> None:
    case: Case = CASES[case_name]
    opt, clip = AdamWConfig(lr=3e-3, weight_decay=0.1), 0.5
    lr = LRSchedule(max_lr=opt.lr, min_lr=opt.lr / 10, warmup_steps=1, decay_steps=3)
    ref_losses, ref_norms, ref_params = reference_run(case, opt, lr, clip)
    batches = _batches(case.model, case.batch)
    last = len(case.layout) - 1

    async def body(fabrics: list[WireFabric]) -> list[list[StageEngine]]:
        engines: list[list[StageEngine]] = [[] for _ in case.layout]
        for fabric in fabrics:
            start, end, split = case.layout[fabric.stage]
            module = build_stage(
                case.model, 1234, StageSpec(start, end, split, fabric.rank), fabric.collective() if split else None
            )
            config = EngineConfig(
                stage=fabric.stage,
                num_stages=len(case.layout),
                num_micro_batches=case.micro_batches,
                schedule=schedule,
                optimizer=opt,
                lr_schedule=lr,
                max_grad_norm=clip,
            )
            engines[fabric.stage].append(StageEngine(module, fabric.links(), config))
        results: dict[int, list[StepResult]] = {}

        async def run(i: int, fabric: WireFabric, engine: StageEngine) -> None:
            out = []
            for step, (x, y) in enumerate(batches):
                fabric.step = step
                out.append(
                    await trio.to_thread.run_sync(
                        engine.run_step, x if fabric.stage == 0 else None, y if fabric.stage == last else None
                    )
                )
            results[i] = out

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i, fabric in enumerate(fabrics):
                    nursery.start_soon(run, i, fabric, engines[fabric.stage][fabric.rank])
        for out in results.values():  # every worker reports the same loss
            assert [r.loss for r in out] == [r.loss for r in results[0]]
        torch.testing.assert_close(
            torch.tensor([r.loss for r in results[0]]), torch.tensor(ref_losses), rtol=0, atol=1e-5
        )
        torch.testing.assert_close(
            torch.tensor([r.grad_norm for r in results[0]]), torch.tensor(ref_norms), rtol=1e-5, atol=1e-5
        )
        return engines

    engines = trio.run(partial(with_fabrics, case.layout, body, micro=case.micro_batches, schedule=schedule.value))
    params = gathered_params(case, engines)
    assert set(params) == set(ref_params)
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-5, msg=_prefixed(name))


def _prefixed(name: str) -> Callable[[str], str]:
    return lambda message: f"{name}: {message}"


def test_per_route_order_is_kept_over_the_wire() -> None:
    n = 40

    async def body(fabrics: list[WireFabric]) -> list[torch.Tensor]:
        sender, receiver = fabrics
        got: list[torch.Tensor] = []

        def send() -> None:  # back to back: the outbox holds several at once
            for i in range(n):
                sender.send_pipe("act", i, torch.full((64, 32), float(i)))
            sender.flush()

        def receive() -> None:
            for i in range(n):  # recv_pipe raises LinkError if micro-batch i is not the next frame
                got.append(receiver.recv_pipe("act", i))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, send)
                nursery.start_soon(trio.to_thread.run_sync, receive)
        return got

    got = trio.run(with_fabrics, [(0, 1, None), (1, 3, None)], body)
    assert len(got) == n
    for i, t in enumerate(got):
        assert torch.equal(t, torch.full((64, 32), float(i)))


def test_a_peer_closing_its_stream_mid_step_fails_the_step_naming_the_peer() -> None:
    """Stage 1 is a stand-in that reads one activation and hangs up: stage 0's step raises a LinkError
    about the failed send to it (not a receive timeout: the link timeout is far longer than the test)."""
    case: Case = CASES["mlp-2"]
    me, peer = Identity.generate(), Identity.generate()
    stages = _plan([[me.peer_id], [peer.peer_id]], case.layout)
    micro = 8
    fabric = WireFabric(_config(stages, me.peer_id, micro, "gpipe", timeout=60))
    network = MemoryNetwork()

    async def read_one_then_hang_up(stream: Stream) -> None:
        if stream.purpose.endswith(b"/act"):
            await stream.receive()

    async def main() -> str:
        async with (
            network.open_transport(
                me, "127.0.0.1", 0, unary_handler=_refuse, stream_handler=fabric.handle_stream
            ) as mine,
            network.open_transport(
                peer, "127.0.0.1", 0, unary_handler=_refuse, stream_handler=read_one_then_hang_up
            ) as theirs,
            trio.open_nursery() as nursery,
        ):
            await fabric.connect(mine, {peer.peer_id: theirs.address}, nursery)
            start, end, _ = case.layout[0]
            engine = StageEngine(
                build_stage(case.model, 1234, StageSpec(start, end)),
                fabric.links(),
                EngineConfig(stage=0, num_stages=2, num_micro_batches=micro, schedule=ScheduleKind.GPIPE),
            )
            x = torch.randn(micro * 4, case.model.layer_sizes[0])  # type: ignore[union-attr]
            try:
                with trio.fail_after(30):
                    await trio.to_thread.run_sync(engine.run_step, x, None)
            except LinkError as exc:
                return str(exc)
            finally:
                await fabric.aclose()
                nursery.cancel_scope.cancel()
            return "the step did not fail"

    message = trio.run(main)
    assert f"sending act to peer {peer.peer_id} failed" in message


def test_closing_the_fabric_releases_a_waiting_compute_thread() -> None:
    async def body(fabrics: list[WireFabric]) -> str:
        waiting = fabrics[1]
        outcome: list[str] = []

        def compute() -> None:
            try:
                waiting.recv_pipe("act", 0)
            except LinkError as exc:
                outcome.append(str(exc))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, compute)
                await trio.sleep(0.05)
                await waiting.aclose()
        return outcome[0]

    assert "closed" in trio.run(partial(with_fabrics, [(0, 1, None), (1, 3, None)], body, timeout=60.0))


def test_allreduce_scalars_sums_each_value_in_worker_order_on_every_worker() -> None:
    contributions = [[0.1, 1e16, -3.0], [0.2, 1.0, 4.5], [0.3, -1e16, 0.25]]

    async def body(fabrics: list[WireFabric]) -> list[list[float]]:
        results: dict[int, list[float]] = {}

        def work(i: int) -> None:
            results[i] = fabrics[i].links().allreduce_scalars(contributions[i])

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(len(fabrics)):
                    nursery.start_soon(trio.to_thread.run_sync, work, i)
        return [results[i] for i in range(len(fabrics))]

    results = trio.run(with_fabrics, [(0, 1, None), (1, 2, None), (2, 3, None)], body)
    want = [float(sum(c[k] for c in contributions)) for k in range(3)]  # the order matters for 1e16 + 1.0
    assert results == [want, want, want]
