"""The daemon's bookkeeping of its fork server's exit reports (:class:`arceusd.jobs.procs.warm_starts.WarmStarts`):
a code reaches the program that holds its pid, never a later program the kernel gave the same pid."""

from __future__ import annotations

from typing import Any, cast

import trio

from arceusd.jobs.procs.warm_starts import WarmStarts


class Program:
    """Stands in for a ForkedProcess: what the bookkeeping calls on it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.codes: list[int] = []

    def reported(self, code: int) -> None:
        self.codes.append(code)

    async def watch(self) -> None:
        return None


def test_a_late_report_of_a_program_no_longer_held_is_dropped_not_kept_for_the_pids_next_program() -> None:
    """A program whose code came after NOTICE_S ends with LOST_EXIT_CODE and leaves _running; its code, arriving
    later, was kept under its pid for good (up to 4,096 of them), and the next program given that pid (pids wrap at
    32,768 on a default Linux: within one test suite here) took it as its own exit code at once."""
    starts = WarmStarts()
    starts._exit_reported(4242, 1)  # nobody holds 4242, and the server answered no order with it
    assert starts._unregistered == {}
    starts._unregistered[77] = None  # the server answered an order with 77; its exit report overtook the registration
    starts._exit_reported(77, 0)
    assert starts._unregistered == {77: 0}
    held = Program(5)
    starts._running[5] = cast(Any, held)
    starts._exit_reported(5, -9)
    assert held.codes == [-9] and 5 not in starts._unregistered


def test_a_program_that_ends_leaves_a_newer_program_with_its_pid_in_place() -> None:
    starts = WarmStarts()
    old, new = Program(9), Program(9)
    starts._running[9] = cast(Any, new)  # registered while the old one's watch was finishing
    trio.run(starts._watch, cast(Any, old))
    assert starts._running[9] is cast(Any, new)  # (it popped whatever held pid 9: the new one's report was lost)
    trio.run(starts._watch, cast(Any, new))
    assert 9 not in starts._running
