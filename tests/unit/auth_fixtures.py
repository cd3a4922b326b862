"""Shared by the authentication tests: API keys in memory, and an OIDC issuer of the test's own.

`MemoryKeyStore` is the `api_keys` table in a dict, counting reads; `db_now` is the database's
clock, which (as in PostgreSQL) alone decides expiries and writes revocations. `Issuer` holds
RSA keys made with `cryptography`, signs tokens with PyJWT and serves its JWKS from a local
`http.server` thread, so the gateway's verifier fetches it over HTTP as it would from a real
issuer; `rotate` adds a key with a new id.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from argon2 import PasswordHasher
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from tidegate.gateway.auth.api_keys import (
    IssuedKey,
    KeyRecord,
    KeyStore,
    issue,
)
from tidegate.gateway.auth.identity import Grant

# argon2 at its cheapest: the tests check behaviour, not the cost parameters.
FAST_HASHER = PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)
ISSUER = "https://issuer.test"
AUDIENCE = "tidegate-test"


class MemoryKeyStore(KeyStore):
    def __init__(self) -> None:  # no pool: the table is a dict
        self.hasher = FAST_HASHER
        self.rows: dict[str, KeyRecord] = {}
        self.reads = 0
        self.db_now: Callable[[], datetime] = lambda: datetime.now(UTC)

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
        record = KeyRecord(
            key_id, name, secret_hash, grants, rate_per_s, tenant,
            self.db_now(), created_by, expires_at, None, None, routing_key=routing_key,
        )  # fmt: skip
        self.rows[key_id] = record
        return IssuedKey(self._read(record), key)

    def _read(self, record: KeyRecord) -> KeyRecord:
        """The row as a SELECT returns it: `expires_in_s` by the database's clock."""
        if record.expires_at is None:
            return record
        return replace(record, expires_in_s=(record.expires_at - self.db_now()).total_seconds())

    async def get(self, key_id: str) -> KeyRecord | None:
        self.reads += 1
        found = self.rows.get(key_id)
        return self._read(found) if found is not None else None

    async def list(self, *, include_inactive: bool = True) -> list[KeyRecord]:
        rows = [self._read(r) for r in self.rows.values()]
        return rows if include_inactive else [r for r in rows if r.state() == "active"]

    async def expire(self, key_id: str, at: datetime | timedelta | None = None) -> KeyRecord | None:
        found = self.rows.get(key_id)
        if found is None:
            return None
        now = self.db_now()
        when = now if at is None else now + at if isinstance(at, timedelta) else at
        when = max(when, found.created_at + timedelta(milliseconds=1))
        self.rows[key_id] = replace(found, expires_at=when)
        return self._read(self.rows[key_id])

    async def revoke(self, key_id: str, *, revoked_by: str) -> KeyRecord | None:
        found = self.rows.get(key_id)
        if found is not None and found.revoked_at is None:
            self.rows[key_id] = replace(found, revoked_at=self.db_now(), revoked_by=revoked_by)
        return self._read(self.rows[key_id]) if key_id in self.rows else None


def bearer(key: SecretStr | str) -> dict[str, str]:
    value = key.get_secret_value() if isinstance(key, SecretStr) else key
    return {"Authorization": f"Bearer {value}"}


class Issuer:
    """An OIDC issuer: RSA signing keys, tokens, and its JWKS served on a local port."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.published: list[str] = []
        self.fetches = 0
        self.rotate()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.fetches += 1
                body = json.dumps(issuer.jwks()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.jwks_url = f"http://127.0.0.1:{self._server.server_address[1]}/jwks.json"

    def rotate(self) -> str:
        """A new signing key with a new id, published next to the old ones."""
        kid = f"k{len(self.keys) + 1}"
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.published.append(kid)
        return kid

    def jwks(self) -> dict[str, Any]:
        out = []
        for kid in self.published:
            jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
            out.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": out}

    def token(
        self,
        *,
        kid: str | None = None,
        sub: str = "alice",
        roles: Any = ("infer",),
        expires_in: float = 300,
        key: rsa.RSAPrivateKey | None = None,
        **claims: Any,
    ) -> str:
        kid = kid or self.published[-1]
        now = time.time()
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": sub,
            "iat": int(now),
            "exp": int(now + expires_in),
            "roles": list(roles) if not isinstance(roles, str) else roles,
            **claims,
        }
        # A made-up kid is signed with the newest key: the header names a key the set lacks.
        signer = key or self.keys.get(kid) or self.keys[self.published[-1]]
        return jwt.encode(payload, signer, algorithm="RS256", headers={"kid": kid})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
