"""Settings of the gateway's authentication (env prefix `TIDEGATE_AUTH_`, docs/security.md).

Authentication is on by default: a gateway started with no settings at all accepts tidegate's
own API keys (verified against PostgreSQL) and nothing else, and every route but health and
metrics answers 401 to an anonymous caller. JWT bearer tokens are accepted once an issuer, its
audience and its JWKS URL are set. `enabled=False` (what `tidegate gateway --insecure` sets)
turns all of it off: every caller then acts as the local admin `local:insecure`.

Nothing here is a secret: API key hashes live in PostgreSQL, and an issuer's JWKS is public.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from tidegate.core.settings import secure_url, settings_config

__all__ = ["FORBIDDEN_ALGORITHMS", "AuthSettings"]

FORBIDDEN_ALGORITHMS = ("none", "HS256", "HS384", "HS512")
"""Never accepted for bearer tokens: `none` is no signature at all, and an HMAC verified with a
public key lets anyone who has the public key (everyone) sign tokens."""

MAX_REVOCATION_S = 3.0
"""The longest `revocation_s`: a revoked key must be refused on every replica within 5 s, and
a replica notices at its next re-check of the key, at most `revocation_s` after the last."""


class AuthSettings(BaseSettings):
    """Who may call the gateway (env prefix `TIDEGATE_AUTH_`)."""

    model_config = settings_config("TIDEGATE_AUTH_")

    enabled: bool = Field(
        True,
        description="Authenticate and authorize every call. Off (`tidegate gateway --insecure`) "
        "every caller acts as the local admin `local:insecure`: for local experiments only.",
    )
    api_keys: bool = Field(
        True,
        description="Accept API keys issued by `tidegate auth keys create` (`Authorization: "
        "Bearer tg_...`), verified against PostgreSQL (TIDEGATE_POSTGRES_*).",
    )
    revocation_s: float = Field(
        2.0,
        gt=0,
        le=MAX_REVOCATION_S,
        description="How long a verified API key is trusted before this replica reads its row "
        "again: a revoked or expired key is refused at most this long (plus one database read) "
        "after the change, on every replica.",
    )
    cache_size: int = Field(
        10_000,
        ge=1,
        description="Verified keys and tokens (and refused ones) remembered per replica.",
    )
    checked_s: float = Field(
        3600.0,
        gt=0,
        description="How long this replica remembers that argon2 accepted a presented API key: "
        "within it, a key that was idle, or pushed out of the trust cache, is trusted again "
        "after one row read of its revocation, with no argon2 check (a changed hash is checked "
        "again).",
    )
    verifications_per_client: int = Field(
        20,
        ge=1,
        description="Verifications of keys or tokens that no cache of this replica answers "
        "(a database read and an argon2 check, or a signature check) one client address may "
        "start per second; past it, 429 with Retry-After. Keys and tokens in use are answered "
        "from the cache and never counted. Behind a proxy every client shares its address.",
    )
    open_health: bool = Field(
        True, description="/v2/health/live and /ready answer without credentials."
    )
    open_metrics: bool = Field(True, description="/metrics answers without credentials.")
    jwt_issuer: str | None = Field(
        None, description="The OIDC issuer whose tokens are accepted (the `iss` claim)."
    )
    jwt_audience: str | None = Field(
        None, description="The audience a token must name (the `aud` claim): this gateway."
    )
    jwt_jwks_url: str | None = Field(
        None,
        description="The issuer's JWKS URL. Keys are cached; a token signed with a key id not "
        "in the cache fetches the set again (key rotation), at most every "
        "`jwt_jwks_min_refresh_s`.",
    )
    jwt_jwks_cache_s: float = Field(
        300.0, gt=0, description="How long the fetched key set is used before it is fetched again."
    )
    jwt_jwks_min_refresh_s: float = Field(
        5.0,
        ge=0,
        description="Least time between two fetches for an unknown key id, so tokens naming "
        "made-up key ids cannot make the gateway hammer the issuer.",
    )
    jwt_leeway_s: float = Field(
        30.0, ge=0, le=300, description="Clock skew allowed on `exp`, `nbf` and `iat`."
    )
    jwt_algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"],
        description="Signature algorithms accepted (a JSON list in the environment); `none` "
        "and HS* are refused.",
    )
    jwt_roles_claim: str = Field(
        "roles",
        description="The claim listing the caller's tidegate roles (infer, deploy, admin), as "
        "a list or a space-separated string; other roles in it are ignored.",
    )
    jwt_models_claim: str | None = Field(
        None,
        description="A claim naming the models the roles are scoped to (absent: all models).",
    )
    jwt_tenant_claim: str = Field(
        "tenant",
        description="The claim naming the tenant the caller acts for; a token with it makes "
        "every call that tenant's (another `tenant` parameter is refused, 403).",
    )
    jwt_routing_key_claim: str = Field(
        "routing_key",
        description="The claim naming the routing key of every call the token makes (sticky "
        "routing and per-key order); another `routing_key` parameter is refused, 403.",
    )
    jwt_cache_s: float = Field(
        60.0,
        gt=0,
        description="How long a verified token is remembered (never past its `exp`).",
    )

    @field_validator("jwt_jwks_url")
    @classmethod
    def _secure_jwks(cls, value: str | None) -> str | None:
        # The keys every token is checked against: fetched over TLS (or from this host only).
        return None if value is None else secure_url(value, "jwt_jwks_url")

    @field_validator("jwt_algorithms")
    @classmethod
    def _safe_algorithms(cls, value: list[str]) -> list[str]:
        bad = [a for a in value if a.lower() in {f.lower() for f in FORBIDDEN_ALGORITHMS}]
        if bad or not value:
            raise ValueError(f"refused JWT algorithms {bad}; allowed are asymmetric ones only")
        return value

    @model_validator(mode="after")
    def _jwt_complete(self) -> AuthSettings:
        given = [self.jwt_issuer, self.jwt_audience, self.jwt_jwks_url]
        if any(given) and not all(given):
            raise ValueError("JWT needs jwt_issuer, jwt_audience and jwt_jwks_url together")
        return self

    @property
    def jwt_enabled(self) -> bool:
        return self.jwt_jwks_url is not None
