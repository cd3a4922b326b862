"""PostgreSQL access: the connection pool, migrations, and the one place DB errors are mapped.

Every connection's search path starts with `PostgresSettings.db_schema` (see `conninfo()`), and
`migrate` applies the package's migrations (core/migrations, shipped as package data) into that
schema, so a test run gets a database of its own with one setting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from pathlib import Path
from typing import Protocol

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool
from yoyo import get_backend, read_migrations

from tidegate.core.errors import ConfigurationError, LifecycleUnavailableError
from tidegate.core.settings import PostgresSettings

__all__ = [
    "MIGRATIONS_DIR",
    "POOL_TIMEOUT_S",
    "PoolSizing",
    "connection",
    "make_pool",
    "migrate",
]


def _migrations_dir() -> Path:
    """The migrations shipped in the package (`tidegate.core`'s data), wherever it is installed.

    yoyo reads a folder, so an install must have real files: a zipped one would not."""
    found = files("tidegate.core") / "migrations"
    if not isinstance(found, Path) or not found.is_dir():
        raise ConfigurationError(f"tidegate's migrations are not a folder on disk: {found}")
    return found


MIGRATIONS_DIR = _migrations_dir()

POOL_TIMEOUT_S = 10.0
"""How long a caller waits for a pooled connection before the store counts as unavailable."""


class PoolSizing(Protocol):
    """How many connections a component's pool keeps: its own settings say (the lifecycle's
    `TIDEGATE_LIFECYCLE_POOL_*`), so the ground layer needs no component's settings class."""

    @property
    def pool_min_size(self) -> int: ...

    @property
    def pool_max_size(self) -> int: ...


def make_pool(pg: PostgresSettings, lc: PoolSizing) -> AsyncConnectionPool:
    """A pool of autocommit connections (transactions are always explicit), not yet open.

    `check` tests a connection as it leaves the pool, so a restarted server costs one failed
    ping rather than one failed command.
    """
    return AsyncConnectionPool(
        pg.conninfo(),
        min_size=lc.pool_min_size,
        max_size=max(lc.pool_max_size, lc.pool_min_size),
        kwargs={"autocommit": True},
        open=False,
        name=f"tidegate-{pg.db_schema}",
        timeout=POOL_TIMEOUT_S,
        check=AsyncConnectionPool.check_connection,
    )


def migrate(pg: PostgresSettings, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Create `db_schema` if needed and apply the pending migrations into it; returns their ids.

    Idempotent. yoyo keeps its bookkeeping tables in the same schema, so each schema is
    migrated independently of the others.
    """
    with psycopg.connect(pg.conninfo(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(pg.db_schema)))
    migrations = read_migrations(str(directory))
    with get_backend(f"{pg.url()}?schema={pg.db_schema}") as backend, backend.lock():
        pending = backend.to_apply(migrations)
        backend.apply_migrations(pending)
        return [str(m.id) for m in pending]


@asynccontextmanager
async def connection(pool: AsyncConnectionPool) -> AsyncIterator[psycopg.AsyncConnection]:
    """A pooled connection; an unreachable server becomes `LifecycleUnavailableError`.

    psycopg's OperationalError covers lost connections, pool timeouts (PoolTimeout is one),
    shutdowns and lock timeouts: everything a caller can only retry later.
    """
    try:
        async with pool.connection() as conn:
            yield conn
    except psycopg.OperationalError as exc:
        raise LifecycleUnavailableError(f"the event store is unavailable: {exc}") from exc
