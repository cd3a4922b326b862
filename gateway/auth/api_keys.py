"""The API keys tidegate issues (`tg_<id>_<secret>`, `issue`) and their rows in PostgreSQL
(`KeyStore`, core/migrations/0007_api_keys.sql). Only an argon2id hash of the secret is stored.
Expiry is judged by the database's clock alone (`expires_in_s`), never a wall clock of ours.
The key format, hashing and time: docs/security.md ("API keys").
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from argon2 import PasswordHasher
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from tidegate.core.db import connection
from tidegate.gateway.auth.identity import Grant, Identity

__all__ = [
    "KEY_PREFIX",
    "IssuedKey",
    "KeyRecord",
    "KeyStore",
    "check_grants",
    "grants_from_json",
    "grants_to_json",
    "issue",
    "new_key",
    "parse_key",
]

KEY_PREFIX = "tg_"
_KEY = re.compile(r"^tg_([a-z0-9]{8,32})_([A-Za-z0-9_-]{20,128})$")
_COLUMNS = (
    "id, name, secret_hash, grants, rate_per_s, tenant, created_at, created_by, expires_at, "
    "revoked_at, revoked_by, extract(epoch FROM expires_at - now())::float8 AS expires_in_s, "
    "routing_key"
)


def new_key() -> tuple[str, SecretStr]:
    """A fresh key id and the whole key (`tg_<id>_<secret>`), the latter to show once."""
    key_id = secrets.token_hex(8)
    return key_id, SecretStr(f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def issue(hasher: PasswordHasher, grants: tuple[Grant, ...]) -> tuple[str, SecretStr, str]:
    """A new key for `grants` (checked): its id, the whole key, and the hash to store."""
    check_grants(grants)
    key_id, key = new_key()
    parsed = parse_key(key.get_secret_value())
    assert parsed is not None  # noqa: S101 - new_key writes what parse_key reads
    return key_id, key, hasher.hash(parsed[1])


def parse_key(presented: str) -> tuple[str, str] | None:
    """The id and secret of a well-formed key; None for anything else (never an error that
    would echo what was presented)."""
    match = _KEY.match(presented)
    return (match.group(1), match.group(2)) if match else None


def grants_to_json(grants: tuple[Grant, ...]) -> str:
    return json.dumps(
        [
            {"role": g.role, "models": sorted(g.models) if g.models is not None else None}
            for g in grants
        ]
    )


def grants_from_json(raw: Any) -> tuple[Grant, ...]:
    items = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return tuple(
        # An empty list is a grant over no model, never one over every model.
        Grant(item["role"], frozenset(item["models"]) if item.get("models") is not None else None)
        for item in items
    )


def check_grants(grants: tuple[Grant, ...]) -> None:
    """Refuse what `KeyStore.create` must not store: no role, or a role scoped to no model."""
    if not grants:
        raise ValueError("a key needs at least one role")
    for grant in grants:
        if grant.models is not None and not grant.models:
            raise ValueError(f"the {grant.role!r} grant names no model; omit the scope for all")


@dataclass(frozen=True)
class KeyRecord:
    """One key's row. `secret_hash` never leaves the gateway or the CLI process."""

    id: str
    name: str
    secret_hash: str
    grants: tuple[Grant, ...]
    rate_per_s: float | None
    tenant: str | None
    """The tenant the key acts for; None: the caller's `tenant` parameter stands."""
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    expires_in_s: float | None = None
    """Seconds from the database's `now()`, when the row was read, to `expires_at` (<= 0:
    expired); None without an expiry, or for a record not read from the database."""
    routing_key: str | None = None
    """The routing key of every call the key makes; None: the caller's `routing_key` stands."""

    @property
    def subject(self) -> str:
        return f"key:{self.id}"

    def identity(self) -> Identity:
        return Identity(
            self.subject,
            "api-key",
            self.grants,
            rate_per_s=self.rate_per_s,
            labels={"key_name": self.name},
            tenant=self.tenant,
            routing_key=self.routing_key,
        )

    def state(self, now: datetime | None = None) -> str:
        """revoked, expired or active. The expiry goes by the database's clock when the row
        carries it (`expires_in_s`), and by `now` only for a record that does not."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_in_s is not None:
            return "expired" if self.expires_in_s <= 0 else "active"
        if self.expires_at is not None and now is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def view(self, now: datetime | None = None) -> dict[str, Any]:
        """What `tidegate auth keys list --json` shows: everything but the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state(now),
            "grants": json.loads(grants_to_json(self.grants)),
            "rate_per_s": self.rate_per_s,
            "tenant": self.tenant,
            "routing_key": self.routing_key,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "revoked_by": self.revoked_by,
        }


@dataclass(frozen=True)
class IssuedKey:
    """A key just created: its row, and the key itself, which is shown once and never again."""

    record: KeyRecord
    key: SecretStr


def _record(row: dict[str, Any]) -> KeyRecord:
    return KeyRecord(**{**row, "grants": grants_from_json(row["grants"])})


class KeyStore:
    """The `api_keys` table over a pool (`tidegate.core.db.make_pool`). A database that cannot be
    reached raises `LifecycleUnavailableError` (503), never a refusal."""

    def __init__(self, pool: AsyncConnectionPool[Any], hasher: PasswordHasher | None = None):
        self.pool = pool
        self.hasher = hasher or PasswordHasher()

    async def create(
        self,
        name: str,
        grants: tuple[Grant, ...],
        *,
        created_by: str,
        expires_at: datetime | None = None,
        rate_per_s: float | None = None,
        tenant: str | None = None,
        routing_key: str | None = None,
    ) -> IssuedKey:
        key_id, key, secret_hash = issue(self.hasher, grants)
        async with connection(self.pool) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"INSERT INTO api_keys (id, name, secret_hash, grants, rate_per_s, tenant,"  # noqa: S608
                f" routing_key, created_by, expires_at)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
                (key_id, name, secret_hash, grants_to_json(grants), rate_per_s, tenant,
                 routing_key, created_by, expires_at),
            )  # fmt: skip
            row = await cur.fetchone()
        assert row is not None  # noqa: S101 - INSERT ... RETURNING returns the row
        return IssuedKey(_record(row), key)

    async def get(self, key_id: str) -> KeyRecord | None:
        async with connection(self.pool) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE id = %s", (key_id,))  # noqa: S608
            row = await cur.fetchone()
        return _record(row) if row else None

    async def list(self, *, include_inactive: bool = True) -> list[KeyRecord]:
        where = "" if include_inactive else (
            " WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"
        )  # fmt: skip
        async with connection(self.pool) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"SELECT {_COLUMNS} FROM api_keys{where} ORDER BY created_at DESC, id"  # noqa: S608
            )
            rows = await cur.fetchall()
        return [_record(row) for row in rows]

    async def expire(self, key_id: str, at: datetime | timedelta | None = None) -> KeyRecord | None:
        """Make a key expire: at once (`at` None: the database's `now()`), `at` after the
        database's `now()` (a timedelta), or at the time `at`; later than planned or sooner.
        None if there is no such key. A revoked key stays revoked."""
        params: tuple[object, ...]
        if at is None:
            when, params = "now()", (key_id,)
        elif isinstance(at, timedelta):
            when, params = "now() + %s::interval", (at, key_id)
        else:
            when, params = "%s::timestamptz", (at, key_id)
        async with connection(self.pool) as conn:
            await conn.execute(
                f"UPDATE api_keys SET expires_at = greatest({when}, created_at + interval '1 ms')"  # noqa: S608
                " WHERE id = %s",
                params,
            )
        return await self.get(key_id)

    async def revoke(self, key_id: str, *, revoked_by: str) -> KeyRecord | None:
        """Revoke a key (a second revoke keeps the first time); None if there is no such key."""
        async with connection(self.pool) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "UPDATE api_keys SET revoked_at = now(), revoked_by = %s"
                " WHERE id = %s AND revoked_at IS NULL",
                (revoked_by, key_id),
            )
        return await self.get(key_id)
