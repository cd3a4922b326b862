"""Calls offered to rate limiters against the real Redis: what the rate-limit tests and `python
-m tests.bench ratelimits` measure the shared limit with."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tidegate.core.errors import RateLimitedError
from tidegate.core.settings import RedisSettings
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.admission.rate_limits import RateLimiter
from tidegate.gateway.auth.identity import Identity, grants_of

__all__ = ["MEASURE_S", "WARM_S", "accepted_rate", "key", "offer", "shared_limit"]

# Rates are measured over a window after a warm-up that fills the limiter's own window, so the
# burst a fresh limit allows is not counted as rate.
WARM_S = 1.5
MEASURE_S = 4.0


def key(subject: str) -> Identity:
    return Identity(subject, "api-key", grants_of(["infer"]))


async def offer(
    replicas: list[RateLimiter], callers: list[Identity], seconds: float, loops: int
) -> list[tuple[float, int, float | None]]:
    """Calls from every caller through every replica, in `loops` loops of up to 250/s each, for
    `seconds`: (when, replica, None if accepted else its retry_after_s)."""
    seen: list[tuple[float, int, float | None]] = []
    deadline = time.monotonic() + seconds

    async def loop(index: int, limiter: RateLimiter, identity: Identity) -> None:
        while time.monotonic() < deadline:
            try:
                await limiter.check(identity, "fraud")
                seen.append((time.monotonic(), index, None))
            except RateLimitedError as refused:
                seen.append((time.monotonic(), index, refused.retry_after_s))
            await asyncio.sleep(0.004)

    tasks = [(i, rl, who) for i, rl in enumerate(replicas) for who in callers]
    await asyncio.gather(*(loop(*task) for task in tasks for _ in range(loops)))
    return seen


async def shared_limit(
    config: RateLimitSettings, subjects: list[str], loops: int
) -> list[tuple[int, float | None]]:
    """Two replicas (two limiters) sharing `config`'s limits, offered calls from `subjects`: the
    calls of the measured window, each (replica, None if accepted else its retry_after_s)."""
    replicas = [RateLimiter(config, RedisSettings()) for _ in range(2)]
    try:
        seen = await offer(replicas, [key(s) for s in subjects], WARM_S + MEASURE_S, loops)
    finally:
        for rl in replicas:
            await rl.close()
    start = seen[0][0] + WARM_S
    return [(i, retry) for t, i, retry in seen if start <= t < start + MEASURE_S]


def accepted_rate(measured: list[tuple[int, Any]]) -> float:
    """Accepted calls per second of the measured window."""
    return sum(1 for _, retry in measured if retry is None) / MEASURE_S
