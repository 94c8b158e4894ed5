"""Pinning stage workers to cores: the CPU-list syntax, the checks on the daemon's and the worker's configs, and
the pinning itself (in a child process, so the test runner keeps its cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from arceusd.cli.swarm import worker_cpu_args
from arceusd.device.config import ConfigError, load_config
from arceusd.worker.affinity import AffinityError, check_cpus, parse_cpu_list, pin_cpus
from arceusd.worker.protocol import MemberConfig, StageConfig, WorkerConfig, WorkerProtocolError

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this OS cannot pin processes")


@pytest.mark.parametrize(
    ("text", "cpus"), [("", ()), ("3", (3,)), ("0,2-3", (0, 2, 3)), (" 5 , 1-2,1 ", (1, 2, 5)), ("7-7", (7,))]
)
def test_cpu_lists_parse_like_taskset(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize(
    ("text", "needle"),
    [("a", "not a core number"), ("3-1", "low to high"), ("-2", "not a core number"), ("0-99999", "0..4095")],
)
def test_a_bad_cpu_list_says_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(AffinityError, match=needle):
        parse_cpu_list(text)


def test_fewer_cores_than_threads_or_a_core_twice_is_refused() -> None:
    assert check_cpus([3, 1], 2) == (1, 3)
    assert check_cpus([], 4) == ()  # not pinned: any thread count
    with pytest.raises(AffinityError, match="would share cores"):
        check_cpus([0], 2)
    with pytest.raises(AffinityError, match="twice"):
        check_cpus([1, 1], 1)


def test_the_daemon_reads_worker_cpus_from_its_file_and_flags(tmp_path: Path) -> None:
    assert load_config(tmp_path).worker_cpus == ()
    (tmp_path / "config.toml").write_text("worker_threads = 2\nworker_cpus = [2, 3]\n")
    assert load_config(tmp_path).worker_cpus == (2, 3)
    assert load_config(tmp_path, {"worker_cpus": "4-5"}).worker_cpus == (4, 5)
    assert load_config(tmp_path, {"worker_cpus": ""}).worker_cpus == ()  # a flag that unpins
    for bad, needle in (("0", "would share cores"), ("x", "not a core number"), ([1, True], "core numbers")):
        with pytest.raises(ConfigError, match=needle):
            load_config(tmp_path, {"worker_cpus": bad})


def _worker_config(cpus: tuple[int, ...], threads: int = 1) -> WorkerConfig:
    stage = StageConfig(0, 2, (MemberConfig("a" * 32),))
    return WorkerConfig(
        job_id="job",
        term=1,
        epoch=1,
        spec={},
        stages=(stage,),
        micro_batches=1,
        schedule="gpipe",
        peer_id="a" * 32,
        state_dir="/nonexistent",
        listen_host="127.0.0.1",
        owner="a" * 32,
        checkpoint_dir="/nonexistent",
        checkpoint_interval=0,
        total_steps=1,
        threads=threads,
        cpus=cpus,
    )


def test_the_worker_config_carries_its_cores_and_refuses_bad_ones() -> None:
    config = _worker_config((0, 1), threads=2)
    assert WorkerConfig.from_json(config.to_json()).cpus == (0, 1)
    raw = json.loads(config.to_json())
    del raw["cpus"]  # a config from a daemon before this field: not pinned
    assert WorkerConfig.from_dict(raw).cpus == ()
    for bad in ([0, "1"], "0-1", [True, 1]):
        raw["cpus"] = bad
        with pytest.raises(WorkerProtocolError, match="cpus"):
            WorkerConfig.from_dict(raw)
    with pytest.raises(WorkerProtocolError, match="would share cores"):
        replace(config, cpus=(0,))


def test_not_pinning_is_a_no_op() -> None:
    assert pin_cpus(()) is None


@linux_only
def test_pinning_covers_the_threads_started_afterwards() -> None:
    """A child process pins itself to one of its cores, then starts a thread: the thread reports that core
    alone (the worker pins before grpc, trio and torch start theirs)."""
    core = max(os.sched_getaffinity(0))
    code = (
        "import os, threading, sys\n"
        "from arceusd.worker.affinity import pin_cpus\n"
        f"assert pin_cpus(({core},)) is None\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0)))); t.start(); t.join()\n"
        "print(seen[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[{core}]"


@linux_only
def test_a_core_this_process_may_not_use_is_refused_by_name() -> None:
    unavailable = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(AffinityError, match=rf"\[{unavailable}\] are not available"):
        pin_cpus((unavailable,))


def test_a_local_swarm_pins_its_workers_only_when_each_gets_a_core() -> None:
    assert worker_cpu_args(1, 3, [4, 2, 6]) == ["--worker-cpus", "4"]
    assert worker_cpu_args(0, 3, [0, 1]) == []  # 3 workers on 2 cores: let the OS spread them
    assert parse_cpu_list(worker_cpu_args(2, 3, [0, 1, 2, 3])[1]) == (2,)
