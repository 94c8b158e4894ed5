"""A stop that reaches a member while its worker starts (the I/O side): the member's start path
(:meth:`arceusd.jobs.member.local_worker.LocalWorker.on_start`), the real driver carrying out the core's stop, and
the worker supervisor, over a fake spawn and a fake child process (the plan, the spec, the job, its core and the
driver are real). The core's side: ``test_member_start_stopped.py``.

At load 15 a false "leader dead" came while the member's worker was being spawned (the fork server took 12 s): the
driver detached the worker and stopped it, but there was no process yet to stop; the process came up, the start was
accepted and the leader's ``go`` acknowledged with no worker to take it, so the job never stepped.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from arceusd.jobs.core import Role, events
from arceusd.jobs.member import local_worker
from arceusd.jobs.member.joins_in_flight import JoinsInFlight
from arceusd.jobs.member.local_worker import LocalWorker, LocalWorkerPorts
from arceusd.jobs.plans.planning import encode_job_start, make_job_plan
from arceusd.jobs.procs import supervisor
from arceusd.jobs.procs.supervisor import WorkerFailed, WorkerProcess
from arceusd.jobs.record.job import Job
from arceusd.jobs.service.driver import ActionTable, Driver
from arceusd.jobs.spec.schema import load_spec, to_dict
from protocol.envelope import Header
from protocol.job_wire import JobGo, JobStart
from tests.unit.member_port_fakes import port_fakes
from tests.unit.test_forecast import offer
from tests.unit.test_jobspec import EXAMPLES

LEADER, ME = "a" * 32, "b" * 32
JOB_ID = "d" * 32
LIMIT_S = 20.0  # every wait here is on a condition; this only bounds a broken one


class FakeChild:
    """A worker process that says ``listening`` at once, exits on ``stop``, and is killed on ``kill``."""

    pid = 4242

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.exited = trio.Event()
        self.lines = [b'{"event": "listening", "port": 5555}\n']
        self.stdin, self.stdout = self, self
        self.killed = False

    async def send_all(self, data: bytes) -> None:
        if json.loads(data).get("cmd") == "stop":
            self._exit(0)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.lines:
            return self.lines.pop(0)
        await self.exited.wait()
        return b""

    def kill(self) -> None:
        self.killed = True
        self._exit(-9)

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.exited.set()

    async def wait(self) -> int:
        await self.exited.wait()
        assert self.returncode is not None
        return self.returncode


class GatedStarts:
    """The fork server's spawn (and preload), held at a gate until the test opens it."""

    def __init__(self, gate: str) -> None:
        self.gate = gate  # "spawn" or "preload": where the start waits
        self.reached, self.open = trio.Event(), trio.Event()
        self.children: list[FakeChild] = []

    async def _wait(self, where: str) -> None:
        if where == self.gate:
            self.reached.set()
            await self.open.wait()

    async def preload(self, modules: tuple[str, ...]) -> None:
        await self._wait("preload")

    async def spawn(self, module: str, argv: list[str], stderr: Path) -> FakeChild:
        await self._wait("spawn")
        self.children.append(FakeChild())
        return self.children[-1]


def member_job(tmp_path: Path, joined: bool = True) -> tuple[Job, JobStart]:
    """The MNIST example over the leader and this device, equally fast: the plan gives this device a stage
    (``joined``: this device has joined it)."""
    spec = load_spec(EXAMPLES / "mnist-mlp.toml")
    offers = [offer(LEADER, 1e9), replace(offer(ME, 1e9), address="127.0.0.1:9")]
    inputs, rp = make_job_plan(spec, offers, {}, None, leader=LEADER)
    assert ME in rp.peer_ids, rp.peer_ids
    spec_bytes = json.dumps(to_dict(spec), sort_keys=True).encode()
    job = Job.announced(JOB_ID, spec, spec_bytes, "h", LEADER, "", ME, tmp_path)
    if joined:
        job.core.handle(events.Joined(), 0.0)
        assert job.core.role == Role.MEMBER
    job.offers = {o.peer_id: o for o in offers}
    inputs_data, plan_data = encode_job_start(spec, inputs, rp)
    return job, JobStart(JOB_ID, 1, 2, spec_bytes, plan_data, inputs_data, members=(LEADER, ME))


def member_parts(
    job: Job, tmp_path: Path, spawn: Any, joins: JoinsInFlight | None = None
) -> tuple[LocalWorker, Driver]:
    fakes = port_fakes(job.offers[ME])

    async def commanded(_header: Header, _job_id: str) -> Job:
        return job

    async def request(*_args: Any, **_kw: Any) -> None:  # a report to the leader (a worker lost at the end)
        return None

    ports = SimpleNamespace(
        peers=SimpleNamespace(alive_peers=lambda: set()),
        persist=lambda _job: None,
        spawn=spawn,
        leads=lambda j: j.leader == ME,
        untrack=lambda _job: None,
    )
    driver = Driver(cast(Any, ports), ActionTable(), ME, tmp_path, cast(Any, None))
    worker_ports = LocalWorkerPorts(
        me=ME,
        jobs={JOB_ID: job},
        feed=driver.feed,
        leads=lambda j: j.leader == ME,
        spawn=spawn,
        offer=fakes.offer,
        check_leader=cast(Any, fakes.check_leader),
        commanded=commanded,
        drop_own_worker=fakes.drop_own_worker,
        track=lambda *_: None,
        fetch_resume=cast(Any, None),
        fetch_weights=cast(Any, None),
        peers=cast(Any, SimpleNamespace(request=request)),
        addresses={"peer": "127.0.0.1:9"},
        state_root=tmp_path,
        config=cast(Any, SimpleNamespace(listen_host="127.0.0.1", worker_threads=1, worker_cpus=())),
        take=cast(Any, None),
        on_step=lambda _job: None,
        joins=joins or JoinsInFlight(),
    )
    return LocalWorker(worker_ports), driver


@pytest.mark.parametrize("gate", ["spawn", "preload"])
def test_a_leader_declared_dead_while_the_worker_starts_leaves_no_worker_and_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gate: str
) -> None:
    """``spawn``: the stop comes while the worker's process is being spawned (the driver already detached it);
    ``preload``: before the start made its worker (the fork server's preload). Either way the start is refused,
    no worker process is left running, and the leader's ``go`` is refused."""
    starts = GatedStarts(gate)
    monkeypatch.setattr(supervisor, "warm_starts", lambda: starts)
    monkeypatch.setattr(local_worker, "warm_starts", lambda: starts)
    job, start = member_job(tmp_path)
    header = cast(Header, SimpleNamespace(sender=LEADER, term=1, epoch=2))
    answers: dict[str, Any] = {}

    async def main() -> None:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                worker, driver = member_parts(job, tmp_path, nursery.start_soon)

                async def start_it() -> None:
                    answers["start"] = await worker.on_start(header, start)

                nursery.start_soon(start_it)
                await starts.reached.wait()
                driver.feed(job, events.LeaderGone("dead"))  # membership's (false) "leader dead"
                starts.open.set()
            answers["go"] = await worker.on_go(header, JobGo(JOB_ID, 1, 2, ()))

    trio.run(main)
    reply = answers["start"]
    assert not reply.accepted and "stopped" in reply.reason, reply
    assert job.worker is None
    assert [c.returncode is not None for c in starts.children] == [True], "a worker outlived the stop"
    assert not answers["go"].ok and "holds no worker" in answers["go"].reason


def test_an_undisturbed_member_start_is_accepted_and_its_worker_takes_the_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = GatedStarts("none")
    monkeypatch.setattr(supervisor, "warm_starts", lambda: starts)
    monkeypatch.setattr(local_worker, "warm_starts", lambda: starts)
    job, start = member_job(tmp_path)
    header = cast(Header, SimpleNamespace(sender=LEADER, term=1, epoch=2))
    sent: list[bytes] = []

    async def main() -> None:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                worker, _ = member_parts(job, tmp_path, nursery.start_soon)
                reply = await worker.on_start(header, start)
                assert reply.accepted and reply.worker_address == "127.0.0.1:5555", reply
                (child,) = starts.children
                child.send_all = lambda data: _record(sent, data)  # type: ignore[method-assign]
                assert (await worker.on_go(header, JobGo(JOB_ID, 1, 2, ()))).ok
                assert job.worker is not None and cast(Any, job.worker.process) is child
                child.kill()  # the end of the test: its follower sees the worker gone

    trio.run(main)
    assert [json.loads(s)["cmd"] for s in sent] == ["start"]


def test_a_start_that_overtakes_the_answer_to_this_devices_join_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader accepted the join and started at once; the start is taken before the join task has fed the
    answer to the core: it waits for the join to settle and is accepted (it was refused, "this device has not
    joined the job", and the leader repartitioned). With no join in flight, a device that never joined is refused
    at once."""
    starts = GatedStarts("none")
    monkeypatch.setattr(supervisor, "warm_starts", lambda: starts)
    monkeypatch.setattr(local_worker, "warm_starts", lambda: starts)
    job, start = member_job(tmp_path, joined=False)
    header = cast(Header, SimpleNamespace(sender=LEADER, term=1, epoch=2))
    joins = JoinsInFlight()
    replies: list[Any] = []

    async def main() -> None:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                worker, driver = member_parts(job, tmp_path, nursery.start_soon, joins)
                refused = await worker.on_start(header, start)  # no join asked: refused at once
                assert not refused.accepted and "has not joined" in refused.reason, refused
                answered = trio.Event()

                async def join() -> None:  # the join task: asks, then (after the start arrived) feeds the answer
                    with joins.asking(JOB_ID):
                        await answered.wait()
                        driver.feed(job, events.Joined())

                async def take_start() -> None:
                    replies.append(await worker.on_start(header, start))

                nursery.start_soon(join)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(take_start)
                await trio.testing.wait_all_tasks_blocked()
                assert not replies, "the start was judged before the join settled"
                answered.set()
                while not replies:  # bounded by fail_after
                    await trio.sleep(0.01)
                for child in starts.children:
                    child.kill()

    trio.run(main)
    (reply,) = replies
    assert reply.accepted, reply
    assert job.core.role == Role.MEMBER


async def _record(sent: list[bytes], data: bytes) -> None:
    sent.append(data)


def test_a_stop_while_the_process_is_spawned_or_a_cancelled_start_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor alone: a stop with no process yet used to return at once, and the process spawned after it
    ran on; a start cancelled while it waited for ``listening`` (the leader's own, cut short) left its process."""
    starts = GatedStarts("spawn")
    monkeypatch.setattr(supervisor, "warm_starts", lambda: starts)
    failed: list[str] = []

    async def stopped_while_spawned() -> None:
        worker = WorkerProcess(tmp_path / "w.json", tmp_path / "w.log")
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:

                async def start_it() -> None:
                    try:
                        await worker.start()
                    except WorkerFailed as exc:
                        failed.append(str(exc))

                nursery.start_soon(start_it)
                await starts.reached.wait()
                assert await worker.stop(grace=0.5) is None  # nothing to stop yet
                starts.open.set()

    trio.run(stopped_while_spawned)
    assert failed == ["the worker was stopped while it started"]
    assert starts.children[0].killed

    silent = GatedStarts("none")
    monkeypatch.setattr(supervisor, "warm_starts", lambda: silent)

    async def cancelled() -> None:
        worker = WorkerProcess(tmp_path / "w.json", tmp_path / "w.log")
        with trio.move_on_after(0.2):  # (the child never says listening: this is the cancellation)
            await worker.start()
        assert worker.port is None

    original = FakeChild.__init__

    def quiet(self: FakeChild) -> None:
        original(self)
        self.lines = []

    monkeypatch.setattr(FakeChild, "__init__", quiet)
    trio.run(cancelled)
    assert silent.children[0].killed
