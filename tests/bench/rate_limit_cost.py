"""What the rate limiter costs in CPU, against the real Redis (`python -m tests.bench ratelimits`,
part of `make bench`). Moved here from the integration tests, which keep the behaviour (a refusal
says when to retry; a remembered refusal and a limit far from being hit rarely reach Redis), since
a CPU bar in a functional test fails when the machine is slow, not when the code is wrong.

Bars: a refusal that asks Redis under 0.6 ms of CPU, a remembered one under 0.05 ms,
an accepted call under a high limit under 0.05 ms (5% of the ~1 ms the gateway spends on a call).
The best of `ROUNDS` rounds counts.

Also two replicas sharing a limit of 1,000 calls/s (slots taken in lots of 20), offered 6,000/s:
the calls they accept within 10% of the limit (moved from tests/integration/gateway/
test_rate_limits.py, which keeps the shared limit at rates any machine can offer).
"""

from __future__ import annotations

import asyncio
import time

from tests.integration.gateway.rate_load import MEASURE_S, accepted_rate, shared_limit
from tests.support import unique
from tidegate.core.errors import RateLimitedError
from tidegate.core.settings import RedisSettings
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.admission.rate_limits import RateLimiter
from tidegate.gateway.auth.identity import Identity, grants_of

__all__ = ["run"]

ROUNDS = 3
CLIENTS = 300
ACCEPTED = 2000
SHARED_RATE = 1000.0


def _key(subject: str) -> Identity:
    return Identity(subject, "api-key", grants_of(["infer"]))


async def refusal_ms() -> tuple[float, float]:
    """CPU per refusal: asking Redis, and remembered."""
    # One call a minute: each fresh client's first call is accepted and its second refused.
    config = RateLimitSettings(
        key_prefix=unique("bench-rate"), client_rate_per_s=1 / 60, burst_s=60
    )
    limiter = RateLimiter(config, RedisSettings())
    by_redis: list[float] = []
    remembered: list[float] = []
    try:
        for n in range(CLIENTS):
            identity = _key(f"key:{n}")
            await limiter.check(identity, "fraud")
            for costs in (by_redis, remembered):
                started = time.process_time()
                try:
                    await limiter.check(identity, "fraud")
                except RateLimitedError:
                    costs.append(time.process_time() - started)
    finally:
        await limiter.close()
    return 1000 * sum(by_redis) / len(by_redis), 1000 * sum(remembered) / len(remembered)


async def accepted_ms() -> float:
    """CPU per accepted call under client and model limits that are not hit."""
    config = RateLimitSettings(
        key_prefix=unique("bench-rate"), client_rate_per_s=5000, model_rates={"fraud": 5000}
    )
    limiter = RateLimiter(config, RedisSettings())
    identity = _key("key:busy")
    try:
        await limiter.check(identity, "fraud")
        started = time.process_time()
        for _ in range(ACCEPTED):
            await limiter.check(identity, "fraud")
        return 1000 * (time.process_time() - started) / ACCEPTED
    finally:
        await limiter.close()


def run() -> None:
    print("\nratelimits: CPU per check against the real Redis")
    rounds = []
    for k in range(ROUNDS):
        redis_ms, local_ms = asyncio.run(refusal_ms())
        accepted = asyncio.run(accepted_ms())
        rounds.append((redis_ms, local_ms, accepted))
        print(
            f"  round {k + 1}: refusal asking Redis {redis_ms:.3f} ms, remembered "
            f"{local_ms:.4f} ms, accepted {accepted:.4f} ms"
        )
    best = [min(r[i] for r in rounds) for i in range(3)]
    for label, value, bar in zip(
        ("refusal asking Redis", "remembered refusal", "accepted call, high limit"),
        best,
        (0.6, 0.05, 0.05),
        strict=True,
    ):
        print(f"  {label:<27} {value:.4f} ms  bar < {bar}  {'met' if value < bar else 'missed'}")
    shared = RateLimitSettings(key_prefix=unique("bench-rate"), model_rates={"fraud": SHARED_RATE})
    measured = asyncio.run(shared_limit(shared, ["key:a", "key:b"], loops=6))
    got = accepted_rate(measured)
    met = abs(got - SHARED_RATE) <= 0.1 * SHARED_RATE and len(measured) > 1.5 * got * MEASURE_S
    print(
        f"  two replicas, limit {SHARED_RATE:.0f}/s: {got:.0f}/s accepted of "
        f"{len(measured) / MEASURE_S:.0f}/s offered  bar within 10% (offered > 1.5x)  "
        f"{'met' if met else 'missed'}"
    )
