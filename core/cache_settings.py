"""Settings of the prediction cache, which the workers and the gateway share (env prefix
`TIDEGATE_CACHE_`): both must agree on which models are cached, the key prefix and the TTL, or
one would miss what the other stored."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings
from redis.asyncio import Redis

from tidegate.core.settings import RedisSettings, settings_config

__all__ = ["PredictionCacheSettings", "cache_redis"]


class PredictionCacheSettings(BaseSettings):
    """Prediction cache (env prefix `TIDEGATE_CACHE_`). Off unless `models` names a model."""

    model_config = settings_config("TIDEGATE_CACHE_")

    models: frozenset[str] = Field(
        frozenset(),
        description="Models whose answers are cached (JSON list). Opt-in, since only a "
        "deterministic model's answer may be served again; empty: the cache is off.",
    )
    ttl_s: float = Field(
        300.0, gt=0, le=7 * 86_400, description="How long an entry is served, in seconds."
    )
    max_entry_bytes: int = Field(
        65_536,
        ge=64,
        le=16 * 1024 * 1024,
        description="Answers whose outputs are larger are not stored: with the TTL, this bounds "
        "the memory the cache takes at a given request rate.",
    )
    key_prefix: str = Field(
        "tidegate:prediction:",
        min_length=1,
        description="Prefix of every entry's key; change it to drop every entry at once.",
    )
    redis_url: str | None = Field(
        None,
        description="A Redis of the cache's own (with `maxmemory` and `allkeys-lru`, see "
        "docs/prediction-cache.md); default: the one of `TIDEGATE_REDIS_`.",
    )
    redis_password: SecretStr | None = Field(None, description="Password of `redis_url`.")
    timeout_s: float = Field(
        0.25,
        gt=0,
        le=10,
        description="Socket timeout of the cache's Redis calls: a slow cache is skipped (the "
        "model computes), never waited for.",
    )

    @field_validator("redis_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("redis_url must start with redis://, rediss:// or unix://")
        return value

    def enabled(self, model: str) -> bool:
        return model in self.models


def cache_redis(settings: PredictionCacheSettings, redis: RedisSettings) -> Redis:
    """The cache's own client, with short timeouts (so it never shares a slow connection)."""
    url, secret = settings.redis_url, settings.redis_password
    if url is None:
        url, secret = redis.url, redis.password
    client: Redis = Redis.from_url(
        url,
        password=secret.get_secret_value() if secret else None,
        socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.timeout_s,
    )
    return client
