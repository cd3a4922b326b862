"""Queries over the indexed lineage: who served a request, and how a shadow candidate compares.

Both read the tables the indexer fills (`infra/migrations/0003_lineage.sql`). Shadow stats are
aggregated in SQL, over every comparison stored for the candidate, so `models compare` and the
promotion gate see the same numbers however many workers produced them.

Definitions (per candidate):
* samples: comparisons in which the candidate answered; `candidate_errors` counts the others,
  in which nothing was compared.
* agreement: rows whose argmax class agreed / rows compared, over classifier comparisons.
* mean_abs_diff: sum of absolute output differences / output values compared.
* mean_cosine: sum of per-row cosine similarities / rows, over embedding comparisons.
* latency percentiles: percentile_cont over the answered comparisons' primary and candidate times.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.errors import LifecycleUnavailableError

__all__ = ["ServedRecord", "ShadowStats", "served", "shadow_stats"]

Pool = AsyncConnectionPool[Any]


@dataclass(frozen=True, slots=True)
class ServedRecord:
    request_id: str
    model: str
    version: str | None
    status: str
    worker_id: str
    routing_rule: str | None
    tenant: str
    routing_key: str | None
    completed_at: datetime
    total_ms: float
    error_code: str | None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["completed_at"] = self.completed_at.isoformat()
        return data


@dataclass(frozen=True, slots=True)
class ShadowStats:
    model: str
    candidate: str
    samples: int
    rows: int
    agreement: float | None
    mean_abs_diff: float | None
    mean_cosine: float | None
    primary_p50_ms: float | None
    primary_p99_ms: float | None
    candidate_p50_ms: float | None
    candidate_p99_ms: float | None
    candidate_errors: int
    primary_version: str | None
    """The primary the latest comparison was made against."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def served(pool: Pool, request_id: str) -> ServedRecord | None:
    """Which version served the request, when, on which worker and why; None if not indexed."""
    async with connection(pool) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT request_id, model, version, status, worker_id, routing_rule, tenant,"
            " routing_key, completed_at, total_ms, error_code"
            " FROM served_requests WHERE request_id = %s",
            (request_id,),
        )
        row = await cur.fetchone()
    return ServedRecord(**row) if row is not None else None


_SHADOW_STATS = """
SELECT
    count(*) FILTER (WHERE ok) AS samples,
    count(*) FILTER (WHERE NOT ok) AS candidate_errors,
    coalesce(sum(rows) FILTER (WHERE ok), 0) AS rows,
    sum(agree_rows) FILTER (WHERE ok AND agree_rows IS NOT NULL)::float8
        / nullif(sum(rows) FILTER (WHERE ok AND agree_rows IS NOT NULL), 0) AS agreement,
    sum(abs_diff_sum) FILTER (WHERE ok)
        / nullif(sum(value_count) FILTER (WHERE ok), 0) AS mean_abs_diff,
    sum(cosine_sum) FILTER (WHERE ok AND cosine_sum IS NOT NULL)
        / nullif(sum(rows) FILTER (WHERE ok AND cosine_sum IS NOT NULL), 0) AS mean_cosine,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY primary_ms) FILTER (WHERE ok) AS primary_p50_ms,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY primary_ms) FILTER (WHERE ok) AS primary_p99_ms,
    percentile_cont(0.5) WITHIN GROUP (ORDER BY candidate_ms) FILTER (WHERE ok)
        AS candidate_p50_ms,
    percentile_cont(0.99) WITHIN GROUP (ORDER BY candidate_ms) FILTER (WHERE ok)
        AS candidate_p99_ms,
    (array_agg(primary_version ORDER BY compared_at DESC))[1] AS primary_version
FROM (
    SELECT *, candidate_error IS NULL AS ok FROM shadow_comparisons
    WHERE model = %(model)s AND candidate_version = %(candidate)s
      AND (%(since)s::timestamptz IS NULL OR compared_at >= %(since)s::timestamptz)
      AND (%(primary)s::text IS NULL OR primary_version = %(primary)s::text)
) AS c
"""


async def shadow_stats(
    pool: Pool,
    model: str,
    candidate: str,
    *,
    since: datetime | None = None,
    primary: str | None = None,
) -> ShadowStats:
    """The candidate's shadow comparison stats (all zero/None when it has none), optionally only
    since a time or against one primary."""
    params = {"model": model, "candidate": candidate, "since": since, "primary": primary}
    async with connection(pool) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_SHADOW_STATS, params)
        row = await cur.fetchone()
    if row is None:  # an aggregate without GROUP BY always returns one row
        raise LifecycleUnavailableError("the shadow stats query returned no row")
    return ShadowStats(
        model=model,
        candidate=candidate,
        samples=int(row["samples"]),
        rows=int(row["rows"]),
        agreement=_float(row["agreement"]),
        mean_abs_diff=_float(row["mean_abs_diff"]),
        mean_cosine=_float(row["mean_cosine"]),
        primary_p50_ms=_float(row["primary_p50_ms"]),
        primary_p99_ms=_float(row["primary_p99_ms"]),
        candidate_p50_ms=_float(row["candidate_p50_ms"]),
        candidate_p99_ms=_float(row["candidate_p99_ms"]),
        candidate_errors=int(row["candidate_errors"]),
        primary_version=row["primary_version"],
    )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
