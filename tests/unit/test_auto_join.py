"""Auto-join's retries (:meth:`arceusd.jobs.member.join.Joiner.auto_join`): a refusal the leader marks as one that
may pass soon (it holds this device dead: ``JoinReply.retry``) is asked again, backing off, a bounded number of times;
an acceptance or a final refusal ends it at once. (A join that gave up at the first "held dead" refusal, after a
loaded device's false death, left a job waiting for a member forever.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from arceusd.jobs.member.join import AUTO_JOIN_ATTEMPTS, Joiner


def _run(answers: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> int:
    async def may(*_: object) -> bool:
        return True

    part = Joiner(cast(Any, SimpleNamespace(may_auto_join=may)))  # its port: only what auto_join calls
    asked = []

    async def join(_job: object) -> dict[str, Any]:
        asked.append(1)
        return answers[min(len(asked), len(answers)) - 1]

    monkeypatch.setattr(part, "join", join)
    job = type("Job", (), {"job_id": "j"})()
    trio.run(part.auto_join, cast(Any, job), clock=trio.testing.MockClock(autojump_threshold=0))
    return len(asked)


def test_a_refusal_that_may_pass_is_asked_again_until_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    held = {"accepted": False, "reason": "this leader holds the device dead", "retry": True}
    assert _run([held, held, {"accepted": True, "reason": ""}], monkeypatch) == 3


def test_a_final_refusal_ends_it_and_retries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run([{"accepted": False, "reason": "not admitted", "retry": False}], monkeypatch) == 1
    held = {"accepted": False, "reason": "held dead", "retry": True}
    assert _run([held], monkeypatch) == AUTO_JOIN_ATTEMPTS
