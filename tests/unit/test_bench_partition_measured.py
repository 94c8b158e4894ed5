"""The pure parts of bench/partition_measured.py: the 25 % verdict, steady-step selection, the calibrated step
formula (checked against the partitioner's own cost model) and the tc commands for a capped loopback."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from partitioner import DeviceProfile, LinkMatrix, PlanInputs, TrainingParams
from partitioner.cost import CostModel
from partitioner.synthetic import gpt_like_blocks

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("partition_measured", ROOT / "bench" / "partition_measured.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["partition_measured"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def test_within_target_is_symmetric_around_the_prediction() -> None:
    assert bench.within_target(1.24, 1.0)
    assert bench.within_target(0.76, 1.0)
    assert not bench.within_target(1.26, 1.0)
    assert not bench.within_target(0.74, 1.0)
    with pytest.raises(ValueError, match="positive"):
        bench.within_target(1.0, 0.0)


def test_steady_steps_drop_warmup_and_take_the_slowest_worker() -> None:
    per_worker = [[9.0, 1.0, 3.0], [8.0, 2.0, 1.5]]
    assert bench.steady_step_seconds(per_worker, warmup=1) == [2.0, 3.0]
    with pytest.raises(ValueError, match="different numbers"):
        bench.steady_step_seconds([[1.0], [1.0, 2.0]], warmup=0)
    with pytest.raises(ValueError, match="warm-up"):
        bench.steady_step_seconds([[1.0, 2.0]], warmup=2)


def test_calibrated_formula_is_the_partitioners_with_the_optimizer_added() -> None:
    blocks = tuple(gpt_like_blocks(n_layer=4, n_embd=64, n_head=4, seq=32, vocab=65))
    devices = (DeviceProfile("a", 1e9, 1 << 34), DeviceProfile("b", 3e9, 1 << 34))
    inputs = PlanInputs(blocks, devices, LinkMatrix(()), TrainingParams(8, (4,), max_tensor_parallel=1))
    cm = CostModel(inputs)
    # no links: only single-stage placements are feasible, one per device
    for members in ((0,), (1,)):
        the_plan = cm.evaluate([(members, 0, len(blocks))], 4)
        assert the_plan is not None
        times = [st.time_s for st in the_plan.stages]
        got = bench.calibrated_step_s(times, the_plan.micro_batches, 0.0)
        assert got == pytest.approx(the_plan.predicted_step_time_s)
        assert bench.calibrated_step_s(times, the_plan.micro_batches, 0.5) == pytest.approx(got + 0.5)


def test_tc_commands_cap_with_a_burst_above_the_mtu() -> None:
    cmds = bench.tc_commands(20.0, 0.0, mtu=16384)
    tbf = next(c for c in cmds if "tbf" in c)
    assert tbf[tbf.index("rate") + 1] == "20.0mbit"
    assert int(tbf[tbf.index("burst") + 1]) >= 16384
    assert not any("netem" in c for c in cmds)
    delayed = bench.tc_commands(20.0, 3.0)
    assert any("netem" in c for c in delayed)
    assert next(c for c in delayed if "tbf" in c)[5:7] == ["parent", "1:1"]
    with pytest.raises(ValueError, match="positive"):
        bench.tc_commands(0.0, 0.0)


def test_uncalibrated_figure_is_the_same_plan_without_the_calibration() -> None:
    from partitioner import Link, plan
    from tests.unit._partitioner_cases import calibrated, small_instance

    cal = calibrated(small_instance(3, 3, 4, mem_gib=(0.05, 0.3)), 1)
    the_plan = plan(cal)
    got = bench.uncalibrated_step_s(cal, the_plan)
    bare = CostModel(
        PlanInputs(
            cal.blocks,
            tuple(DeviceProfile(d.peer_id, d.flops_per_s, d.memory_bytes, d.kind) for d in cal.devices),
            LinkMatrix(tuple((a, b, Link(lk.rtt_s, lk.bandwidth_bytes_per_s)) for a, b, lk in cal.links.links)),
            cal.training,
        )
    )
    stages = [(tuple(bare.index[d] for d in st.devices), st.start, st.end) for st in the_plan.stages]
    again = bare.evaluate(stages, the_plan.micro_batches)
    assert again is not None and got == again.predicted_step_time_s
    assert got != pytest.approx(the_plan.predicted_step_time_s, rel=1e-3)  # the calibration matters here
