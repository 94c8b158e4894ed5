"""A running job's money and time so far and to the end, from what the job measured (issue 31): what ``status JOB``,
``--watch`` and the dashboard show beside its progress.

Owns :class:`CostProgress` (pure, :func:`cost_progress`) and :func:`job_cost`, which reads the figures the leader
keeps: what its receipts add up to and the dollars per step they measure (``arceusd.market.receipts.LeaderBook``,
through ``MarketService.spend``), the job's ``needs.budget_usd`` and its measured rate of steps (its time left,
``arceusd.jobs.record.throughput``). The cost to finish is the measured dollars per step x the steps left (unknown until
the first checkpoint is paid); the time to finish is the measured time left plus the model's export (what this
daemon measured its past jobs of that model to take, :func:`arceusd.market.timings.end_term`; else
:func:`arceusd.market.forecast.end_seconds`). Only the job's leader holds the book: other devices show none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from arceusd.market.admission import Spend
from arceusd.market.forecast import END_S, end_seconds
from arceusd.market.timings import end_term, read_timings


@dataclass(frozen=True)
class CostProgress:
    """A job's spend so far and what finishing it takes (None: not measured yet)."""

    spent_usd: float
    budget_usd: float
    """``needs.budget_usd`` (0: none)."""
    remaining_budget_usd: float | None
    """The budget less the spend (None: no budget)."""
    per_step_usd: float
    """Dollars per step the receipts measured (0: none paid yet)."""
    to_finish_s: float | None
    to_finish_usd: float | None
    at_finish_usd: float | None
    """Spent plus the cost to finish."""

    def line(self) -> str:
        """The figures for people (``arceusd status JOB``)."""
        budget = (
            f", budget ${self.budget_usd:.6f} (${self.remaining_budget_usd or 0.0:.6f} left)"
            if self.budget_usd
            else ", no budget set"
        )
        left = "time to finish -" if self.to_finish_s is None else f"about {self.to_finish_s:.0f} s to finish"
        usd = (
            "cost to finish unknown until a checkpoint is paid"
            if self.to_finish_usd is None
            else f"${self.to_finish_usd:.6f} more (${self.at_finish_usd or 0.0:.6f} in all)"
        )
        return f"spent ${self.spent_usd:.6f}{budget}; {left}, {usd}"


def cost_progress(
    spend: Spend,
    budget_usd: float,
    step: int,
    total_steps: int,
    eta_s: float | None,
    running: bool,
    committed: bool = False,
    end_s: float = END_S,
) -> CostProgress:
    """The figures of a job at ``step`` of ``total_steps`` that has spent ``spend`` (pure); ``committed``: the
    leader has settled a commit since it began (a cost per step of 0 then means no device is paid: $0 to finish);
    ``end_s``: the last commit to ``done``."""
    remaining = max(total_steps - step, 0)
    to_finish_s = None if not running or eta_s is None else eta_s + end_s
    if not running:
        to_finish_usd: float | None = 0.0 if remaining == 0 else None
    else:
        to_finish_usd = spend.per_step_usd * remaining if spend.per_step_usd > 0 or committed else None
    return CostProgress(
        spend.usd,
        budget_usd,
        budget_usd - spend.usd if budget_usd else None,
        spend.per_step_usd,
        to_finish_s,
        to_finish_usd,
        None if to_finish_usd is None else spend.usd + to_finish_usd,
    )


def job_cost(node: Any, job: Any) -> dict[str, Any] | None:
    """The job's :class:`CostProgress` as JSON, on its leader or a device that kept a book of it (None elsewhere, or
    without the market service)."""
    market = getattr(node, "market", None)
    leads = str(getattr(job, "leader", "") or "") == node.identity.peer_id
    if market is None or (job.job_id not in getattr(market, "books", {}) and not leads):
        return None  # (a leader that took over keeps its book after it is no longer the leader)
    speed = job.speed()
    running = str(getattr(job.state, "value", job.state)) == "running"
    book = market.books.get(job.job_id)
    committed = book is not None and book.last[0] > book.first
    paths = getattr(node, "paths", None)
    timings = read_timings(paths.root) if paths is not None else []
    progress = cost_progress(
        market.spend(job),
        float(job.spec.needs.budget_usd),
        int(job.step),
        int(job.total_steps),
        speed.eta_s,
        running,
        committed,
        end_term(timings, type(job.spec.model).__name__, end_seconds(job.spec)).value,
    )
    return {**asdict(progress), "line": progress.line()}


__all__ = ["CostProgress", "cost_progress", "job_cost"]
