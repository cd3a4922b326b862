"""Expiring the lineage tables: `served_requests` and `shadow_comparisons` keep a retention window.

Both grow by a row per request (and per shadowed request) for as long as the controller runs.
The pruner deletes what is older than the retention, oldest first (along the time indexes of
migration 0004, even on a table that was never pruned), in batches of `batch_size` rows, each in
a transaction of its own: the indexer's inserts never wait behind one long delete, and a pruner
stopped halfway has deleted whole batches only. Rows are aged by when the request completed (or
was compared), not when they were indexed, so a backlog indexed late expires on the same day as
the rest of its traffic.

What expires: `tidegate served` no longer knows those requests, and `models compare` (with the
`promote` gate) no longer counts those comparisons. The events, and so the lifecycle's history
and lineage, are never pruned.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import Counter
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tidegate.core.aio import Periodic
from tidegate.core.db import connection
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["AGED_BY", "LineagePruner", "lineage_pruner", "prune"]

_log = logging.getLogger(__name__)

AGED_BY = {"served_requests": "completed_at", "shadow_comparisons": "compared_at"}
"""Each pruned table and the column its rows are aged by (indexed: migration 0004)."""

_PRUNED = Counter(
    "tidegate_lineage_pruned_rows_total", "Lineage rows deleted past the retention.", ["table"]
)


async def prune(
    pool: AsyncConnectionPool[Any], older_than: datetime, *, batch_size: int = 5000
) -> dict[str, int]:
    """Delete every lineage row aged before `older_than`; returns the count per table."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    counts: dict[str, int] = {}
    for table, column in AGED_BY.items():
        query = sql.SQL(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY("
            "SELECT ctid FROM {table} WHERE {column} < %s ORDER BY {column} LIMIT %s))"
        ).format(table=sql.Identifier(table), column=sql.Identifier(column))
        total = 0
        while True:
            async with connection(pool) as conn, conn.transaction():
                cur = await conn.execute(query, (older_than, batch_size))
                deleted = cur.rowcount
            total += deleted
            _PRUNED.labels(table).inc(deleted)
            if deleted < batch_size:
                break
        counts[table] = total
    return counts


class LineagePruner:
    """Prunes every `every_s` while started."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        retention: timedelta,
        *,
        every_s: float,
        batch_size: int = 5000,
    ) -> None:
        if retention <= timedelta(0):
            raise ValueError("retention must be positive")
        self.pool = pool
        self.retention = retention
        self._batch_size = batch_size
        self._passes = Periodic(self.prune_now, every_s, name="lineage-pruner")

    def start(self) -> None:
        """Prune at once, then every `every_s` until `stop()`; a failed pass is logged and
        tried again next time."""
        self._passes.start()

    async def stop(self) -> None:
        await self._passes.stop()

    async def prune_now(self) -> dict[str, int]:
        counts = await prune(
            self.pool, datetime.now(UTC) - self.retention, batch_size=self._batch_size
        )
        if any(counts.values()):
            _log.info("lineage rows past the retention deleted: %s", counts)
        return counts


def lineage_pruner(
    pool: AsyncConnectionPool[Any], settings: LifecycleSettings, *, min_retention_s: float
) -> LineagePruner | None:
    """The controller's pruner, None when the retention is 0 (keep forever). The retention is
    raised to `min_retention_s` (the canary windows' horizon: an instance taking over seeds its
    windows from these rows)."""
    days = settings.lineage_retention_days
    if not days:
        return None
    retention = max(timedelta(days=days), timedelta(seconds=min_retention_s))
    return LineagePruner(pool, retention, every_s=settings.lineage_prune_every_s)
