"""Backtest outcomes in PostgreSQL (`core/migrations/0006_backtests.sql`): the runner records
each run, and the promotion gate reads a candidate's latest.

The report itself (`tidegate.dlq.backtest_report.BacktestReport`) lives above the lifecycle, so
`record_backtest` takes anything shaped like it (`BacktestSummary`) and the lifecycle never
imports the dlq layer. The gate's numbers are stored as columns; the report's JSON rides along
for people and tools.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.errors import LifecycleUnavailableError

__all__ = ["BacktestRecord", "BacktestSummary", "latest_backtest", "record_backtest"]

Pool = AsyncConnectionPool[Any]


class BacktestSummary(Protocol):
    """What `record_backtest` reads of a report (`BacktestReport` has all of it)."""

    @property
    def model(self) -> str: ...
    @property
    def candidate(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def baseline_versions(self) -> Sequence[str]: ...
    @property
    def requests(self) -> int: ...
    @property
    def rows_compared(self) -> int: ...
    @property
    def candidate_errors(self) -> int: ...
    @property
    def missing_served(self) -> int: ...
    @property
    def agreement(self) -> float | None: ...
    @property
    def mean_cosine(self) -> float | None: ...
    @property
    def max_abs_diff(self) -> float | None: ...
    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class BacktestRecord:
    """One recorded backtest, without its report (`report` reads it when wanted)."""

    id: int
    model: str
    candidate_version: str
    baseline_versions: list[str]
    window_from: datetime
    window_to: datetime
    task: str
    requests: int
    rows_compared: int
    candidate_errors: int
    missing_served: int
    agreement: float | None
    mean_cosine: float | None
    max_abs_diff: float | None
    actor: str
    created_at: datetime

    @property
    def error_rate(self) -> float:
        """Candidate errors / requests that had a served result to compare with."""
        attempted = self.requests - self.missing_served
        return self.candidate_errors / attempted if attempted > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("window_from", "window_to", "created_at"):
            data[key] = data[key].isoformat()
        return data


_INSERT = """
INSERT INTO backtests (model, candidate_version, baseline_versions, window_from, window_to, task,
    requests, rows_compared, candidate_errors, missing_served, agreement, mean_cosine,
    max_abs_diff, report, actor)
VALUES (%(model)s, %(candidate)s, %(baselines)s, %(start)s, %(end)s, %(task)s, %(requests)s,
    %(rows)s, %(errors)s, %(missing)s, %(agreement)s, %(cosine)s, %(max_abs)s, %(report)s,
    %(actor)s)
RETURNING id, model, candidate_version, baseline_versions, window_from, window_to, task, requests,
    rows_compared, candidate_errors, missing_served, agreement, mean_cosine, max_abs_diff, actor,
    created_at
"""

_LATEST = """
SELECT id, model, candidate_version, baseline_versions, window_from, window_to, task, requests,
    rows_compared, candidate_errors, missing_served, agreement, mean_cosine, max_abs_diff, actor,
    created_at
FROM backtests WHERE model = %s AND candidate_version = %s
ORDER BY created_at DESC, id DESC LIMIT 1
"""


async def record_backtest(
    pool: Pool, report: BacktestSummary, *, actor: str, window: tuple[datetime, datetime]
) -> BacktestRecord:
    """Store one run's outcome; the time range is the one the runner re-scored."""
    start, end = window
    if start.tzinfo is None or end.tzinfo is None or start > end:
        raise ValueError(f"a backtest window is two aware times in order, not {window}")
    params = {
        "model": report.model,
        "candidate": report.candidate,
        "baselines": list(report.baseline_versions),
        "start": start,
        "end": end,
        "task": report.task,
        "requests": report.requests,
        "rows": report.rows_compared,
        "errors": report.candidate_errors,
        "missing": report.missing_served,
        "agreement": report.agreement,
        "cosine": report.mean_cosine,
        "max_abs": report.max_abs_diff,
        "report": Jsonb(report.to_json()),
        "actor": actor,
    }
    async with connection(pool) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_INSERT, params)
        row = await cur.fetchone()
    if row is None:  # INSERT ... RETURNING returns the row it inserted
        raise LifecycleUnavailableError("recording the backtest returned no row")
    return BacktestRecord(**row)


async def latest_backtest(pool: Pool, model: str, candidate: str) -> BacktestRecord | None:
    """The candidate's most recent backtest, whatever it found: a newer run supersedes an older
    pass (it saw newer traffic, or a rebuilt candidate)."""
    async with connection(pool) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_LATEST, (model, candidate))
        row = await cur.fetchone()
    return BacktestRecord(**row) if row is not None else None
