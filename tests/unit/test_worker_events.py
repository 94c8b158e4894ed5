"""The worker's step event on its stdout line protocol: the wait and optimizer times survive the round trip,
and a line from an older worker without them still parses (as 0)."""

from __future__ import annotations

import json

from arceusd.worker.protocol import StepEvent, parse_event


def test_step_event_round_trips_its_wait_and_optimizer_seconds() -> None:
    event = StepEvent(
        3,
        2.5,
        1e-3,
        0.7,
        16,
        2048,
        0.5,
        wait_seconds=0.06,
        optimizer_seconds=0.007,
        wait_up_seconds=0.01,
        wait_down_seconds=0.04,
    )
    assert parse_event(event.to_line()) == event


def test_a_step_line_without_the_new_fields_still_parses() -> None:
    line = json.dumps(
        {
            "event": "step",
            "step": 1,
            "loss": 2.0,
            "lr": 0.1,
            "grad_norm": 1.0,
            "samples": 8,
            "tokens": 8,
            "seconds": 0.2,
        }
    )
    event = parse_event(line)
    assert isinstance(event, StepEvent)
    assert (event.wait_seconds, event.optimizer_seconds) == (0.0, 0.0)
    assert (event.wait_up_seconds, event.wait_down_seconds) == (0.0, 0.0)
