"""How the daemon reads a file-work child's answer (``arceusd.jobs.procs.filework._run``): the last stdout line is the
answer; one that carries ``error`` fails the task with that line, a whole answer is kept even when the exit code
read afterwards says otherwise (a loaded machine's fork server once made a finished re-slice fail a recovery with
'resume failed: no reason given'), and no answer fails with the exit code and the child's stderr."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from arceusd.jobs.procs import filework


class FakeStarts:
    def __init__(self, code: int, out: bytes, err: bytes = b"") -> None:
        self.answer = (code, out, err)

    async def run(self, module: str, argv: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        assert module == "arceusd.jobs.procs.filework" and argv == ["resume"]
        return self.answer


def run(monkeypatch: pytest.MonkeyPatch, code: int, out: bytes, err: bytes = b"") -> dict[str, Any]:
    monkeypatch.setattr(filework, "warm_starts", lambda: FakeStarts(code, out, err))
    return trio.run(filework._run, "resume", {})


def test_a_whole_answer_is_kept_whatever_the_exit_code_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(monkeypatch, 0, b'{"resume": null}\n') == {"resume": None}
    assert run(monkeypatch, -255, b'progress\n{"resume": null}\n') == {"resume": None}


def test_an_error_answer_or_none_fails_with_what_the_child_said(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(filework.FileworkError, match="resume failed: ValueError: bad plan"):
        run(monkeypatch, 1, b'{"error": "ValueError: bad plan"}\n')
    with pytest.raises(filework.FileworkError, match=r"exit 1\): Traceback"):
        run(monkeypatch, 1, b"", b"Traceback ...")
