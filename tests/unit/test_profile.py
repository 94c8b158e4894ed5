"""Device and link measurement: meminfo parsing, CPU benchmark, calibration, cache, link timing on a fake
echo."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from arceusd.device.link_probe import measure_link
from arceusd.device.profile import (
    CACHE_VERSION,
    REFERENCE_MODEL,
    Calibration,
    DeviceMeasurement,
    best_measurement,
    calibration_from_timings,
    chain_blocks,
    cpu_free_memory,
    load_or_measure,
    measure_calibration,
    measure_device,
    parse_meminfo_available,
    to_device_profile,
)
from arceusd.models.config import GPTConfig, MLPConfig
from arceusd.models.costs import block_costs

MEMINFO = "MemTotal:       16315584 kB\nMemFree:          512000 kB\nMemAvailable:    8000000 kB\n"


def test_parse_meminfo_available() -> None:
    assert parse_meminfo_available(MEMINFO) == 8000000 * 1024
    assert parse_meminfo_available("MemTotal: 1 kB\n") is None


def test_cpu_free_memory_falls_back_when_meminfo_is_missing(tmp_path: Path) -> None:
    assert cpu_free_memory(str(tmp_path / "nope")) > 0
    (tmp_path / "meminfo").write_text(MEMINFO)
    assert cpu_free_memory(str(tmp_path / "meminfo")) == 8000000 * 1024


def test_cpu_benchmark_reports_plausible_figures() -> None:
    m = measure_device("cpu", size=64, repeats=2)
    assert m.kind == "cpu" and m.threads >= 1 and m.memory_bytes > 0
    assert 1e6 < m.flops_per_s < 1e15
    p = to_device_profile(m, "peer-a", memory_fraction=0.5)
    assert p.peer_id == "peer-a" and p.kind == "cpu" and p.memory_bytes == int(m.memory_bytes * 0.5)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="not available"):
        measure_device("tpu")


def _fake(flops: float, at: float) -> DeviceMeasurement:
    return DeviceMeasurement("cpu", flops, 1 << 30, 2, "cpu", at)


def test_cache_is_reused_until_it_is_too_old(tmp_path: Path) -> None:
    calls: list[int] = []

    def measure() -> tuple[DeviceMeasurement, ...]:
        calls.append(1)
        return (_fake(1e9 * len(calls), 100.0),)

    first = load_or_measure(tmp_path, max_age_s=60, now=100.0, measure=measure)
    again = load_or_measure(tmp_path, max_age_s=60, now=150.0, measure=measure)
    assert again == first and len(calls) == 1
    stale = load_or_measure(tmp_path, max_age_s=60, now=200.0, measure=measure)
    assert len(calls) == 2 and stale[0].flops_per_s == 2e9
    (tmp_path / "device_profile.json").write_text("{not json")
    load_or_measure(tmp_path, max_age_s=60, now=201.0, measure=measure)
    assert len(calls) == 3


def test_a_cache_taken_at_another_thread_count_is_measured_again(tmp_path: Path) -> None:
    calls: list[int] = []

    def measure_at(threads: int) -> Callable[[], tuple[DeviceMeasurement, ...]]:
        def measure() -> tuple[DeviceMeasurement, ...]:
            calls.append(threads)
            return (DeviceMeasurement("cpu", 1e9 * threads, 1 << 30, threads, "cpu", 100.0),)

        return measure

    two = load_or_measure(tmp_path, max_age_s=60, now=100.0, measure=measure_at(2), threads=2)
    assert load_or_measure(tmp_path, max_age_s=60, now=110.0, measure=measure_at(2), threads=2) == two
    one = load_or_measure(tmp_path, max_age_s=60, now=120.0, measure=measure_at(1), threads=1)
    assert calls == [2, 1] and one[0].threads == 1
    assert load_or_measure(tmp_path, max_age_s=60, now=130.0, measure=measure_at(9)) == one  # any count: cached


def test_the_probe_measures_at_the_workers_thread_count(tmp_path: Path) -> None:
    """The daemon's probe child (``python -m arceusd.jobs.procs.probe DIR THREADS``) measures with the stage
    workers' torch threads and caches them; a bad count is refused with a message."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run = [sys.executable, "-m", "arceusd.jobs.procs.probe", str(tmp_path)]
    done = subprocess.run([*run, "1"], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    offer = json.loads(done.stdout.strip().splitlines()[-1])
    assert offer["flops_per_s"] > 0 and offer["kind"] == "cpu"
    cached = json.loads((tmp_path / "device_profile.json").read_text())
    assert [d["threads"] for d in cached["devices"]] == [1]
    bad = subprocess.run([*run, "0"], capture_output=True, text=True, timeout=120, cwd=root)
    assert bad.returncode != 0 and "THREADS must be a whole number >= 1" in bad.stderr


def test_best_measurement_picks_the_fastest() -> None:
    fast = DeviceMeasurement("cuda", 5e13, 1 << 33, 2, "gpu", 0.0)
    assert best_measurement([_fake(1e11, 0.0), fast]) == fast
    with pytest.raises(ValueError):
        best_measurement([])


@pytest.mark.parametrize("rtt,bw", [(0.002, 1.25e8), (0.05, 1.25e6), (0.0001, 1.25e9)])
def test_measure_link_recovers_rtt_and_bandwidth_from_a_fake_echo(rtt: float, bw: float) -> None:
    async def echo(payload: bytes) -> bytes:
        await trio.sleep(rtt / 2 + len(payload) / bw)  # there
        await trio.sleep(rtt / 2 + len(payload) / bw)  # and back
        return payload

    async def main() -> None:
        got = await measure_link(echo, small_count=5, small_size=64, large_size=1 << 20)
        # small echoes carry 64 bytes, so their median is rtt + 128/bw
        assert got.rtt_s == pytest.approx(rtt + 128 / bw, rel=1e-6)
        assert got.bandwidth_bytes_per_s == pytest.approx(bw, rel=0.01)
        link = got.to_link()
        assert link.rtt_s == got.rtt_s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_measure_link_rejects_a_corrupting_echo() -> None:
    async def echo(payload: bytes) -> bytes:
        return payload[::-1]

    async def main() -> None:
        with pytest.raises(ValueError, match="different bytes"):
            await measure_link(echo)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


SMALL_GPT = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=65)


@pytest.mark.parametrize("model", [SMALL_GPT, MLPConfig((784, 64, 10)), GPTConfig(9, 2, 32, 16, 65)])
def test_calibration_reads_back_the_efficiency_and_dispatch_that_made_the_timings(model: GPTConfig | MLPConfig) -> None:
    """A chain timing made from a known efficiency and dispatch (the cost model's compute term) gives them
    back."""
    speed, eff, dispatch, b = 5e10, 0.6, 2e-4, 4
    costs = block_costs(model)
    chain = chain_blocks(model)
    flops = sum(costs[i].forward_flops_per_sample + costs[i].backward_flops_per_sample for i in chain)
    real = flops * b / (speed * eff) + dispatch * len(chain)
    got = calibration_from_timings(model, b, speed, dispatch * len(chain), real, 3e-9, 1e-9)
    assert got.block_efficiency == pytest.approx(eff, rel=1e-9)
    assert got.dispatch_s == pytest.approx(dispatch, rel=1e-9)
    assert (got.adamw_s_per_param, got.sgd_s_per_param) == (3e-9, 1e-9)
    assert f"micro_batch={b}" in got.model
    slower = calibration_from_timings(model, b, speed, dispatch * len(chain), 2 * real, 0, 0)
    assert slower.block_efficiency < eff / 2
    with pytest.raises(ValueError, match="timings"):
        calibration_from_timings(model, b, speed, -1.0, real, 0, 0)


def test_calibration_without_readable_compute_stays_uncalibrated() -> None:
    got = calibration_from_timings(SMALL_GPT, 4, 5e10, 1e-3, 1e-3, 0, 0)
    assert got.block_efficiency == 1.0
    assert got.dispatch_s == pytest.approx(1e-3 / len(chain_blocks(SMALL_GPT)))


def test_measured_calibration_on_this_cpu_is_plausible() -> None:
    """At one torch thread, as a one-thread worker measures it: with a pool of threads on a machine busy with
    other work each parallel op waited for a descheduled thread, and AdamW measured 1.1e-5 s a parameter (the
    same code 2e-8 s in the next call: the thread pool's wait, not the optimizer)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flops = measure_device("cpu", size=128, repeats=2).flops_per_s
        got = measure_calibration("cpu", flops, SMALL_GPT, micro_batch=2, repeats=2)
    finally:
        torch.set_num_threads(threads)
    assert 1e-3 <= got.block_efficiency <= 4.0
    assert 0 < got.dispatch_s < 0.1
    assert 0 < got.adamw_s_per_param < 1e-5 and 0 < got.sgd_s_per_param < 1e-5
    with pytest.raises(ValueError, match="stat"):
        measure_calibration("cpu", flops, SMALL_GPT, stat="mean")
    with pytest.raises(ValueError, match="positive"):
        measure_calibration("cpu", 0.0, SMALL_GPT)


def test_the_chain_is_a_stage_of_every_block_kind_in_model_order() -> None:
    assert chain_blocks(REFERENCE_MODEL) == (0, 1, 2, 3, 4, REFERENCE_MODEL.n_layer + 1)
    assert chain_blocks(GPTConfig(12, 2, 32, 16, 65)) == (0, 1, 2, 3, 4, 13)  # capped, head kept
    assert chain_blocks(MLPConfig((784, 64, 10))) == (0, 1)


def test_profile_carries_its_calibration_to_the_planner() -> None:
    m = _fake(1e10, 0.0).with_calibration(Calibration(0.7, 2e-4, 2e-9, 5e-10, "gpt"))
    p = to_device_profile(m, "peer-a")
    assert (p.block_efficiency, p.dispatch_s, p.optimizer_s_per_param) == (0.7, 2e-4, 2e-9)
    assert p.effective_flops_per_s == pytest.approx(7e9)
    assert to_device_profile(m, "peer-a", optimizer="sgd").optimizer_s_per_param == 5e-10
    with pytest.raises(ValueError, match="optimizer"):
        to_device_profile(m, "peer-a", optimizer="lion")
    old = to_device_profile(_fake(1e10, 0.0), "peer-a")  # a profile from before calibration: none
    assert (old.block_efficiency, old.dispatch_s, old.optimizer_s_per_param) == (1.0, 0.0, 0.0)


def test_a_cache_from_before_calibration_is_measured_again(tmp_path: Path) -> None:
    old = {
        "version": 1,
        "measured_at": 100.0,
        "devices": [
            {
                "kind": "cpu",
                "flops_per_s": 1e9,
                "memory_bytes": 1 << 30,
                "threads": 2,
                "name": "cpu",
                "measured_at": 100.0,
            }
        ],
    }
    (tmp_path / "device_profile.json").write_text(json.dumps(old))
    fresh = _fake(2e9, 100.0).with_calibration(Calibration(0.8, 1e-4, 1e-9, 1e-10, "gpt"))
    got = load_or_measure(tmp_path, max_age_s=60, now=110.0, measure=lambda: (fresh,))
    assert got == (fresh,)
    assert json.loads((tmp_path / "device_profile.json").read_text())["version"] == CACHE_VERSION
    assert load_or_measure(tmp_path, max_age_s=60, now=120.0, measure=lambda: ()) == (fresh,)  # cached, kept


def test_measure_link_reads_the_busy_time_per_message_under_overlapping_latency() -> None:
    busy, latency = 4e-4, 5e-3  # each message keeps the (single) endpoint busy; latency overlaps

    async def main() -> None:
        lock = trio.Lock()

        async def echo(payload: bytes) -> bytes:
            for _ in range(2):  # request and reply: two messages
                async with lock:
                    await trio.sleep(busy)
                await trio.sleep(latency / 2)
            return payload

        got = await measure_link(echo, burst=64, in_flight=32)
        assert got.message_s == pytest.approx(busy, rel=0.15)
        assert got.rtt_s == pytest.approx(2 * busy + latency, rel=1e-6)
        assert got.to_link().message_s == got.message_s

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
