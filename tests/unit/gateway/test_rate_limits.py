"""Which limits a call is checked against (a key's own rate over its role's over the default, per
model across clients), the limits' settings, the 429 problem, and Redis being down: fail open with
a warning and a metric, or 503 when configured so. Redis down is a port nothing listens on."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from limits.aio.storage import MemoryStorage
from prometheus_client import REGISTRY
from pydantic import ValidationError

from tests.support import free_port
from tidegate.core.errors import OverloadedError, RateLimitedError
from tidegate.core.settings import RedisSettings
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.admission.rate_limits import RateLimiter
from tidegate.gateway.auth.identity import ANONYMOUS, Identity, grants_of
from tidegate.gateway.problems import error_problem


def limiter(redis_url: str = "redis://127.0.0.1:6379/0", **settings: Any) -> RateLimiter:
    return RateLimiter(RateLimitSettings(**settings), RedisSettings(url=redis_url))


def unchecked() -> float:
    return REGISTRY.get_sample_value("tidegate_gateway_rate_limit_errors_total") or 0.0


def caller(*roles: str, rate: float | None = None, subject: str = "key:k1") -> Identity:
    return Identity(subject, "api-key", grants_of(roles), rate_per_s=rate)


def test_a_keys_own_rate_wins_over_its_role_and_the_default() -> None:
    rl = limiter(client_rate_per_s=10, role_rates={"infer": 50, "admin": 500})
    assert rl.client_rate(caller("infer", rate=3)) == 3
    assert rl.client_rate(caller("infer")) == 50
    assert rl.client_rate(caller()) == 10


def test_the_highest_role_with_a_rate_decides() -> None:
    rl = limiter(role_rates={"infer": 50, "admin": 5})
    # admin ranks above infer, whatever the numbers: the admin's rate applies.
    assert rl.client_rate(caller("infer", "admin")) == 5
    # deploy has no rate of its own: the next role down that has one.
    assert rl.client_rate(caller("infer", "deploy")) == 50
    assert limiter().client_rate(caller("admin")) is None


def test_a_call_is_checked_per_client_then_per_model() -> None:
    rl = limiter(client_rate_per_s=10, model_rates={"fraud": 200}, burst_s=2)
    limits = rl.limits_for(caller("infer"), "fraud")
    assert [(item.namespace, item.amount, item.get_expiry(), who) for item, who in limits] == [
        ("client", 20, 2, "key:k1"),
        ("model", 400, 2, "fraud"),
    ]
    # A model with no rate adds no limit; neither does a route over no model.
    assert [who for _, who in rl.limits_for(caller("infer"), "minilm")] == ["key:k1"]
    assert [who for _, who in rl.limits_for(caller("infer"), None)] == ["key:k1"]


@pytest.mark.parametrize("rate", [0.001, 0.1, 0.5, 1.4, 1.6, 3.3, 7.0, 1000.0])
def test_low_and_fractional_rates_are_held_within_5_percent(rate: float) -> None:
    (item, _), *_ = limiter(client_rate_per_s=rate).limits_for(caller("infer"), None)
    held = item.amount / item.get_expiry()
    assert abs(held - rate) <= 0.05 * rate or item.get_expiry() == 3600, (rate, held)


def test_anonymous_callers_are_told_apart_by_address_when_it_is_given() -> None:
    rl = limiter(client_rate_per_s=1)
    assert [who for _, who in rl.limits_for(ANONYMOUS, None, client="10.0.0.7")] == ["10.0.0.7"]
    assert [who for _, who in rl.limits_for(ANONYMOUS, None)] == ["anonymous"]
    # A known identity is its subject, wherever it calls from.
    assert [who for _, who in rl.limits_for(caller(), None, client="10.0.0.7")] == ["key:k1"]


def test_a_rate_below_one_per_window_is_one_call_per_longer_window() -> None:
    ((item, _),) = limiter(client_rate_per_s=0.2).limits_for(caller(), None)
    assert (item.amount, item.get_expiry()) == (1, 5)  # not 1 per second: 5 times the rate


async def test_no_rate_no_redis_and_disabled_limits_nothing() -> None:
    # Nothing listens on this port: a check that went to Redis would fail open and count.
    dead = f"redis://127.0.0.1:{free_port()}/0"
    before = unchecked()
    await limiter(dead).check(caller("infer"), "fraud")
    off = limiter(dead, enabled=False, client_rate_per_s=1)
    assert off.limits_for(caller("infer", rate=1), "fraud") == []
    await off.check(caller("infer", rate=1), "fraud")
    assert unchecked() == before


def test_settings_read_json_maps_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_RATE_LIMIT_MODEL_RATES", json.dumps({"fraud": 500}))
    monkeypatch.setenv("TIDEGATE_RATE_LIMIT_ROLE_RATES", json.dumps({"infer": 20}))
    monkeypatch.setenv("TIDEGATE_RATE_LIMIT_CLIENT_RATE_PER_S", "5")
    settings = RateLimitSettings()
    assert (settings.model_rates, settings.role_rates, settings.client_rate_per_s) == (
        {"fraud": 500},
        {"infer": 20},
        5,
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"role_rates": {"operator": 5}},
        {"model_rates": {"fraud": 0}},
        {"client_rate_per_s": -1},
        {"burst_s": 0},
        {"on_redis_error": "ignore"},
        {"rate": 5},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RateLimitSettings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("retry_after_s", "header"), [(0.01, "1"), (1.0, "1"), (2.2, "3")])
def test_429_says_when_to_retry_in_whole_seconds(retry_after_s: float, header: str) -> None:
    response = error_problem(RateLimitedError(retry_after_s), instance="/v2/models/m/infer")
    body = json.loads(bytes(response.body))
    assert response.status_code == 429
    assert response.headers["retry-after"] == header
    assert response.media_type == "application/problem+json"
    assert (body["status"], body["code"], body["retriable"]) == (429, "RATE_LIMITED", True)
    assert body["retry_after_s"] == int(header)


async def test_redis_down_fails_open_with_one_warning_and_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rl = limiter(f"redis://127.0.0.1:{free_port()}/0", client_rate_per_s=1)
    before = unchecked()
    with caplog.at_level(logging.WARNING, logger="tidegate.gateway.admission.rate_limits"):
        for _ in range(3):  # over the rate: allowed all the same
            await rl.check(caller("infer"), "fraud")
    await rl.close()
    assert unchecked() == before + 3
    # The first failure is logged; the limiter then stands down instead of failing each call.
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "Redis failed" in warnings[0]
    assert "allowed" in warnings[0]


async def test_redis_down_denies_with_503_when_configured_to() -> None:
    rl = limiter(f"redis://127.0.0.1:{free_port()}/0", client_rate_per_s=1, on_redis_error="deny")
    for _ in range(2):  # the failure itself, then the stand-down
        with pytest.raises(OverloadedError) as refused:
            await rl.check(caller("infer"), None)
        response = error_problem(refused.value, instance="/v2/models/m/infer")
        assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    await rl.close()


class CountingStorage(MemoryStorage):
    """The library's in-memory storage, counting the calls that would be round trips."""

    def __init__(self) -> None:
        super().__init__()
        self.trips = 0

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        self.trips += 1
        return await super().acquire_sliding_window_entry(key, limit, expiry, amount)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        self.trips += 1
        return await super().get_sliding_window(key, expiry)


def in_memory(**settings: Any) -> tuple[RateLimiter, CountingStorage]:
    # A 60 s window: no test runs long enough to see it slide.
    storage = CountingStorage()
    rl = RateLimiter(RateLimitSettings(burst_s=60, **settings), RedisSettings(), storage=storage)
    return rl, storage


async def accepted(rl: RateLimiter, identity: Identity, calls: int, model: str = "m") -> int:
    taken = 0
    for _ in range(calls):
        try:
            await rl.check(identity, model)
            taken += 1
        except RateLimitedError:
            pass
    return taken


async def test_slots_are_taken_in_lots_and_the_last_ones_one_at_a_time() -> None:
    # 1,010 a window: lots of 20, then the 10 that no longer make a lot.
    rl, storage = in_memory(client_rate_per_s=1010 / 60)
    assert await accepted(rl, caller(), 1100) == 1010
    # 50 lots, then for the rest: a lot refused, what is left asked, the 10 taken; then refused.
    assert storage.trips == 50 + 3 + 2
    later = storage.trips
    with pytest.raises(RateLimitedError) as refused:
        await rl.check(caller(), "m")
    assert storage.trips == later, "a refusal is remembered, not asked again"
    assert 0 < refused.value.retry_after_s <= 60


async def test_a_client_over_its_limit_does_not_spend_its_models() -> None:
    rl, _ = in_memory(client_rate_per_s=1 / 60, model_rates={"m": 2 / 60})
    noisy, quiet = caller(subject="key:noisy"), caller(subject="key:quiet")
    assert await accepted(rl, noisy, 5) == 1
    # The model had room for 2: the noisy client's refused calls took none of it.
    assert await accepted(rl, quiet, 5) == 1
    with pytest.raises(RateLimitedError):
        await rl.check(caller(subject="key:third"), "m")


async def test_after_the_stand_down_redis_is_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    rl = limiter(f"redis://127.0.0.1:{free_port()}/0", client_rate_per_s=1, outage_backoff_s=0)
    with caplog.at_level(logging.WARNING, logger="tidegate.gateway.admission.rate_limits"):
        for _ in range(2):
            await rl.check(caller("infer"), None)
    await rl.close()
    assert len(caplog.records) == 2
