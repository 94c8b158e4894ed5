"""One owner of a job's speed (issue 31): steps/s, samples/s, tokens/s and the time left come from one rate over
one window of the step counter, so they agree with each other and with the counter; a resume starts it again."""

from __future__ import annotations

import pytest

from arceusd.jobs.record.throughput import Speed, Throughput


def test_every_figure_is_the_step_rate_times_what_a_step_holds() -> None:
    tp = Throughput(window_s=30.0)
    for i in range(11):
        tp.add(100.0 + 0.5 * i, 40 + i)  # 2 steps/s
    speed = tp.speed(step=50, total_steps=250, batch_size=16, context=128)
    assert speed.steps_per_s == pytest.approx(2.0)
    assert speed.samples_per_s == pytest.approx(32.0)
    assert speed.tokens_per_s == pytest.approx(2.0 * 16 * 128), "tokens/s = steps/s x batch x context"
    assert speed.eta_s == pytest.approx(100.0)
    assert tp.speed(50, 250, 16, None).tokens_per_s is None, "no tokens for a model without a context"


def test_the_window_forgets_old_steps_and_a_resume_starts_again() -> None:
    tp = Throughput(window_s=10.0)
    tp.add(0.0, 0)
    tp.add(1.0, 100)  # a fast burst long ago
    for t in range(20, 41):
        tp.add(float(t), 100 + (t - 20))  # then 1 step/s
    assert tp.steps_per_s() == pytest.approx(1.0)
    tp.add(41.0, 60)  # resumed from the checkpoint of step 60
    assert tp.steps_per_s() is None and tp.speed(60, 100, 4, 8) == Speed()
    tp.add(43.0, 64)
    assert tp.steps_per_s() == pytest.approx(2.0)


def test_a_stages_blocks_read_the_same_everywhere() -> None:
    from arceusd.jobs.record.view import block_range

    assert block_range([2, 6]) == "2-5" and block_range([3, 4]) == "3", "[start, end) as the blocks held"
    assert block_range("0-3") == "?" and block_range([1]) == "?"
