"""A PostgreSQL schema of a benchmark run's own, migrated, and dropped afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql

from tests.support import unique
from tidegate.core.db import migrate
from tidegate.core.settings import PostgresSettings

__all__ = ["scratch_schema"]


@contextlib.contextmanager
def scratch_schema(prefix: str) -> Iterator[PostgresSettings]:
    pg = PostgresSettings(db_schema=unique(prefix).replace("-", "_"))
    migrate(pg)
    try:
        yield pg
    finally:
        with psycopg.connect(pg.conninfo(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(pg.db_schema))
            )
