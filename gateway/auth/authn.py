"""Who is calling: `Authenticator` turns a request's `Authorization` header into an `Identity`
(an API key, a JWT, HTTP Basic for the registry; anonymous without one; `INSECURE` when off).
Route tests not about authentication install `Authenticator.fixed(identity)` instead.
Which credential is which, and startup without PostgreSQL: docs/security.md ("Identities").
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from fastapi import FastAPI, Request
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import make_pool
from tidegate.core.errors import AuthenticationError
from tidegate.core.settings import PostgresSettings
from tidegate.gateway.auth.api_keys import KEY_PREFIX, KeyStore
from tidegate.gateway.auth.audit_hooks import client_address
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.identity import ANONYMOUS, Identity, grants_of
from tidegate.gateway.auth.jwt_verify import JwtVerifier
from tidegate.gateway.auth.key_verifier import KeyVerifier

__all__ = ["INSECURE", "Authenticator", "install_authenticator"]

_log = logging.getLogger(__name__)

INSECURE = Identity("local:insecure", "local", grants_of(["admin"]))
"""Every caller of a gateway started with `--insecure`."""

INSECURE_WARNING = (
    "AUTHENTICATION IS OFF (--insecure / TIDEGATE_AUTH_ENABLED=false): every caller of this "
    "gateway acts as the admin 'local:insecure'. Never expose it beyond your own machine."
)


@dataclass(frozen=True)
class _PoolSize:
    pool_min_size: int = 1
    pool_max_size: int = 4


class Authenticator:
    """Turns a request's credentials into an `Identity`. Use as an async context manager (the
    app's lifespan does) to open and close the key store's pool."""

    def __init__(
        self,
        settings: AuthSettings,
        *,
        keys: KeyVerifier | None = None,
        tokens: JwtVerifier | None = None,
        pool: AsyncConnectionPool[Any] | None = None,
        fixed: Identity | None = None,
        basic: bool = False,
    ) -> None:
        self.settings = settings
        self.basic = basic
        self.keys = keys
        self.tokens = tokens
        self._pool = pool
        self._fixed = fixed if fixed is not None else (None if settings.enabled else INSECURE)

    @classmethod
    def from_settings(
        cls, settings: AuthSettings, postgres: PostgresSettings, *, basic: bool = False
    ) -> Authenticator:
        """API keys from PostgreSQL when `api_keys`, JWTs when an issuer is set; HTTP Basic
        with `basic`. Nothing connects until the authenticator is entered."""
        if not settings.enabled:
            return cls(settings)
        keys = pool = None
        # One budget for both kinds: an address cannot double its share by mixing them.
        budget = ClientBudget(settings.verifications_per_client, "key and token verifications")
        if settings.api_keys:
            pool = make_pool(postgres, _PoolSize())
            keys = KeyVerifier(
                KeyStore(pool),
                ttl_s=settings.revocation_s,
                max_entries=settings.cache_size,
                checked_s=settings.checked_s,
                budget=budget,
            )
        tokens = JwtVerifier(settings, budget=budget) if settings.jwt_enabled else None
        return cls(settings, keys=keys, tokens=tokens, pool=pool, basic=basic)

    @classmethod
    def fixed(cls, identity: Identity, settings: AuthSettings | None = None) -> Authenticator:
        """Every call is `identity` (tests of routes that are not about authentication)."""
        return cls(settings or AuthSettings(), fixed=identity)

    @property
    def insecure(self) -> bool:
        return not self.settings.enabled

    def is_open(self, what: str) -> bool:
        """Whether the closable public route `what` (health, metrics) needs no credentials."""
        if what == "health":
            return self.settings.open_health
        return self.settings.open_metrics

    async def __aenter__(self) -> Authenticator:
        if self.insecure:
            _log.warning(INSECURE_WARNING)
        if self._pool is not None:
            await self._pool.open(wait=False)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def authenticate(self, request: Request) -> Identity:
        """The caller's identity; `ANONYMOUS` without credentials. Raises
        `AuthenticationError` for credentials that do not hold (never echoing them), and
        `RateLimitedError` when its address started too many verifications no cache answered."""
        if self._fixed is not None:
            return self._fixed
        header = request.headers.get("authorization")
        if header is None:
            return ANONYMOUS
        scheme, _, credentials = header.partition(" ")
        scheme, credentials = scheme.lower(), credentials.strip()
        basic = self.basic and scheme == "basic"
        if not (basic or scheme == "bearer") or not credentials:
            raise AuthenticationError(
                "use an `Authorization: Bearer <API key or token>` header",
                "malformed Authorization header",
            )
        if basic:
            credentials = _basic_key(credentials)
        if credentials.startswith(KEY_PREFIX):
            if self.keys is None:
                raise AuthenticationError("API keys are not accepted here", "API keys off")
            return await self.keys.verify(credentials, client_address(request))
        if self.tokens is None:
            raise AuthenticationError(
                "bearer tokens are not accepted here; use an API key", "no JWT issuer configured"
            )
        return await self.tokens.verify(credentials, client_address(request))


def _basic_key(credentials: str) -> str:
    """The API key that Basic `user:password` names: `tg_<user>_<password>`, or the password
    itself when it is a whole key."""
    try:
        decoded = base64.b64decode(credentials, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError(
            "malformed Basic credentials", "malformed Authorization header"
        ) from None
    user, sep, password = decoded.partition(":")
    if not sep or not password:
        raise AuthenticationError("malformed Basic credentials", "malformed Authorization header")
    return password if password.startswith(KEY_PREFIX) else f"{KEY_PREFIX}{user}_{password}"


def install_authenticator(app: FastAPI, authenticator: Authenticator) -> Authenticator:
    """Make `authenticator` the one every route of `app` asks (its owner opens it, if needed)."""
    app.state.authenticator = authenticator
    return authenticator
