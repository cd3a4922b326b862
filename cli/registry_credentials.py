"""`tidegate stack registry-credentials FILE`: the credentials this stack's processes present to
its schema registry, which authenticates every caller (docs/security.md).

An API key that may read and register schemas (role `deploy`), created straight in PostgreSQL
(migrated first), as `tidegate auth keys create local-registry-client --role deploy` would, but
without its audit entry: the audit trail is written through the registry this key is for. FILE
(mode 600) then holds TIDEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER and _PASSWORD, the key's id and
secret, which `SchemaRegistrySettings` reads for a registry on this host (or from
TIDEGATE_SCHEMA_REGISTRY_LOCAL_CREDENTIALS) when no credentials are set, as the local
PostgreSQL's password is. A FILE whose key is still active is kept. Run by `make up`
(infra/registry.sh) and docker-compose's `init`; nothing secret is printed.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tidegate.core.db import make_pool, migrate
from tidegate.core.settings import PostgresSettings, read_env_file
from tidegate.gateway.api_keys import KeyStore
from tidegate.gateway.identity import Grant
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["ensure_credentials"]

NAME = "local-registry-client"
PREFIX = "TIDEGATE_SCHEMA_REGISTRY_"


def ensure_credentials(path: Path, pg: PostgresSettings | None = None) -> str:
    """Keep `path`'s key if it is active, else make one and write it; says which."""
    pg = pg or PostgresSettings()
    migrate(pg)
    return asyncio.run(_ensure(path, pg))


async def _ensure(path: Path, pg: PostgresSettings) -> str:
    pool = make_pool(pg, LifecycleSettings(pool_min_size=1, pool_max_size=1))
    await pool.open(wait=True, timeout=30)
    try:
        store = KeyStore(pool)
        current = read_env_file(path, PREFIX).get("basic_auth_user")
        if current:
            found = await store.get(current)
            if found is not None and found.state() == "active":
                return f"kept (key {current})"
        issued = await store.create(NAME, (Grant("deploy"),), created_by="local:stack")
    finally:
        await pool.close()
    key_id = issued.record.id
    secret = issued.key.get_secret_value().removeprefix(f"tg_{key_id}_")
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_suffix(".tmp")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{PREFIX}BASIC_AUTH_USER={key_id}\n{PREFIX}BASIC_AUTH_PASSWORD={secret}\n")
    written.replace(path)
    return f"created (key {key_id})"
