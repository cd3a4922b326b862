"""Settings of the gateway's rate limits (docs/rate-limits.md).

Nothing is limited until a rate is configured (here, or on an API key): a call that no rate
applies to is answered without touching Redis, so a gateway that limits nothing keeps its
Redis-free hot path (decision 009).
Rates are requests per second; `burst_s` says how many seconds' worth a caller may spend at once,
which is the window the `limits` library counts over (whole seconds, so at least 1).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config
from tidegate.gateway.auth.identity import ROLE_PERMISSIONS

__all__ = ["RateLimitSettings"]


class RateLimitSettings(BaseSettings):
    """Per-client and per-model rate limits, shared by every gateway replica through Redis (env
    prefix `TIDEGATE_RATE_LIMIT_`; the dictionaries are JSON, e.g. `'{"fraud": 500}'`)."""

    model_config = settings_config("TIDEGATE_RATE_LIMIT_")

    enabled: bool = Field(
        True,
        description="Apply the configured limits (false: none, not even a key's own rate). "
        "Only limits with a rate are applied; a call no rate applies to touches no Redis.",
    )
    client_rate_per_s: float | None = Field(
        None,
        gt=0,
        description="Default per-client limit, requests per second (None: clients are not "
        "limited unless their key or role has a rate). A client is the identity's subject: "
        "one API key, one token subject; anonymous callers by their address.",
    )
    role_rates: dict[str, float] = Field(
        default_factory=dict,
        description="Per-client rate by role, overriding the default: a caller gets the rate "
        "of its highest role that has one (admin over deploy over infer). A key's own rate "
        "(`rate_per_s` of its identity) overrides both.",
    )
    model_rates: dict[str, float] = Field(
        default_factory=dict,
        description="Per-model limit, requests per second summed over every client and "
        "replica; models not named are not limited.",
    )
    burst_s: int = Field(
        1,
        ge=1,
        le=3600,
        description="Seconds' worth of requests a caller may send at once after being idle: "
        "every limit allows rate x burst_s requests per sliding window of burst_s seconds.",
    )
    lot_percent: float = Field(
        2.0,
        ge=0,
        le=10,
        description="Share of a limit's window a replica takes from Redis in one round trip and "
        "then spends locally (at least one slot; 0: one call per round trip). A replica whose "
        "own traffic on a limit is below this share per window wastes part of its lots: with "
        "more than 100 / lot_percent replicas sharing a limit evenly, lower it.",
    )
    key_prefix: str = Field(
        "tidegate:rate", min_length=1, description="Prefix of the limiter's keys in Redis."
    )
    on_redis_error: Literal["allow", "deny"] = Field(
        "allow",
        description="When Redis cannot be reached: `allow` (fail open: the call is served, a "
        "WARNING is logged and tidegate_gateway_rate_limit_errors_total counts it) or `deny` "
        "(503 with Retry-After, for deployments where an unlimited caller costs more than an "
        "outage).",
    )
    redis_timeout_s: float = Field(
        0.5,
        gt=0,
        le=5,
        description="Socket timeout of the limiter's Redis calls: the most a hung Redis adds "
        "to the calls in flight when it hangs (the limiter then stands down). It runs on the "
        "event loop's clock, so a busy replica's loop lag counts against it: much lower and "
        "a loaded replica reads its own lag as an outage.",
    )
    outage_backoff_s: float = Field(
        5.0,
        ge=0,
        description="After a Redis failure, how long the limiter stands down (applying "
        "`on_redis_error` without asking Redis) before it tries again, so an outage costs each "
        "call nothing rather than a timeout.",
    )

    @field_validator("role_rates")
    @classmethod
    def _known_roles(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(ROLE_PERMISSIONS))
        if unknown:
            raise ValueError(f"unknown roles {unknown}; roles: {sorted(ROLE_PERMISSIONS)}")
        return cls._positive(value)

    @field_validator("model_rates")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, rate in value.items() if not rate > 0)
        if bad:
            raise ValueError(f"rates must be > 0: {bad}")
        return value
