"""Lineage rows past their retention are deleted (the running controller: test_controller)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from tidegate.lifecycle.control.retention import prune

Pool = AsyncConnectionPool[Any]


async def served(pool: Pool, request_id: str, completed_at: datetime) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO served_requests (request_id, model, version, status, completed_at) "
            "VALUES (%s, 'fraud', '1', 'OK', %s)",
            (request_id, completed_at),
        )


async def compared(pool: Pool, request_id: str, compared_at: datetime) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO shadow_comparisons (model, candidate_version, request_id, "
            "primary_version, kind, rows, compared_at) "
            "VALUES ('fraud', '2', %s, '1', 'classifier', 1, %s)",
            (request_id, compared_at),
        )


async def request_ids(pool: Pool, table: str) -> set[str]:
    async with pool.connection() as conn:
        cur = await conn.execute(f"SELECT request_id FROM {table}")  # noqa: S608 - test tables
        return {str(row[0]) for row in await cur.fetchall()}


async def test_prune_deletes_only_rows_past_the_cutoff_in_batches(pg_pool: Pool) -> None:
    now = datetime.now(UTC)
    for i in range(5):
        await served(pg_pool, f"old-{i}", now - timedelta(days=40))
        await compared(pg_pool, f"old-{i}", now - timedelta(days=40))
    await served(pg_pool, "recent", now - timedelta(days=1))
    await compared(pg_pool, "recent", now - timedelta(days=1))

    counts = await prune(pg_pool, now - timedelta(days=30), batch_size=2)

    assert counts == {"served_requests": 5, "shadow_comparisons": 5}
    assert await request_ids(pg_pool, "served_requests") == {"recent"}
    assert await request_ids(pg_pool, "shadow_comparisons") == {"recent"}
    assert await prune(pg_pool, now - timedelta(days=30)) == {
        "served_requests": 0,
        "shadow_comparisons": 0,
    }
