"""A stage worker's event as the typed report the leader takes (issue #18): :func:`report_of_event`.

The worker's events reach this daemon as JSON lines (:mod:`arceusd.worker.protocol` checks their shape;
:mod:`arceusd.jobs.procs.supervisor` reads them). The ones the leader needs (checkpoint, witness, done, error, and
``lost`` when the worker died without saying why) become a :class:`protocol.job_wire.JobReport` here, once, on the
device whose worker it is: the same value goes to the leader over the wire, or is handled in place when this
device leads (:class:`arceusd.jobs.member.local_worker.LocalWorker`). The leader's checks then read typed fields only
(:mod:`arceusd.jobs.leader.shard_checks`, :mod:`arceusd.jobs.leader.witnesses`, :mod:`arceusd.jobs.judging.claims`).

What the wire cannot carry is not guessed at: a part of the wrong type is left out (the leader then refuses the
report as it would a member's), an error message is cut to :data:`protocol.job_wire.REPORT_MESSAGE_MAX` bytes, and
anything else that does not fit its bound (a shard name over 128 bytes, an integer beyond 64 bits) raises
:class:`ValueError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol import codec
from protocol.errors import LocalProtocolError
from protocol.job_wire import REPORT_MESSAGE_MAX, JobReport, ReportCursor, ReportKind, ReportShard

KINDS: dict[str, ReportKind] = {kind.name.lower(): kind for kind in ReportKind}
"""A worker event's ``event`` name -> the report kind (``leave`` is the member's own, never a worker's)."""
CLAIMS = ("step_s", "predicted_s", "wait_s", "wait_up_s", "wait_down_s", "group_wait_s")
"""The step-time claims a checkpoint report carries (:func:`arceusd.jobs.judging.claims.own_step_times`)."""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond a float: no claim a report can carry
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (whole characters; a lone surrogate becomes ``?``)."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def _shard(value: object) -> ReportShard | None:
    if not isinstance(value, Mapping):
        return None
    name, sha256, size = _text(value.get("name")), _text(value.get("sha256")), _int(value.get("size"))
    return None if name is None or sha256 is None or size is None else ReportShard(name, sha256, size)


def _cursor(value: object) -> ReportCursor | None:
    if not isinstance(value, Mapping) or set(value) != {"epoch", "step"}:
        return None
    epoch, step = _int(value["epoch"]), _int(value["step"])
    return None if epoch is None or step is None else ReportCursor(epoch, step)


def report_of_event(job_id: str, epoch: int, event: Mapping[str, Any]) -> JobReport:
    """The :class:`JobReport` of worker ``event`` (a dict from the worker's JSON line, with this device's step-time
    claims merged in for a checkpoint) for plan epoch ``epoch`` of job ``job_id``.

    Error handling: :class:`ValueError` for an event of no report kind, or one whose parts do not fit the wire's
    bounds (see the module docstring)."""
    name = event.get("event")
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"no report carries a worker event {str(name)[:40]!r}")
    message = event.get("message")
    claims = {key: _float(event.get(key)) for key in CLAIMS}
    report = JobReport(
        job_id,
        epoch,
        kind,
        step=_int(event.get("step")),
        shard=_shard(event.get("shard")),
        cursor=_cursor(event.get("cursor")),
        digest=_text(event.get("digest")) or "",
        message="" if message is None else clip(str(message), REPORT_MESSAGE_MAX),
        step_s=claims["step_s"],
        predicted_s=claims["predicted_s"],
        wait_s=claims["wait_s"],
        wait_up_s=claims["wait_up_s"],
        wait_down_s=claims["wait_down_s"],
        group_wait_s=claims["group_wait_s"],
    )
    try:
        codec.encode(report)
    except LocalProtocolError as exc:
        raise ValueError(f"a {name} report does not fit the wire: {exc}") from None
    return report


__all__ = ["CLAIMS", "KINDS", "clip", "report_of_event"]
