"""Queries over the indexed lineage: who served a request, and how a shadow candidate compares.

Both read the tables the indexer fills (`core/migrations/0003_lineage.sql`, with the sources,
redeliveries and request id conflicts of `0005_lineage_sources.sql`). Shadow stats are
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

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.errors import LifecycleUnavailableError

__all__ = [
    "Position",
    "RequestIdConflict",
    "ServedRecord",
    "ShadowStats",
    "served",
    "shadow_stats",
]

Pool = AsyncConnectionPool[Any]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a Kafka record was read: the SourcePosition of the result schema."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class RequestIdConflict:
    """Another result under the same request id, for a request with other content."""

    digest: str
    first_digest: str
    """The served row's digest when the conflict was detected."""
    model: str
    version: str | None
    status: str
    worker_id: str
    source: Position | None
    completed_at: datetime
    detected_at: datetime


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
    source: Position | None = None
    """Where the request of this result was read (the retry or dead-letter topic's position
    when it was redelivered); None for results indexed before sources were recorded."""
    request_schema_id: int | None = None
    request_digest: str | None = None
    attempt: int = 1
    origin: Position | None = None
    """Where the request was first read, when the result comes from a redelivery."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """The Redelivery steps that led to this result, oldest first: kind (retry, redrive,
    replay), at (ISO 8601), from (a position or None), id (the run) and reason."""
    conflicts: list[RequestIdConflict] = field(default_factory=list)
    """Results of other content under the same request id: not served, only recorded."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["completed_at"] = self.completed_at.isoformat()
        for conflict in data["conflicts"]:
            conflict["completed_at"] = conflict["completed_at"].isoformat()
            conflict["detected_at"] = conflict["detected_at"].isoformat()
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


_SERVED = """
SELECT request_id, model, version, status, worker_id, routing_rule, tenant, routing_key,
       completed_at, total_ms, error_code, source_topic, source_partition, source_offset,
       request_schema_id, request_digest, attempt, origin_topic, origin_partition, origin_offset,
       history
FROM served_requests WHERE request_id = %s
"""

_CONFLICTS = """
SELECT digest, first_digest, model, version, status, worker_id, source_topic, source_partition,
       source_offset, completed_at, detected_at
FROM request_id_conflicts WHERE request_id = %s ORDER BY detected_at, digest
"""


async def served(pool: Pool, request_id: str) -> ServedRecord | None:
    """Which version served the request, when, on which worker and why, where it was read and
    how it got there (its redeliveries), and any other content seen under its id; None if not
    indexed."""
    async with connection(pool) as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_SERVED, (request_id,))
        row = await cur.fetchone()
        if row is None:
            return None
        await cur.execute(_CONFLICTS, (request_id,))
        conflicts = [_conflict(c) for c in await cur.fetchall()]
    source, origin = _position(row, "source"), _position(row, "origin")
    return ServedRecord(**row, source=source, origin=origin, conflicts=conflicts)


def _conflict(row: dict[str, Any]) -> RequestIdConflict:
    source = _position(row, "source")
    return RequestIdConflict(**row, source=source)


def _position(row: dict[str, Any], prefix: str) -> Position | None:
    """The position in a row's `<prefix>_topic/_partition/_offset` columns, which it pops."""
    topic = row.pop(f"{prefix}_topic")
    partition = row.pop(f"{prefix}_partition")
    offset = row.pop(f"{prefix}_offset")
    if topic is None or partition is None or offset is None:
        return None
    return Position(topic, int(partition), int(offset))


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
