"""Rows written straight into the lineage tables, and read back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

__all__ = ["Pool", "compared", "request_ids", "served", "served_many"]


Pool = AsyncConnectionPool[Any]


async def served(pool: Pool, request_id: str, completed_at: datetime) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO served_requests (request_id, model, version, status, completed_at) "
            "VALUES (%s, 'fraud', '1', 'OK', %s)",
            (request_id, completed_at),
        )


def served_many(conninfo: str, model: str, count: int, seconds_ago: float = 0.0) -> None:
    """`count` results of `model` version 1, indexed as completed `seconds_ago`."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO served_requests (request_id, model, version, status, completed_at)"
            " SELECT %s || n, %s, '1', 'OK', now() - make_interval(secs => %s)"
            " FROM generate_series(1, %s) AS n",
            (f"{model}-{seconds_ago}-", model, seconds_ago, count),
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
