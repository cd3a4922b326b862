"""API keys in the stack's PostgreSQL for the registry tests: the registries they start verify
callers against the same table as the stack's own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.support import unique
from tidegate.core.db import make_pool
from tidegate.core.settings import PostgresSettings
from tidegate.gateway.auth.api_keys import KeyStore
from tidegate.gateway.auth.identity import Grant
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["basic_auth", "issue_key", "revoke_key"]


def _with_store(use: Callable[[KeyStore], Awaitable[str]]) -> str:
    async def run() -> str:
        settings = LifecycleSettings(pool_min_size=1, pool_max_size=1)
        pool = make_pool(PostgresSettings(), settings)
        await pool.open(wait=True, timeout=30)
        try:
            return await use(KeyStore(pool))
        finally:
            await pool.close()

    return asyncio.run(run())


def issue_key(role: str) -> str:
    """A new key of `role` over every model."""

    async def create(store: KeyStore) -> str:
        issued = await store.create(unique("it-registry"), (Grant(role),), created_by="local:it")
        return issued.key.get_secret_value()

    return _with_store(create)


def revoke_key(key: str) -> None:
    async def revoke(store: KeyStore) -> str:
        await store.revoke(key.split("_")[1], revoked_by="local:it")
        return key

    _with_store(revoke)


def basic_auth(key: str) -> tuple[str, str]:
    """(user, password) of a key, as `basic.auth.user.info` carries it: its id and secret."""
    _, key_id, secret = key.split("_", 2)
    return key_id, secret
