"""The worker start command carries the plan's seconds per micro-batch of every stage, and the worker decides
from them whether deferring weights' gradients pays (``process.defer_weights``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from arceusd.worker.process import defer_weights
from arceusd.worker.protocol import MemberConfig, StageConfig, WorkerConfig, WorkerProtocolError


def _config(times: list[float | None], schedule: str = "1f1b", micro: int = 8) -> WorkerConfig:
    stages = tuple(StageConfig(2 * s, 2 * s + 2, (MemberConfig(f"{s:032x}"),), t) for s, t in enumerate(times))
    return WorkerConfig(
        job_id="job",
        term=1,
        epoch=1,
        spec={},
        stages=stages,
        micro_batches=micro,
        schedule=schedule,
        peer_id=stages[0].members[0].peer_id,
        state_dir="/nonexistent",
        listen_host="127.0.0.1",
        owner=stages[0].members[0].peer_id,
        checkpoint_dir="/nonexistent",
        checkpoint_interval=0,
        total_steps=1,
    )


def test_stage_times_survive_the_round_trip_and_older_commands_parse() -> None:
    config = _config([0.05, 0.06])
    back = WorkerConfig.from_json(config.to_json())
    assert [s.micro_batch_s for s in back.stages] == [0.05, 0.06]
    raw = json.loads(config.to_json())
    for st in raw["stages"]:
        del st["micro_batch_s"]  # a command from a daemon before this field
    assert [s.micro_batch_s for s in WorkerConfig.from_dict(raw).stages] == [None, None]


@pytest.mark.parametrize("bad", ["fast", -1.0, True, float("inf")])
def test_a_bad_stage_time_is_refused(bad: object) -> None:
    raw = json.loads(_config([0.05, 0.06]).to_json())
    raw["stages"][1]["micro_batch_s"] = bad
    with pytest.raises(WorkerProtocolError, match=r"stages\[1\].micro_batch_s"):
        WorkerConfig.from_dict(raw)


def test_the_worker_defers_on_even_stages_and_not_behind_a_lopsided_bottleneck() -> None:
    assert defer_weights(_config([0.05, 0.05]))
    assert defer_weights(_config([0.05, 0.05], schedule="gpipe"))
    assert defer_weights(_config([None, None]))  # no times: equal stages assumed
    assert not defer_weights(_config([0.05]))  # a lone stage has nothing to overlap
    # the last stage is the bottleneck by far and never waits: its split would only cost
    assert not defer_weights(_config([0.01, 0.2]))


def test_a_capped_plan_reaches_the_worker_which_then_defers_nothing() -> None:
    """The plan's ``in_flight_cap`` travels in the start command (an older command has none: no cap); a capped
    worker defers no weights (a deferred micro-batch would keep its stash past the cap); a cap above the
    micro-batches is refused."""
    capped = dataclasses.replace(_config([0.05, 0.05]), max_in_flight=2)
    assert WorkerConfig.from_json(capped.to_json()).max_in_flight == 2
    raw = json.loads(capped.to_json())
    del raw["max_in_flight"]
    assert WorkerConfig.from_dict(raw).max_in_flight == 0
    assert defer_weights(_config([0.05, 0.05])) and not defer_weights(capped)
    raw["max_in_flight"] = 9
    with pytest.raises(WorkerProtocolError, match="max_in_flight"):
        WorkerConfig.from_dict(raw)
