"""The failure policy: by the error tree first, then by code, then per model."""

from __future__ import annotations

import random

import pytest

from tidegate.core.errors import (
    CrashLoopError,
    DeadlineExceededError,
    InvalidInputError,
    ModelExecutionError,
    ModelTimeoutError,
    ModelUnavailableError,
    WireFormatError,
)
from tidegate.core.settings import TopicSettings
from tidegate.dlq.envelopes import error_info
from tidegate.dlq.failure_settings import FailureSettings, ModelFailurePolicy
from tidegate.dlq.policy import ConfiguredPolicy


def policy(**settings: object) -> ConfiguredPolicy:
    return ConfiguredPolicy(
        FailureSettings.model_validate(settings), TopicSettings(), rng=random.Random(7)
    )


@pytest.mark.parametrize(
    ("error", "action"),
    [
        (ModelUnavailableError("down"), "retry"),
        (ModelTimeoutError("slow"), "retry"),
        (ModelExecutionError("boom"), "dead-letter"),
        (InvalidInputError("bad", "x"), "answer"),
        (DeadlineExceededError("late"), "answer"),
        (WireFormatError("garbage"), "quarantine"),
        (CrashLoopError("killed 3"), "quarantine"),
        (RuntimeError("unforeseen"), "dead-letter"),
    ],
)
def test_the_default_action_follows_the_error_tree(error: Exception, action: str) -> None:
    assert policy().action("fraud", error_info(error)) == action


def test_retries_use_their_levels_and_delays_then_the_dead_letter_topic() -> None:
    chosen = policy(retry_delays_s=[1, 10, 60], retries=3, jitter=0.2)
    error = error_info(ModelUnavailableError("down"))
    verdicts = [chosen.decide("fraud", error, retries) for retries in range(4)]
    assert [v.action for v in verdicts] == ["retry", "retry", "retry", "dead-letter"]
    assert [v.level for v in verdicts[:3]] == [1, 2, 3]
    for verdict, delay in zip(verdicts, (1, 10, 60), strict=False):
        assert delay * 0.8 <= verdict.delay_s <= delay * 1.2


def test_jitter_spreads_requests_that_failed_together() -> None:
    chosen = policy(retry_delays_s=[10], retries=1, jitter=0.2)
    error = error_info(ModelUnavailableError("down"))
    delays = {round(chosen.decide("fraud", error, 0).delay_s, 6) for _ in range(50)}
    assert len(delays) > 40


def test_codes_and_models_override_the_defaults() -> None:
    chosen = policy(
        actions={"MODEL_ERROR": "retry"},
        models={
            "fraud": ModelFailurePolicy(
                retries=1, timeout_ms=250, actions={"UNAVAILABLE": "dead-letter"}
            )
        },
    )
    unavailable = error_info(ModelUnavailableError("down"))
    model_error = error_info(ModelExecutionError("boom"))
    assert chosen.action("fraud", unavailable) == "dead-letter"
    assert chosen.action("other", unavailable) == "retry"
    assert chosen.action("other", model_error) == "retry"
    assert chosen.retries("fraud") == 1
    assert chosen.retries("other") == 3
    assert chosen.timeout_s("fraud") == 0.25
    assert chosen.timeout_s("other") == 30.0
    assert chosen.decide("fraud", model_error, 1).action == "dead-letter"


def test_more_retries_than_delays_or_retry_topics_is_refused() -> None:
    with pytest.raises(ValueError, match="retry_delays_s"):
        FailureSettings(retry_delays_s=[1.0], retries=2)
    with pytest.raises(ValueError, match="retry topics"):
        ConfiguredPolicy(FailureSettings(), TopicSettings(retry_levels=2))
