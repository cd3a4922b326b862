"""The API key the benchmarks call the gateway with: the gateway authenticates every call, and
`make bench` measures it as deployed, with authentication on (docs/security.md). The key may
only infer and expires after a day; it is created straight in PostgreSQL (migrated first), as
`tidegate auth keys create` would."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from tidegate.core.db import make_pool, migrate
from tidegate.core.settings import PostgresSettings
from tidegate.gateway.auth.api_keys import KeyStore
from tidegate.gateway.auth.identity import Grant
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["infer_headers"]


def infer_headers() -> dict[str, str]:
    """`Authorization` for a fresh `infer` key."""
    pg = PostgresSettings()
    migrate(pg)

    async def create() -> str:
        pool = make_pool(pg, LifecycleSettings(pool_min_size=1, pool_max_size=1))
        await pool.open(wait=True, timeout=15)
        try:
            issued = await KeyStore(pool).create(
                "bench",
                (Grant("infer"),),
                created_by="local:bench",
                expires_at=datetime.now(UTC) + timedelta(days=1),
            )
        finally:
            await pool.close()
        return issued.key.get_secret_value()

    return {"Authorization": f"Bearer {asyncio.run(create())}"}
