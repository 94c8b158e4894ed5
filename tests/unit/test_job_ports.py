"""Issue 32, ports not back-pointers: every part of the job I/O layer that the composition root
(:class:`arceusd.jobs.service.manager.JobManager`) builds is handed a port, a frozen dataclass of what it calls,
and none holds the manager itself (a bound method of it, one verb, is what a port may hold)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest

from tests.unit.test_job_lifecycle import FakePeers, manager

PARTS = (
    *("control", "speed", "intake", "commits", "standbys", "drops", "joining", "starting", "regrow"),  # the leader's
    *("local", "answers", "copies", "replicas", "joiner"),  # the member's
)


def test_every_part_gets_a_frozen_port_and_none_holds_the_manager(tmp_path: Path) -> None:
    mgr, _ = manager(tmp_path, FakePeers())
    for name in PARTS:
        part = getattr(mgr, name)
        ports = part.ports
        assert dataclasses.is_dataclass(ports) and not isinstance(ports, type), f"{name}: its port is a dataclass"
        with pytest.raises(dataclasses.FrozenInstanceError):
            cast(Any, ports).me = "someone else"  # frozen: a part cannot rewire what it was handed
        held = {"part": vars(part), "port": {f.name: getattr(ports, f.name) for f in dataclasses.fields(ports)}}
        for where, values in held.items():
            for field, value in values.items():
                assert value is not mgr, f"{name}: its {where}'s {field} is the whole manager"
    driver_ports = mgr.driver.ports
    assert dataclasses.is_dataclass(driver_ports) and all(
        getattr(driver_ports, f.name) is not mgr for f in dataclasses.fields(driver_ports)
    ), "the driver's port holds what it uses, not the manager"
    assert mgr.lending.node is mgr.node and mgr.lending.offer == mgr.offer, "lending's port: the node, peers, offer"


def test_a_ports_callables_reach_the_manager_they_were_built_from(tmp_path: Path) -> None:
    """The ports hold the manager's own methods (bound), not copies: what a part calls is what the manager does."""
    mgr, _ = manager(tmp_path, FakePeers())
    assert mgr.intake.ports.feed == mgr.feed and mgr.intake.ports.jobs is mgr.jobs
    assert mgr.local.ports.take == mgr.intake.take and mgr.local.ports.on_step == mgr.speed.on_step
    assert mgr.starting.ports.start_own_worker == mgr.local.start_worker
    assert mgr.regrow.ports.send_go == mgr.starting.send_go
    assert mgr.joining.ports.request_join == mgr.joiner.request_join, "the owner's hand-over joins as a member does"
