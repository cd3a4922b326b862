"""Rate limits per client and per model, shared by every gateway replica through Redis
(`RateLimiter`, the `limits` library's sliding window counter), with slots taken in lots and
refusals remembered so that most calls never reach Redis.
The algorithm, its costs and Redis outages: docs/rate-limits.md ("The algorithm", "When Redis
is down").
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, TypeVar

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.aio.storage import RedisStorage, Storage
from limits.aio.strategies import SlidingWindowCounterRateLimiter
from limits.errors import StorageError
from prometheus_client import Counter
from redis.asyncio import ConnectionPool
from redis.exceptions import RedisError

from tidegate.core.errors import OverloadedError, RateLimitedError
from tidegate.core.settings import RedisSettings
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.auth.identity import ROLE_PERMISSIONS, Identity

__all__ = ["RATE_LIMITED", "RATE_LIMIT_ERRORS", "RateLimiter"]

_MAX_WINDOW_S = 3600
_TOLERANCE = 0.05

_log = logging.getLogger(__name__)

RATE_LIMITED = Counter(
    "tidegate_gateway_rate_limited_total",
    "Calls refused with 429, by the limit they were over (client or model).",
    ["scope"],
)
RATE_LIMIT_ERRORS = Counter(
    "tidegate_gateway_rate_limit_errors_total",
    "Calls whose rate limit could not be checked because Redis failed; each was then allowed "
    "or denied as on_redis_error says.",
)
_REFUSED = {scope: RATE_LIMITED.labels(scope) for scope in ("client", "model")}

# Roles nest, so the one with more permissions is the higher: admin, deploy, infer.
_ROLES_HIGH_FIRST = sorted(ROLE_PERMISSIONS, key=lambda role: -len(ROLE_PERMISSIONS[role]))
_MAX_KEYS = 10_000
# A replica keeps a lot one window at most: spending a slot later than it was counted never lets
# more calls through than were counted.
_STORAGE_ERRORS = (RedisError, OSError, StorageError)


V = TypeVar("V")


@dataclass(slots=True)
class _Lot:
    left: int
    until: float


def _bounded(entries: dict[str, V]) -> dict[str, V]:
    """`entries`, emptied first when it is full: its entries are only shortcuts."""
    if len(entries) >= _MAX_KEYS:
        entries.clear()
    return entries


class RateLimiter:
    """Set at gateway start as `app.state.rate_limiter`; `check` raises `RateLimitedError` for a
    call over its limit. Create it on the event loop that will use it, and `close` it."""

    def __init__(
        self, settings: RateLimitSettings, redis: RedisSettings, *, storage: Storage | None = None
    ) -> None:
        """`storage` replaces Redis (tests pass the library's `MemoryStorage`)."""
        self.settings = settings
        self._pool: ConnectionPool | None = None
        if storage is None:
            password = redis.password.get_secret_value() if redis.password else None
            # Our own pool, so that `close` can release it: the library's storage has no close.
            self._pool = ConnectionPool.from_url(
                redis.url,
                password=password,
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
            )
            options: dict[str, Any] = {"connection_pool": self._pool}
            storage = RedisStorage(
                "async+" + redis.url,
                implementation="redispy",
                key_prefix=settings.key_prefix,
                **options,
            )
        self._limiter = SlidingWindowCounterRateLimiter(storage)
        self._items: dict[tuple[str, float], RateLimitItem] = {}
        self._blocked: dict[str, float] = {}  # limit key -> monotonic time it has room again
        self._lots: dict[str, _Lot] = {}  # limit key -> slots taken from Redis, not yet used
        self._down_until = 0.0

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.disconnect()

    def client_rate(self, identity: Identity) -> float | None:
        """The caller's rate: its key's own, else its highest role's, else the default."""
        if identity.rate_per_s is not None:
            return identity.rate_per_s
        roles = set(identity.roles)
        for role in _ROLES_HIGH_FIRST:
            if role in roles and role in self.settings.role_rates:
                return self.settings.role_rates[role]
        return self.settings.client_rate_per_s

    def item(self, scope: str, rate: float) -> RateLimitItem:
        """The library's limit for `rate` per second: rate x burst_s calls per burst_s s."""
        found = self._items.get((scope, rate))
        if found is None:
            window = _window(rate, self.settings.burst_s)
            amount = max(1, round(rate * window))
            found = self._items[scope, rate] = RateLimitItemPerSecond(amount, window, scope)
        return found

    def limits_for(
        self, identity: Identity, model: str | None, client: str | None = None
    ) -> list[tuple[RateLimitItem, str]]:
        """The limits a call is checked against, in order, each with whom it counts."""
        if not self.settings.enabled:
            return []
        out: list[tuple[RateLimitItem, str]] = []
        rate = self.client_rate(identity)
        if rate is not None:
            who = client if identity.kind == "anonymous" and client else identity.subject
            out.append((self.item("client", rate), who))
        model_rate = self.settings.model_rates.get(model) if model is not None else None
        if model_rate is not None and model is not None:
            out.append((self.item("model", model_rate), model))
        return out

    async def check(
        self, identity: Identity, model: str | None = None, *, client: str | None = None
    ) -> None:
        """Count the call; raise `RateLimitedError` if it is over a limit. `client` names an
        anonymous caller (its address): anonymous callers are otherwise one client."""
        limits = self.limits_for(identity, model, client)
        if not limits:
            return
        now = time.monotonic()
        keys = [item.key_for(who) for item, who in limits]
        for (item, _), key in zip(limits, keys, strict=True):
            until = self._blocked.get(key)
            if until is not None and until > now:
                _REFUSED[item.namespace].inc()
                raise RateLimitedError(until - now)
        for (item, who), key in zip(limits, keys, strict=True):
            lot = self._lots.get(key)
            if lot is not None and lot.left > 0 and lot.until > now:
                lot.left -= 1
                continue
            if now < self._down_until:
                self._unchecked()
                return
            try:
                await self._count(item, who, key)
            except _STORAGE_ERRORS as exc:
                # Calls in flight together fail together: the first to fail says so.
                first = time.monotonic() >= self._down_until
                self._down_until = time.monotonic() + self.settings.outage_backoff_s
                if first:
                    self._warn(exc)
                self._unchecked()
                return

    def _warn(self, exc: Exception) -> None:
        _log.warning(
            "rate limits unchecked for %.0f s: Redis failed (%s: %s); calls are %s",
            self.settings.outage_backoff_s,
            type(exc).__name__,
            exc,
            "allowed" if self.settings.on_redis_error == "allow" else "denied with 503",
        )

    async def _count(self, item: RateLimitItem, who: str, key: str) -> None:
        """Take a lot of slots in one round trip. Where a whole lot no longer fits, ask what
        is left and take that (near the limit, one call's slot); with nothing left, refuse."""
        size = max(1, int(item.amount * self.settings.lot_percent / 100))
        if not await self._limiter.hit(item, who, cost=size):
            stats = await self._limiter.get_window_stats(item, who)
            size = min(size, stats.remaining)
            if size < 1 or not await self._limiter.hit(item, who, cost=size):
                # The library's reset time is wall-clock; the block is kept monotonic. For a
                # window begun this millisecond it answers "now" (the key's TTL is then a whole
                # multiple of the window): then one slot's share of the window.
                expiry = float(item.get_expiry())
                retry_s = min(stats.reset_time - time.time(), expiry)
                if retry_s <= 0:
                    retry_s = expiry / item.amount
                _bounded(self._blocked)[key] = time.monotonic() + retry_s
                _REFUSED[item.namespace].inc()
                raise RateLimitedError(retry_s)
        if size > 1:
            now = time.monotonic()
            until = now + item.get_expiry()
            lot = self._lots.get(key)
            if lot is not None and lot.until > now:
                # Calls that ran out together each fetched a lot: keep every slot they took.
                lot.left += size - 1
                lot.until = until
            else:
                _bounded(self._lots)[key] = _Lot(size - 1, until)

    def _unchecked(self) -> None:
        RATE_LIMIT_ERRORS.inc()
        if self.settings.on_redis_error == "deny":
            raise OverloadedError("rate limits cannot be checked: Redis is unavailable")


def _window(rate: float, burst_s: int) -> int:
    """The shortest window of at least `burst_s` seconds whose whole number of calls is within
    5% of `rate` (the library counts whole calls per whole seconds): 0.1/s is 1 call per 10 s,
    not 1 per second; 1.4/s is 7 per 5 s, not 1 per second. The shortest, since a longer window
    also allows a longer burst."""
    window = burst_s
    limit = max(burst_s, min(_MAX_WINDOW_S, math.ceil(20 / rate)))
    while window < limit:
        calls = max(1, round(rate * window))
        if abs(calls / window - rate) <= _TOLERANCE * rate:
            return window
        window += 1
    return limit
