"""Warm interpreters (issue 33): the daemon's torch children start in a process that imported torch beforehand,
and behave exactly as a cold ``python -m`` start would (stdin, stdout, stderr and the exit code are the
program's); a dead warm interpreter falls back to a cold start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from arceusd.jobs.warm import parse_handover
from arceusd.jobs.warm_pool import WarmPool

pytestmark = pytest.mark.slow


def test_a_program_in_a_warm_interpreter_gets_its_stdin_stdout_and_exit_code() -> None:
    async def main() -> None:
        pool = WarmPool(size=1, refill_delay=0.0)
        await pool.fill()
        await trio.sleep(0.5)
        # filework reads its request from stdin: invalid JSON must reach it and be answered on stdout.
        code, out, err = await pool.run("arceusd.jobs.filework", ["shapes"], b"not json")
        assert pool.handed == 1 and pool.cold == 0
        assert code == 1
        answer = json.loads(out.decode().strip().splitlines()[-1])
        assert "JSONDecodeError" in answer["error"]
        assert b"Traceback" in err  # its stderr went to the file it was given
        # the pool refilled itself: the next program is warm too, and its usage error is its own
        await trio.sleep(0.5)
        code, out, err = await pool.run("arceusd.jobs.filework", ["nope"], b"")
        assert pool.handed == 2 and code == 1 and b"usage" in err
        await pool.close()

    trio.run(main)


def test_a_dead_warm_interpreter_falls_back_to_a_cold_start(tmp_path: Path) -> None:
    async def main() -> None:
        pool = WarmPool(size=1)
        await pool.fill()
        for proc in list(pool._idle):
            proc.kill()
            await proc.wait()
        code, out, _ = await pool.run("arceusd.jobs.filework", ["shapes"], b"[]")
        assert pool.cold == 1 and pool.handed == 0 and code == 1 and b"error" in out
        await pool.close()

    trio.run(main)


@pytest.mark.parametrize(
    "line",
    [b"[]", b'{"module": "os", "argv": [], "stderr": null}', b'{"module": "arceusd.worker", "argv": [1]}'],
)
def test_a_hand_over_names_only_the_daemons_own_programs(line: bytes) -> None:
    with pytest.raises(ValueError):
        parse_handover(line)
