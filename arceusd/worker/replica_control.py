"""What the daemon says about a stage worker's replicas while it trains: drops, holds, rebuilds, retirement.

Owns the worker's side of issue 22's recovery, on the event loop (the compute thread is between two steps, or
blocked in a sync that waits for the smaller ring, ``replicas.py``):

- ``drop_replica``: the ring goes on without a replica (``ring_links.WireRing.drop``); ``hold_at`` asks to hold
  after that checkpoint for the replica's rebuild;
- ``grow_replica`` / ``go_on``: the held worker grows the ring back with the rebuilt replica's worker (and, on the
  data owner, serves that replica's share: ``datafeed.DataServer.admit``), or goes on without it; a hold lasts
  at most ``link_timeout_s``;
- ``retire``: the data owner's own replica was dropped: it stops training and serves the other replicas; a data
  owner whose replica's links broke waits that long to be retired before it fails.

A command that does not fit what the worker is doing is a ``WorkerProtocolError`` (the worker fails and the job
replans): the daemon checked it against its own plan before sending it.
"""

from __future__ import annotations

import sys
from typing import Protocol

import trio

from arceusd.worker.datafeed import DataServer
from arceusd.worker.engine import StageEngine
from arceusd.worker.protocol import (
    DropReplicaCommand,
    GoOnCommand,
    GrowReplicaCommand,
    RetireCommand,
    WorkerConfig,
    WorkerProtocolError,
)
from arceusd.worker.wire_links import WireFabric


class WorkerParts(Protocol):
    """What replica commands use of the stage worker (``arceusd.worker.process.Worker`` has them): its config and
    place, its links, its data server (the data owner's) and its engine."""

    config: WorkerConfig
    stage: int
    rank: int
    num_stages: int
    server: DataServer | None
    fabric: WireFabric
    engine: StageEngine


ReplicaCommand = DropReplicaCommand | GrowReplicaCommand | GoOnCommand | RetireCommand


class ReplicaControl:
    """One worker's replica commands (see the module docstring); composed into :class:`Worker`."""

    def __init__(self, worker: WorkerParts) -> None:
        self.worker = worker
        self.hold_at = 0
        """The checkpoint step after which to hold for a dropped replica's rebuild (0: none)."""
        self.retired = trio.Event()
        """The leader dropped this (the data owner's) replica: it serves the data only."""
        self.training = trio.CancelScope()
        """The training loop's scope: retirement cancels it."""
        self._release: GrowReplicaCommand | GoOnCommand | None = None
        self._released = trio.Event()

    async def command(self, command: ReplicaCommand) -> None:
        """Take one command from the daemon (``hold`` acts on a rebuild between two steps)."""
        w = self.worker
        if isinstance(command, RetireCommand):
            if w.server is None or w.config.replica_count() < 2:
                raise WorkerProtocolError("retire: only the data owner's worker in a plan of replicas retires")
            self.retired.set()
            self.training.cancel()
            return
        if isinstance(command, DropReplicaCommand):
            try:
                await w.fabric.ring.drop(command.replicas, command.index)
            except ValueError as exc:
                raise WorkerProtocolError(f"drop_replica command: {exc}") from exc
            self.hold_at = command.hold_at or self.hold_at
            print(
                f"stage worker: replica {command.index} of {command.replicas} dropped; the ring goes on with "
                f"replicas {list(w.fabric.ring.replicas)} of the plan",
                file=sys.stderr,
            )
            return
        if isinstance(command, GoOnCommand) and (not self.hold_at or self._released.is_set()):
            return  # it went on already (its hold timed out): nothing to release
        if not self.hold_at or self._released.is_set():
            raise WorkerProtocolError(f"a {type(command).__name__} for a worker that does not hold for a rebuild")
        self._release = command
        self._released.set()

    async def hold(self, step: int) -> None:
        """After checkpoint ``step``: wait for the dropped replica's rebuild (or the word to go on alone), at most
        ``link_timeout_s``; with a rebuild, the ring grows back before the next step."""
        w = self.worker
        with trio.move_on_after(w.config.link_timeout_s):
            await self._released.wait()
        command, self._release, self.hold_at = self._release, None, 0
        self._released = trio.Event()
        if not isinstance(command, GrowReplicaCommand):
            print(f"stage worker: going on without the dropped replica after step {step}", file=sys.stderr)
            return
        stages = command.stages
        if (
            command.step != step
            or len(stages) != w.num_stages
            or len(stages[w.stage]) != len(w.config.stages[w.stage].members)
        ):
            raise WorkerProtocolError(
                f"grow_replica command: a replica rebuilt at step {command.step} with "
                f"{len(stages)} stage(s) for a worker holding at step {step}"
            )
        peer = stages[w.stage][w.rank]
        if peer not in command.addresses:
            raise WorkerProtocolError(f"grow_replica command: no address for peer {peer}")
        try:
            link = await w.fabric.ring.grow(command.slot, peer, command.addresses[peer], command.generation)
            if w.server is not None:
                w.server.admit(command.slot, list(stages[0]), list(stages[-1]))
        except ValueError as exc:
            raise WorkerProtocolError(f"grow_replica command: {exc}") from exc
        if w.engine.replicas is not None:
            w.engine.replicas.grown(link)  # between two steps: nothing is in flight on the ring
        print(
            f"stage worker: the replica of slot {command.slot} was rebuilt at step {step}; the ring goes on "
            f"with replicas {list(w.fabric.ring.replicas)}",
            file=sys.stderr,
        )

    async def retire_after(self, broke: BaseException) -> bool:
        """The data owner's worker, whose replica broke: whether the leader retires it (drops its replica and lets
        it serve the others) within ``link_timeout_s``; any other worker fails at once."""
        w = self.worker
        if w.server is None or w.config.replica_count() < 2:
            return False
        print(f"stage worker: its replica broke ({broke}); waiting to be retired", file=sys.stderr)
        with trio.move_on_after(w.config.link_timeout_s):
            await self.retired.wait()
        return self.retired.is_set()


__all__ = ["ReplicaCommand", "ReplicaControl"]
