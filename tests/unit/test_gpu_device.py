"""A GPU machine in the swarm (issue 30, item 8), on CPU: the device line names the GPU and its memory once the
device is measured (``arceusd.device.summary``), bounded and escaped; ``devices`` restricts what a daemon lends
(``arceusd.device.config``, ``arceusd.device.profile.chosen_measurement``); and the planner gives a fast GPU the
whole job when a 1-thread CPU beside it would only slow the step (issue 31's rule, with measured-like profiles)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from arceusd.device.config import ConfigError, DaemonConfig, load_config
from arceusd.device.profile import CACHE_FILE, CACHE_VERSION, DeviceMeasurement, chosen_measurement
from arceusd.device.summary import MAX_SUMMARY, accelerator_parts, device_summary, format_summary, machine_line
from arceusd.jobs.plans.planning import Offer, make_plan
from arceusd.jobs.spec.schema import load_spec

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def _measurement(kind: str, name: str, flops: float, memory: int) -> DeviceMeasurement:
    return DeviceMeasurement(kind, flops, memory, 1, name, 1000.0)


CPU = _measurement("cpu", "cpu", 4e10, 100 * GIB)
GPU = _measurement("cuda", H100, 2.5e13, 79 * GIB + 123)


def _write_cache(state: Path, found: list[DeviceMeasurement], measured_at: float = 1000.0) -> None:
    data = {"version": CACHE_VERSION, "measured_at": measured_at, "devices": [dataclasses.asdict(d) for d in found]}
    state.mkdir(parents=True, exist_ok=True)
    (state / CACHE_FILE).write_text(json.dumps(data))


def test_the_line_names_a_measured_gpu_and_its_memory() -> None:
    parts = accelerator_parts([("cpu", "cpu", 100 * GIB), ("cuda", H100, 79 * GIB + 123)])
    assert parts == [f"cuda {H100} 79 GiB"], "the CPU is the machine line's; the GPU comes with its memory"
    line = format_summary("linux x86_64, 16 cores, 125 GiB", parts)
    assert line == f"linux x86_64, 16 cores, 125 GiB; cuda {H100} 79 GiB"
    assert accelerator_parts([("cuda", H100, GIB)], kinds=("cpu",)) == [], "a CPU-only daemon does not lend it"
    assert accelerator_parts([("mps", "mps", 8 * GIB)]) == ["mps 8 GiB"], "a name that is only the kind: once"


def test_the_line_is_bounded_and_escaped() -> None:
    hostile = "evil\x1b]0;title\x07" + "x" * 500
    line = format_summary(machine_line(), accelerator_parts([("cuda", hostile, GIB)]))
    assert len(line) <= MAX_SUMMARY and "\x1b" not in line and "\x07" not in line, line
    assert "\\x1b" in line, "a control character shows as its escape"


def test_the_summary_reads_the_cached_profile_however_old(tmp_path: Path) -> None:
    assert device_summary(tmp_path) == machine_line(), "not measured yet: the machine alone"
    _write_cache(tmp_path, [CPU, GPU], measured_at=1.0)  # older than the planner's day: the name still holds
    assert device_summary(tmp_path) == f"{machine_line()}; cuda {H100} 79 GiB"
    assert device_summary(tmp_path, ("cpu",)) == machine_line()
    (tmp_path / CACHE_FILE).write_text("{not json")
    assert device_summary(tmp_path) == machine_line(), "an unreadable cache: the machine alone, no error"


def test_devices_restricts_the_lent_device(tmp_path: Path) -> None:
    assert chosen_measurement([CPU, GPU]) == GPU, "by default the fastest"
    assert chosen_measurement([CPU, GPU], ("cpu",)) == CPU
    with pytest.raises(ValueError, match=r"devices = \['mps'\] names no device of this machine \(measured: cpu"):
        chosen_measurement([CPU, GPU], ("mps",))
    (tmp_path / "config.toml").write_text('devices = ["cpu"]\n')
    assert load_config(tmp_path).devices == ("cpu",)
    (tmp_path / "config.toml").write_text('devices = ["tpu"]\n')
    with pytest.raises(ConfigError, match=r"devices must be distinct kinds from cpu, cuda, mps"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="devices must be distinct"):
        DaemonConfig(state_dir=tmp_path, devices=("cpu", "cpu"))


def _offer(peer: str, kind: str, flops: float, efficiency: float, dispatch: float, adamw: float) -> Offer:
    return Offer(peer * 32, f"127.0.0.1:{ord(peer)}", flops, 60 * GIB, kind, efficiency, dispatch, adamw, adamw / 2)


def test_a_gpu_beside_a_one_thread_cpu_is_planned_alone() -> None:
    """Measured-like figures: an H100's 512-matmul benchmark (2.5e13 FLOP/s), a third of it in blocks and 1 ms
    of launches per block; a CPU core (4e10 FLOP/s). The Llama example's model: the CPU would only slow it."""
    spec = load_spec(str(ROOT / "examples" / "llama-shakespeare.toml"))
    assert not spec.training.use_all_devices
    gpu = _offer("g", "cuda", 2.5e13, 0.3, 1e-3, 1e-10)
    cpu = _offer("c", "cpu", 4e10, 0.6, 2e-4, 5e-9)
    _inputs, alone = make_plan(spec, [gpu, cpu], {}, include=gpu.peer_id)
    assert {d for stage in alone.stages for d in stage.devices} == {gpu.peer_id}, alone
    every_spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, use_all_devices=True))
    _inputs, both = make_plan(every_spec, [gpu, cpu], {}, include=gpu.peer_id)
    assert {d for stage in both.stages for d in stage.devices} == {gpu.peer_id, cpu.peer_id}
    assert alone.predicted_step_time_s < both.predicted_step_time_s, "the GPU alone is the faster plan"
