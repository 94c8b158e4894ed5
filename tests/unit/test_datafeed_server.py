"""The owner's batch service (``arceusd.worker.datafeed.DataServer``) when replicas come and go (issue 22): a
client gone mid-answer does not take the service down, and a rebuilt replica's devices get its slot's share."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import trio

from arceusd.worker.datafeed import DataServer, Request


class Source:
    def batch(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(8.0).reshape(4, 2) + k, torch.arange(4)

    def eval_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return []


def _server() -> DataServer:
    slots = {"a": 0, "b": 1}
    config = SimpleNamespace(
        stage_members=lambda stage: ["a", "b"],
        stages=[None],
        owner="a",
        share_count=lambda: 2,
        slot_of=lambda peer=None: slots[peer or "a"],
    )
    return DataServer(cast(Any, Source()), cast(Any, config), 10)


class GoneClient:
    """Asks for one batch, then is gone before the answer leaves."""

    peer_id = "b"

    def __init__(self) -> None:
        self.asked = False

    async def receive(self) -> tuple[bytes, memoryview]:
        if self.asked:
            raise trio.EndOfChannel
        self.asked = True
        return Request("train", 0, "inputs").encode(), memoryview(b"")

    async def send(self, header: bytes, payload: bytes | memoryview = b"") -> None:
        raise trio.ClosedResourceError("the stream is closed for sending")


def test_a_client_gone_mid_answer_is_counted_and_the_service_goes_on() -> None:
    server = _server()
    trio.run(server.serve, cast(Any, GoneClient()))
    assert server.refused["ClosedResourceError"] == 1 and server.finished == {"b"}
    assert torch.equal(server.get(Request("train", 1, "inputs"), "a"), Source().batch(1)[0].chunk(2)[0])


def test_a_rebuilt_replicas_devices_get_its_slots_share() -> None:
    server = _server()
    with pytest.raises(ValueError, match="no slot 2"):
        server.admit(2, ["c"], ["d"])
    server.admit(1, ["c"], ["d"])
    assert {"c", "d"} <= server.remote_clients()
    x, y = Source().batch(3)
    assert torch.equal(server.get(Request("train", 3, "inputs"), "c"), x.chunk(2)[1])
    assert torch.equal(server.get(Request("train", 3, "targets"), "d"), y.chunk(2)[1])


class CountingSource(Source):
    """Counts the batches it computes."""

    def __init__(self) -> None:
        self.computed: list[int] = []

    def batch(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.computed.append(k)
        return super().batch(k)


def test_a_steps_batch_is_computed_once_for_its_inputs_targets_and_shares() -> None:
    server = _server()
    source = CountingSource()
    server.source = cast(Any, source)
    for step in range(6):  # each step: both parts for both replicas, the next step's inputs prefetched between
        for peer in ("a", "b"):
            server.get(Request("train", step, "inputs"), peer)
        server.get(Request("train", step + 1, "inputs"), "a")
        for peer in ("a", "b"):
            assert torch.equal(
                server.get(Request("train", step, "targets"), peer), torch.arange(4).chunk(2)[0 if peer == "a" else 1]
            )
    assert source.computed == list(range(7))
    assert len(server._recent) <= 4  # bounded
    server.get(Request("train", 0, "inputs"), "a")  # an old step again (a resumed replica): computed anew, alike
    assert source.computed[-1] == 0
