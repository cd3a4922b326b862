"""Verifying JWT bearer tokens of an OIDC issuer against its JWKS, with PyJWT (`JwtVerifier`).
What is checked, key rotation and the token cache: docs/security.md ("JWT bearer tokens").
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import jwt

from tidegate.core.errors import AuthenticationError
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.identity import ROLE_PERMISSIONS, Grant, Identity

__all__ = ["JwtVerifier", "identity_from_claims"]

_INVALID = "invalid bearer token"


def _names(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return []


def identity_from_claims(claims: dict[str, Any], settings: AuthSettings) -> Identity:
    """The identity a verified token names: `jwt:<iss>/<sub>`, with the known roles of its roles
    claim (unknown ones are ignored), over the models of its models claim when one is set, for
    the tenant of its tenant claim and with the routing key of its routing key claim when it
    has them."""
    roles = [r for r in _names(claims.get(settings.jwt_roles_claim)) if r in ROLE_PERMISSIONS]
    models: frozenset[str] | None = None
    if settings.jwt_models_claim is not None and settings.jwt_models_claim in claims:
        models = frozenset(_names(claims[settings.jwt_models_claim]))
    grants = tuple(Grant(role, models) for role in sorted(set(roles)))
    tenant = claims.get(settings.jwt_tenant_claim)
    routing_key = claims.get(settings.jwt_routing_key_claim)
    return Identity(
        f"jwt:{claims['iss']}/{claims['sub']}",
        "jwt",
        grants,
        tenant=tenant if isinstance(tenant, str) and tenant else None,
        routing_key=routing_key if isinstance(routing_key, str) and routing_key else None,
    )


class JwtVerifier:
    """`verify(token)` returns the token's identity or raises `AuthenticationError`."""

    def __init__(
        self,
        settings: AuthSettings,
        *,
        jwks: jwt.PyJWKClient | None = None,
        budget: ClientBudget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if settings.jwt_jwks_url is None:
            raise ValueError("JWT verification needs TIDEGATE_AUTH_JWT_JWKS_URL")
        self.settings = settings
        self._jwks = jwks or jwt.PyJWKClient(
            settings.jwt_jwks_url,
            cache_jwk_set=True,
            lifespan=settings.jwt_jwks_cache_s,
            timeout=10,
            cooldown_duration=settings.jwt_jwks_min_refresh_s,
        )
        self._budget = budget
        self._clock = clock
        self._wall = time.time
        self._cache: dict[bytes, tuple[float, Identity | None, str]] = {}

    async def verify(self, token: str, client: str | None = None) -> Identity:
        """`client`: the caller's address, charged one unit of the budget when the cache does
        not answer (`RateLimitedError` past it)."""
        digest = hashlib.sha256(token.encode()).digest()
        entry = self._cache.get(digest)
        if entry is not None and entry[0] > self._clock():
            if entry[1] is None:
                raise AuthenticationError(_INVALID, entry[2])
            return entry[1]
        if self._budget is not None:
            self._budget.take(client)
        try:
            claims = await asyncio.to_thread(self._decode, token)
        except AuthenticationError as exc:
            self._remember(digest, self._clock() + self.settings.revocation_s, None, exc.reason)
            raise
        identity = identity_from_claims(claims, self.settings)
        left = float(claims["exp"]) - self._wall()
        until = self._clock() + min(max(left, 0.0), self.settings.jwt_cache_s)
        self._remember(digest, until, identity, "")
        return identity

    def _decode(self, token: str) -> dict[str, Any]:
        settings = self.settings
        try:
            # PyJWT refetches the set for an unknown kid, at most once per cooldown.
            key = self._jwks.get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=settings.jwt_algorithms,
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                leeway=settings.jwt_leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("the bearer token has expired", "token expired") from None
        except jwt.PyJWKClientConnectionError as exc:
            raise AuthenticationError(_INVALID, f"JWKS unreachable: {exc}") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(_INVALID, f"token refused: {type(exc).__name__}") from None
        return claims

    def _remember(self, digest: bytes, until: float, identity: Identity | None, why: str) -> None:
        cache = self._cache
        if len(cache) >= self.settings.cache_size:
            now = self._clock()
            for stale in [d for d, e in cache.items() if e[0] <= now]:
                del cache[stale]
            while len(cache) >= self.settings.cache_size:
                del cache[next(iter(cache))]
        cache[digest] = (until, identity, why)
