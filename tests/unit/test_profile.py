"""Device and link measurement: meminfo parsing, CPU benchmark, cache, link timing on a fake echo."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from arceusd.profile import (
    DeviceMeasurement,
    best_measurement,
    cpu_free_memory,
    load_or_measure,
    measure_device,
    measure_link,
    parse_meminfo_available,
    to_device_profile,
)

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
