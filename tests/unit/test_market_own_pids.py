"""The market's probe thread lists the daemon's own processes (their CPU use is not the owner's): reading a
worker that has exited must not ask trio anything from that thread (it raised "must be called from async
context" in the daemon's log, and the probe's reading was lost)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import trio

from arceusd.jobs.procs.supervisor import WorkerProcess
from arceusd.market.service import own_pids


def test_own_pids_reads_an_exited_worker_from_the_probe_thread(tmp_path: Path) -> None:
    async def main() -> list[int]:
        worker = WorkerProcess(tmp_path / "config.json", tmp_path / "worker.log")
        worker.process = await trio.lowlevel.open_process(["true"], stdout=subprocess.DEVNULL)
        await trio.sleep(0.2)  # exited, not yet reaped by anyone
        node = SimpleNamespace(jobs=SimpleNamespace(jobs={"j": SimpleNamespace(worker=worker)}))
        pids = await trio.to_thread.run_sync(own_pids, cast(Any, node))
        await worker.process.wait()
        return pids

    pids = trio.run(main)
    assert pids[0] == os.getpid() and len(pids) == 2
