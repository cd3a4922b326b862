"""The board of breakers: one per version with its model's policy, metrics, what is published,
the tombstones of a stopping worker; and the settings' per-model overrides."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from tidegate.agents.breakers.breaker import BreakerPolicy
from tidegate.agents.breakers.breaker_board import BreakerBoard, breaker_key
from tidegate.agents.breakers.breaker_settings import BreakerSettings, ModelBreakerPolicy


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


def board(
    settings: BreakerSettings,
) -> tuple[BreakerBoard, Clock, list[tuple[str, dict[str, Any] | None]]]:
    clock = Clock()
    published: list[tuple[str, dict[str, Any] | None]] = []
    made = BreakerBoard(
        settings,
        worker_id="w1",
        publish=lambda key, record: published.append((key, record)),
        clock=clock,
        wall=lambda: 5000.0 + clock.now,
    )
    return made, clock, published


def transitions(model: str, version: str, state: str) -> float:
    labels = {"model": model, "version": version, "state": state}
    return REGISTRY.get_sample_value("tidegate_worker_breaker_transitions_total", labels) or 0.0


def test_each_version_has_its_own_breaker_with_its_models_policy() -> None:
    settings = BreakerSettings(models={"slow": ModelBreakerPolicy(min_calls=2)})
    b, _, published = board(settings)
    b.record("slow", "1", 0, 2)
    b.record("fast", "1", 0, 2)
    assert b.state("slow", "1") == "open"
    assert b.state("slow", "2") == "closed"
    assert b.state("fast", "1") == "closed"  # the default minimum of 20
    assert b.admit("slow", "1", 10) == 0
    assert b.admit("slow", "2", 10) == 10
    (key, record), *_ = published
    assert key == breaker_key("slow", "1", "w1") == "slow/1/w1"
    assert record == {
        "model": "slow",
        "version": "1",
        "worker_id": "w1",
        "state": "open",
        "changed_at": 5_010_000,
        "open_until": 5_011_000,
        "trips": 1,
        "calls": 0,
        "failures": 0,
        "reason": "2 of 2 calls failed (100%) in 10 s",
    }
    assert b.reopens_at_ms("slow", "1") == 5_011_000
    assert b.reopens_at_ms("slow", "2") == 0


def test_transitions_are_counted_and_the_gauge_follows() -> None:
    settings = BreakerSettings(models={"gauge": ModelBreakerPolicy(min_calls=1, probes=1)})
    b, clock, _ = board(settings)
    opened = transitions("gauge", "3", "open")
    b.record("gauge", "3", 0, 1)
    state = REGISTRY.get_sample_value(
        "tidegate_worker_breaker_state", {"model": "gauge", "version": "3"}
    )
    assert state == 2.0
    clock.now += 1.0
    assert b.admit("gauge", "3", 5) == 1
    b.record("gauge", "3", 1, 0)
    assert transitions("gauge", "3", "open") - opened == 1
    assert transitions("gauge", "3", "half_open") >= 1
    assert transitions("gauge", "3", "closed") >= 1
    state = REGISTRY.get_sample_value(
        "tidegate_worker_breaker_state", {"model": "gauge", "version": "3"}
    )
    assert state == 0.0


def test_a_stopping_worker_tombstones_what_it_published() -> None:
    b, _, published = board(BreakerSettings(min_calls=1))
    b.record("a", "1", 0, 1)
    b.record("b", "2", 0, 1)
    published.clear()
    b.close()
    assert published == [("a/1/w1", None), ("b/2/w1", None)]


def test_a_model_may_turn_its_breaker_off() -> None:
    settings = BreakerSettings(min_calls=1, models={"free": ModelBreakerPolicy(enabled=False)})
    b, _, published = board(settings)
    b.record("free", "1", 0, 100)
    assert b.admit("free", "1", 7) == 7
    assert published == []


def test_settings_resolve_per_model_policies_and_refuse_bad_combinations() -> None:
    settings = BreakerSettings(
        window_s=30.0, models={"fraud": ModelBreakerPolicy(min_calls=50, max_open_s=60.0)}
    )
    assert settings.policy("fraud") == BreakerPolicy(window_s=30.0, min_calls=50, max_open_s=60.0)
    assert settings.policy("other") == BreakerPolicy(window_s=30.0)
    with pytest.raises(ValidationError):
        BreakerSettings(models={"x": ModelBreakerPolicy(open_s=10.0, max_open_s=5.0)})


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEGATE_BREAKER_MIN_CALLS", "5")
    monkeypatch.setenv("TIDEGATE_BREAKER_MODELS", '{"fraud": {"probes": 2}}')
    settings = BreakerSettings()
    assert settings.policy("fraud") == BreakerPolicy(min_calls=5, probes=2)
