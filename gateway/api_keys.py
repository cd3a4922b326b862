"""The API keys tidegate issues, and their rows in PostgreSQL (infra/migrations/0007_api_keys.sql).

A key reads `tg_<id>_<secret>`: the id names the key (in `tidegate auth keys list`, in the audit
trail, as the identity `key:<id>`) and is not secret; the secret is 256 random bits. Only an
argon2id hash of the secret is stored (argon2-cffi's `PasswordHasher`, its RFC 9106 defaults),
so the table is no use to whoever reads it, and the key itself is shown once, when created.
Checking a presented key against its hash is slow on purpose; `tidegate.gateway.key_verifier`
does it once per key and replica and caches the outcome.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from argon2 import PasswordHasher
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import SecretStr

from tidegate.core.db import connection
from tidegate.gateway.identity import Grant, Identity

__all__ = [
    "KEY_PREFIX",
    "IssuedKey",
    "KeyRecord",
    "KeyStore",
    "grants_from_json",
    "grants_to_json",
    "new_key",
    "parse_key",
]

KEY_PREFIX = "tg_"
_KEY = re.compile(r"^tg_([a-z0-9]{8,32})_([A-Za-z0-9_-]{20,128})$")
_COLUMNS = (
    "id, name, secret_hash, grants, rate_per_s, created_at, created_by, expires_at, revoked_at, "
    "revoked_by"
)


def new_key() -> tuple[str, SecretStr]:
    """A fresh key id and the whole key (`tg_<id>_<secret>`), the latter to show once."""
    key_id = secrets.token_hex(8)
    return key_id, SecretStr(f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}")


def parse_key(presented: str) -> tuple[str, str] | None:
    """The id and secret of a well-formed key; None for anything else (never an error that
    would echo what was presented)."""
    match = _KEY.match(presented)
    return (match.group(1), match.group(2)) if match else None


def grants_to_json(grants: tuple[Grant, ...]) -> str:
    return json.dumps(
        [{"role": g.role, "models": sorted(g.models) if g.models else None} for g in grants]
    )


def grants_from_json(raw: Any) -> tuple[Grant, ...]:
    items = json.loads(raw) if isinstance(raw, str | bytes) else raw
    return tuple(
        Grant(item["role"], frozenset(item["models"]) if item.get("models") else None)
        for item in items
    )


@dataclass(frozen=True)
class KeyRecord:
    """One key's row. `secret_hash` never leaves the gateway or the CLI process."""

    id: str
    name: str
    secret_hash: str
    grants: tuple[Grant, ...]
    rate_per_s: float | None
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None

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
        )

    def state(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def view(self, now: datetime) -> dict[str, Any]:
        """What `tidegate auth keys list --json` shows: everything but the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state(now),
            "grants": json.loads(grants_to_json(self.grants)),
            "rate_per_s": self.rate_per_s,
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
    ) -> IssuedKey:
        if not grants:
            raise ValueError("a key needs at least one role")
        key_id, key = new_key()
        parsed = parse_key(key.get_secret_value())
        assert parsed is not None  # noqa: S101 - new_key writes what parse_key reads
        secret_hash = self.hasher.hash(parsed[1])
        async with connection(self.pool) as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                f"INSERT INTO api_keys (id, name, secret_hash, grants, rate_per_s, created_by,"  # noqa: S608
                f" expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
                (key_id, name, secret_hash, grants_to_json(grants), rate_per_s, created_by,
                 expires_at),
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

    async def expire(self, key_id: str, at: datetime) -> KeyRecord | None:
        """Make a key expire at `at` (now, or later than planned, or sooner); None if there is
        no such key. A revoked key stays revoked."""
        async with connection(self.pool) as conn:
            await conn.execute(
                "UPDATE api_keys SET expires_at = greatest(%s, created_at + interval '1 ms')"
                " WHERE id = %s",
                (at, key_id),
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
