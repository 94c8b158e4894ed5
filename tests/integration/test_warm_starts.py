"""Warm starts (issue 33): the daemon's torch programs are forked from its fork server, and behave exactly as a
cold ``python -m`` start would (stdin, stdout, stderr and the exit code are the program's, a kill is a kill);
the server imports once however many programs it forks; a dead server falls back to cold starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from arceusd.jobs.procs.fork_server import parse_order, parse_preload
from arceusd.jobs.procs.warm_starts import SUPPORTED, ForkedProcess, WarmStarts, preloads_for
from tests.procfs import children_of, name_of, parent_of

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SUPPORTED, reason="fork server needs Linux pidfds")]


async def started(starts: WarmStarts) -> None:
    """Start the server and wait (bounded) until it has imported: its first fork answers."""
    assert await starts.start()


def test_programs_forked_from_the_server_get_their_stdin_stdout_stderr_and_exit_code(tmp_path: Path) -> None:
    async def main() -> None:
        starts = WarmStarts()
        await started(starts)
        # filework reads its request from stdin: invalid JSON must reach it and be answered on stdout.
        code, out, err = await starts.run("arceusd.jobs.procs.filework", ["shapes"], b"not json")
        assert starts.warm == 1 and starts.cold == 0
        assert code == 1
        answer = json.loads(out.decode().strip().splitlines()[-1])
        assert "JSONDecodeError" in answer["error"]
        assert b"Traceback" in err  # its stderr went to the file it was given
        assert err.startswith(b"Traceback") and b"found in sys.modules" not in err  # (no runpy warning first)
        # the next program is forked at once (no refill), and its usage error is its own
        began = time.monotonic()
        code, out, err = await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")
        assert starts.warm == 2 and code == 1 and b"usage" in err
        assert time.monotonic() - began < 10.0  # a fork, not a torch import (wide margin for a busy machine)
        # a program that waits on its stdin: it is the server's child, and a kill ends it with -SIGKILL
        proc = await starts.spawn("arceusd.jobs.procs.filework", ["shapes"], tmp_path / "err")
        assert starts.server_pid is not None and parent_of(proc.pid) == starts.server_pid
        assert proc.returncode is None
        proc.kill()
        with trio.fail_after(10):
            assert await proc.wait() == -signal.SIGKILL
        await starts.close()

    trio.run(main)


def test_a_dead_server_falls_back_to_a_cold_start() -> None:
    async def main() -> None:
        starts = WarmStarts()
        await started(starts)
        server = starts.server_pid
        assert server is not None
        os.kill(server, signal.SIGKILL)
        with trio.fail_after(10):
            while starts.server_pid is not None:  # the daemon notices the end of the server's socket
                await trio.sleep(0.05)
        code, out, _ = await starts.run("arceusd.jobs.procs.filework", ["shapes"], b"[]")
        assert starts.cold == 1 and starts.warm == 0 and code == 1 and b"error" in out
        assert not await starts.start(), "a failed server is not restarted at once"
        await starts.close()

    trio.run(main)


def test_a_program_whose_server_died_ends_without_waiting_for_its_exit_code(tmp_path: Path) -> None:
    """A forked program outlives a killed server; once it exits, its wait ends at once with the lost code
    (no report can come), not after the time a loaded server gets to report one."""
    from arceusd.jobs.procs.warm_starts import LOST_EXIT_CODE, NOTICE_S

    async def main() -> None:
        starts = WarmStarts()
        await started(starts)
        proc = await starts.spawn("arceusd.jobs.procs.filework", ["shapes"], tmp_path / "err")  # reads its stdin first
        server = starts.server_pid
        assert server is not None and starts.warm == 1
        os.kill(server, signal.SIGKILL)
        with trio.fail_after(10):
            while starts.server_pid is not None:
                await trio.sleep(0.05)
        assert proc.stdin is not None
        await proc.stdin.aclose()  # the program reads an empty request, fails and exits
        with trio.fail_after(NOTICE_S / 3):
            assert await proc.wait() == LOST_EXIT_CODE
        await starts.close()

    trio.run(main)


def test_the_first_program_starts_the_server_and_is_forked_once_it_imported() -> None:
    """No import paid twice: the first program waits for the server's import (at the daemon's priority) instead
    of importing torch itself beside it. How long it waited is measured (a daemon's first job pays it to start:
    the quote's start, ``arceusd.market.timings``); a later program does not wait and does not change it."""

    async def main() -> None:
        starts = WarmStarts()
        assert starts.server_pid is None and starts.import_wait_s == 0.0
        began = trio.current_time()
        code, _, _ = await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")
        assert code == 1 and starts.cold == 0 and starts.warm == 1 and starts.server_pid is not None
        waited = starts.import_wait_s
        assert 0.2 < waited <= trio.current_time() - began, waited  # torch's import: seconds, not a fork's ms
        await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")
        assert starts.import_wait_s == waited and starts.warm == 2
        await starts.close()

    trio.run(main)


def test_warming_up_for_a_job_starts_the_server_before_any_program() -> None:
    """A daemon that submits or joins a job starts its server then (its import is done before the first start
    or a recovery needs it); the next program is forked."""
    from arceusd.models.config import MLPConfig

    async def main() -> None:
        starts = WarmStarts()
        await starts.warm_up(MLPConfig((4, 2)))
        assert starts.server_pid is not None and starts.warm == starts.cold == 0
        code, _, _ = await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")
        assert code == 1 and starts.warm == 1 and starts.cold == 0
        await starts.close()

    trio.run(main)


def rss_mib(pid: int) -> float:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_a_preload_imports_transformers_once_in_the_server_for_every_later_program() -> None:
    """A stock transformers model's job asks the server to import transformers: it does so before it forks the
    next program (orders are taken in turn), so that program and all later ones start with it."""
    from arceusd.models.hf.config import hf_config_from_dict

    llama = hf_config_from_dict(
        {
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 16,
        },
        8,
    )
    assert preloads_for(llama) == ("arceusd.models.hf.blocks",) and preloads_for(object()) == ()

    async def main() -> None:
        starts = WarmStarts()
        await started(starts)
        await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")  # forked: the server has imported torch
        server = starts.server_pid
        assert server is not None
        before = rss_mib(server)
        await starts.preload(preloads_for(llama))
        await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")  # forked after the preload's import
        grown = rss_mib(server) - before
        assert grown > 20, f"the server grew {grown:.0f} MiB: transformers was not imported"
        await starts.close()

    trio.run(main)


def test_a_preload_names_only_the_modules_it_may() -> None:
    assert parse_preload(b'{"preload": ["arceusd.models.hf.blocks"]}') == ["arceusd.models.hf.blocks"]
    assert parse_preload(b'{"module": "arceusd.worker", "argv": []}') is None
    for bad in (b'{"preload": ["os"]}', b'{"preload": "arceusd.models.hf.blocks"}'):
        with pytest.raises(ValueError):
            parse_preload(bad)


@pytest.mark.parametrize(
    "order",
    [
        b"[]",
        b'{"module": "os", "argv": []}',
        b'{"module": "arceusd.worker", "argv": [1]}',
        b'{"module": "arceusd.worker", "argv": ' + json.dumps(["a"] * 65).encode() + b"}",
        b"x" * 70000,
    ],
)
def test_an_order_names_only_the_daemons_own_programs(order: bytes) -> None:
    with pytest.raises(ValueError):
        parse_order(order)


def test_a_speed_challenge_is_forked_ready_in_well_under_a_cold_start_and_solves_and_checks_alike() -> None:
    """A speed challenge's child is the fork server's (torch imported already): it says "ready" in far less than
    the cold start of the same program takes beside it (a cold one's import, over the leader's 30 s ready wait
    on a loaded machine, judged an honest member a refuser), its process is named for ``ps``, it answers as the
    cold program does, and the leader's check of opened blocks runs warm too and finds them exact."""
    from arceusd.jobs.judging import challenges
    from arceusd.jobs.procs import challenge_child
    from arceusd.jobs.procs.challenge_child import ChallengeChild, check_blocks_in_child
    from arceusd.jobs.procs.fork_server import PROGRAMS
    from arceusd.jobs.procs.warm_starts import ForkedProcess, warm_starts

    size, rounds = 256, 2

    async def main() -> None:
        starts = warm_starts()
        assert await starts.start()
        await starts.run("arceusd.jobs.procs.filework", ["nope"], b"")  # the server's import is done
        began = trio.current_time()
        cold = await trio.lowlevel.open_process(
            [sys.executable, "-m", challenge_child.MODULE, "solve", str(size), str(rounds), "1", "cpu"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        cold_child = ChallengeChild(cold)
        await cold_child.expect("ready", 120)
        cold_s = trio.current_time() - began
        warm_before = starts.warm
        began = trio.current_time()
        child = await ChallengeChild.start(size, rounds, 1, "cpu")
        warm_s = trio.current_time() - began
        try:
            assert starts.warm == warm_before + 1 and isinstance(child.process, ForkedProcess)
            assert (
                name_of(child.process.pid) == PROGRAMS[challenge_child.MODULE]
                and parent_of(child.process.pid) == starts.server_pid
            )
            assert warm_s < cold_s / 3, (warm_s, cold_s)
            seed = challenges.new_seed()
            roots = []
            for each in (child, cold_child):
                await each.say({"seed": seed})
                roots.append((await each.expect("root", 120))["root"])
            assert roots[0] == roots[1]  # the same bits from a fork as from a cold start
            opened = list(challenges.blocks_to_open(size, rounds, count=4))
            await child.say({"open": opened})
            blocks = (await child.expect("blocks", 60))["blocks"]
            request = {"size": size, "rounds": rounds, "seed": seed, "open": opened, "blocks": blocks}
            warm_checks = starts.warm
            code, out, _ = await check_blocks_in_child(json.dumps(request).encode() + b"\n")
            assert code == 0 and json.loads(out)["error"] < 1e-5 and starts.warm == warm_checks + 1
            assert await child.process.wait() == 0
        finally:
            await child.close()
            await cold_child.close()
            await starts.close()

    trio.run(main)


def test_an_order_cancelled_while_it_waits_for_its_fork_leaves_the_next_program_its_own_pid() -> None:
    """A start cancelled between sending its order and the server's answer (the server still importing: seconds)
    must not leave that answer for the next order: the next program would be given the cancelled one's pid (its
    exit code, its kill going to another process). Each program's pid is the process holding its pipes."""

    async def main() -> None:
        starts = WarmStarts()
        with trio.move_on_after(0.05) as scope:  # the server imports for seconds: the order waits, cancelled
            await starts.spawn("arceusd.worker.speed_challenge", ["solve", "256", "1", "1", "cpu"], Path(os.devnull))
        assert scope.cancelled_caught
        proc = await starts.spawn("arceusd.worker.speed_challenge", ["solve", "256", "1", "1", "cpu"], Path(os.devnull))
        try:
            assert isinstance(proc, ForkedProcess)
            assert parent_of(proc.pid) == starts.server_pid
            assert isinstance(proc.stdout, trio.lowlevel.FdStream)
            ours = os.readlink(f"/proc/self/fd/{proc.stdout.fileno()}")  # the pipe this program writes to
            for _ in range(100):  # (just forked, it may not have taken its pipes yet)
                if os.readlink(f"/proc/{proc.pid}/fd/1") == ours:
                    break
                await trio.sleep(0.1)
            assert os.readlink(f"/proc/{proc.pid}/fd/1") == ours, "the program's pid is another process's"
            # and the cancelled start's program is not left running (killed once its answer came)
            for _ in range(100):
                if children_of(starts.server_pid) == [proc.pid]:
                    break
                await trio.sleep(0.1)
            assert children_of(starts.server_pid) == [proc.pid]
        finally:
            proc.kill()
            await proc.wait()
            await starts.close()

    trio.run(main)
