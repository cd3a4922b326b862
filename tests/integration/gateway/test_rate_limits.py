"""Rate limits against the real Redis: two limiters (two replicas) share one limit, per client and
per model, within 10% of the configured rate over a few seconds, refusing the rest with a
Retry-After; a refusal says when to retry and is remembered, and a limit far from being hit
rarely reaches Redis (their CPU costs are measured by `python -m tests.bench ratelimits`); and
through HTTP, `tidegate gateway
--workers 2` (two replicas on one port) answers 429 with Retry-After and a problem body while the
calls both accept add up to the configured rate.

Each test has its own key prefix in Redis. Rates are measured over a window after a warm-up that
fills the limiter's own window, so the burst a fresh limit allows is not counted as rate."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import fraud_body, topic_env
from tests.integration.gateway.rate_load import (
    MEASURE_S,
    WARM_S,
    accepted_rate,
    key,
    shared_limit,
)
from tests.support import free_port, unique
from tidegate.cli.procs import spawn, wait_http
from tidegate.core.errors import RateLimitedError
from tidegate.core.settings import RedisSettings, TopicSettings
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.admission.rate_limits import RateLimiter


@pytest.mark.parametrize(
    ("rate", "settings", "subjects", "loops"),
    [
        (40.0, {"client_rate_per_s": 40.0}, ["key:one"], 2),
        (40.0, {"model_rates": {"fraud": 40.0}}, ["key:a", "key:b", "key:c"], 1),
        # 200/s: each replica takes its slots in lots of 4, one round trip per lot. The same
        # at 1,000/s (lots of 20) needs a machine that offers 1,500 checks/s: `python -m
        # tests.bench ratelimits` measures that.
        (200.0, {"model_rates": {"fraud": 200.0}}, ["key:a", "key:b"], 2),
    ],
    ids=["per-client", "per-model", "per-model-in-lots"],
)
async def test_two_replicas_share_one_limit(
    rate: float, settings: dict[str, Any], subjects: list[str], loops: int
) -> None:
    config = RateLimitSettings(key_prefix=unique("it-rate"), **settings)
    measured = await shared_limit(config, subjects, loops)
    accepted = [i for i, retry in measured if retry is None]
    got = accepted_rate(measured)
    print(f"two replicas: {got:.1f}/s accepted of {len(measured) / MEASURE_S:.0f}/s, limit {rate}")
    assert abs(got - rate) <= 0.1 * rate, f"{got:.1f}/s accepted, limit {rate}/s"
    # Offered well over the limit, and both replicas took from it: the count is one, shared (two
    # counts would accept twice the rate). The split is not even: a refused replica waits out its
    # Retry-After without asking Redis, and whoever asks first once a slot frees takes it, so a
    # replica's share has been as low as a fifth.
    assert len(measured) > 1.5 * len(accepted)
    offered = [sum(1 for i, _ in measured if i == replica) for replica in (0, 1)]
    assert min(offered) > 2 * rate * MEASURE_S, offered
    assert min(accepted.count(0), accepted.count(1)) > 0.1 * len(accepted)
    retries = [retry for _, retry in measured if retry is not None]
    assert all(0 < r <= config.burst_s for r in retries)


class Counted:
    """How often a limiter asks Redis to count (its `_count`): the behaviour behind the CPU
    costs that `python -m tests.bench ratelimits` measures."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.calls = 0
        count = limiter._count

        async def counted(*args: Any, **kwargs: Any) -> None:
            self.calls += 1
            await count(*args, **kwargs)

        limiter._count = counted  # type: ignore[method-assign]


async def test_a_refusal_says_when_to_retry_and_is_remembered() -> None:
    # One call a minute: each fresh client's first call is accepted and its second refused.
    config = RateLimitSettings(key_prefix=unique("it-rate"), client_rate_per_s=1 / 60, burst_s=60)
    limiter = RateLimiter(config, RedisSettings())
    redis = Counted(limiter)
    retries: list[float] = []
    try:
        for identity in [key(f"key:{n}") for n in range(20)]:
            await limiter.check(identity, "fraud")
            asked = redis.calls
            for _ in range(3):
                with pytest.raises(RateLimitedError) as refused:
                    await limiter.check(identity, "fraud")
                retries.append(refused.value.retry_after_s)
            # The first refusal asks Redis; the next ones are remembered until the window ends.
            assert redis.calls == asked + 1
    finally:
        await limiter.close()
    assert all(0 < r <= 60 for r in retries)


async def test_an_accepted_call_under_a_high_limit_rarely_reaches_redis() -> None:
    config = RateLimitSettings(
        key_prefix=unique("it-rate"), client_rate_per_s=5000, model_rates={"fraud": 5000}
    )
    limiter = RateLimiter(config, RedisSettings())
    redis = Counted(limiter)
    identity = key("key:busy")
    try:
        for _ in range(2000):
            await limiter.check(identity, "fraud")
    finally:
        await limiter.close()
    # Slots are leased from Redis in lots: 42 counts for 2,000 calls when this was written.
    assert redis.calls < 100, f"{redis.calls} counts in Redis for 2,000 accepted calls"


def test_gateway_replicas_answer_429_and_hold_the_rate_together(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    rate = 20.0
    port = free_port()
    env = {
        **topic_env(topics),
        "TIDEGATE_GATEWAY_PORT": str(port),
        "TIDEGATE_AUTH_ENABLED": "false",
        "TIDEGATE_RATE_LIMIT_MODEL_RATES": json.dumps({"fraud": rate}),
        "TIDEGATE_RATE_LIMIT_KEY_PREFIX": unique("it-rate-http"),
    }
    child = spawn("gateway", ["gateway", "--workers", "2", "--no-admin"], tmp_path, env)
    seen: list[tuple[float, httpx.Response]] = []
    lock = threading.Lock()
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", child, 120)
        # A second past the measured window: the window is placed by the gateway's clock (below),
        # which runs behind the senders' by as long as calls queue in it.
        deadline = time.monotonic() + WARM_S + MEASURE_S + 1.0

        def client() -> None:
            # No keep-alive: every call a new connection, which either process may accept.
            limits = httpx.Limits(max_keepalive_connections=0)
            # Paced at the limit each (6x the limit in all), not as fast as the loop goes: a
            # saturated gateway queues calls, and the time a call was sent then drifts from
            # the time the limit saw it by as much as the queue holds (in CI, 15% of 4 s).
            step = 1 / rate
            due = time.monotonic()
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", limits=limits) as http:
                while (sent := time.monotonic()) < deadline:
                    if sent < due:
                        time.sleep(due - sent)  # pacing an open-loop sender, not a wait
                        sent = time.monotonic()
                    due = max(due + step, sent - step)
                    resp = http.post("/v2/models/fraud/infer", json=fraud_body(), timeout=30)
                    with lock:
                        seen.append((sent, resp))

        threads = [threading.Thread(target=client) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        child.stop()
    assert {r.status_code for _, r in seen} == {200, 429}, child.tail()
    # Accepted calls counted by when the gateway accepted them (the request's created_at, stamped
    # just after the limit passed it), not by when they were sent: on a loaded host calls queue
    # in the gateway, and the time a call was sent drifts from the time the limit saw it.
    accepted_at = sorted(_seconds(r["created_at"]) for r in worker.seen)
    assert len(accepted_at) == sum(r.status_code == 200 for _, r in seen)
    start = accepted_at[0] + WARM_S
    accepted = sum(start <= t < start + MEASURE_S for t in accepted_at)
    offered = len(seen) / (WARM_S + MEASURE_S + 1.0)
    print(f"HTTP: {accepted / MEASURE_S:.1f}/s accepted of {offered:.0f}/s offered")
    assert abs(accepted / MEASURE_S - rate) <= 0.1 * rate, f"{accepted / MEASURE_S:.1f}/s"
    # Offered well over the limit, so the limit, not the senders, set the accepted rate.
    assert offered > 2.5 * rate
    # Both replicas served: the requests they published name both reply partitions.
    assert len({r["reply_to"]["partition"] for r in worker.seen}) == 2
    refused = next(r for _, r in seen if r.status_code == 429)
    assert refused.headers["content-type"] == "application/problem+json"
    assert int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert (body["status"], body["code"], body["retriable"]) == (429, "RATE_LIMITED", True)


def _seconds(created_at: datetime | int) -> float:
    """A request's created_at (timestamp-millis, decoded to a datetime) in epoch seconds."""
    return created_at.timestamp() if isinstance(created_at, datetime) else created_at / 1000
