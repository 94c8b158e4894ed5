"""The figures of members' checkpoint reports that ``arceusd status JOB`` shows: ONE declared table.

The leader keeps each member's latest checkpoint or witness report as it came, once its checks passed
(``job.leading.commits.latest``, :meth:`arceusd.jobs.leader.report_intake.ReportIntake.take`).
:data:`SHOWN_REPORT_FIELDS` names which of a :class:`protocol.job_wire.JobReport`'s fields are shown, under what
label and in what form; :func:`report_figures` (the JSON of ``status JOB --json``, through
:meth:`arceusd.jobs.record.job.Job.summary`'s ``member_reports``) and :func:`report_lines` (the text of
``status JOB``, :func:`arceusd.jobs.record.view.render_job`) both read it. A new figure in a member's report is a
field of ``JobReport`` (``protocol/job_wire.py``), the member filling it (``arceusd/jobs/member/reports.py``) and
one row here: docs/ARCHITECTURE.md, "Example: one more figure in a member's checkpoint report".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arceusd.jobs.judging.claims import MAX_REPORTED_S
from protocol.job_wire import JobReport


class Form(enum.Enum):
    """How a figure is written in the text view (the JSON keeps the number as reported)."""

    COUNT = "count"  # a whole number: 120
    MS = "ms"  # seconds written as milliseconds: 12.3 ms
    MB = "mb"  # bytes written as megabytes: 1.5 MB


BOUNDS: dict[Form, float] = {Form.COUNT: 2.0**53, Form.MS: MAX_REPORTED_S, Form.MB: 2.0**53}
"""A member's figure is shown only when finite and in ``[0, bound)`` of its form (the codec bounds only its type)."""


@dataclass(frozen=True)
class ShownField:
    """One shown figure: ``name`` a field of :class:`JobReport`, ``label`` its word in the text view."""

    name: str
    label: str
    form: Form


SHOWN_REPORT_FIELDS: tuple[ShownField, ...] = (
    ShownField("step", "at step", Form.COUNT),
    ShownField("step_s", "step", Form.MS),
    ShownField("predicted_s", "planned", Form.MS),
    ShownField("wait_s", "waiting", Form.MS),
    ShownField("group_wait_s", "group wait", Form.MS),
)
"""The report fields ``status JOB`` shows per member, in this order (a field left unset in a report is skipped)."""


def _figure(value: object, form: Form) -> int | float | None:
    """A report's value as a shown figure: an int or float (not a bool), finite and within its form's bound."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) and 0 <= value < BOUNDS[form] else None


def report_figures(latest: Mapping[str, JobReport]) -> dict[str, dict[str, int | float]]:
    """Peer -> the shown fields of its latest report that it filled (the JSON's ``member_reports``)."""
    out: dict[str, dict[str, int | float]] = {}
    for peer, report in sorted(latest.items()):
        figures = {
            f.name: v for f in SHOWN_REPORT_FIELDS if (v := _figure(getattr(report, f.name, None), f.form)) is not None
        }
        if figures:
            out[peer] = figures
    return out


def _written(value: int | float, form: Form) -> str:
    if form is Form.MS:
        return f"{value * 1000:.1f} ms"
    if form is Form.MB:
        return f"{value / 1e6:.1f} MB"
    return str(int(value))


def report_lines(j: Mapping[str, Any]) -> list[str]:
    """The text view's line per member from a summary's ``member_reports`` (the table's labels and forms)."""
    lines = []
    shown = j.get("member_reports")
    for peer, figures in sorted(shown.items() if isinstance(shown, dict) else ()):
        if not isinstance(figures, dict):
            continue
        parts = [
            f"{f.label} {_written(v, f.form)}"
            for f in SHOWN_REPORT_FIELDS
            if (v := _figure(figures.get(f.name), f.form)) is not None
        ]
        if parts:
            lines.append(f"  reported {str(peer)[:12]}  " + ", ".join(parts))
    return lines


__all__ = ["BOUNDS", "SHOWN_REPORT_FIELDS", "Form", "ShownField", "report_figures", "report_lines"]
