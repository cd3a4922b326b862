"""The failure policy: what becomes of a request that failed, decided in one place.

By type first: the error tree says whether an error is retriable, so a retriable failure
(UNAVAILABLE, MODEL_TIMEOUT, ...) is retried and anything else is not. Then by code: a few codes
are the caller's to fix (invalid input, unknown model, a deadline that passed) and are only
answered; undecodable messages and crash loops are quarantined; the remaining fatal errors are
dead-lettered. `FailureSettings.actions` and the per-model overrides change any of this.

A retry goes to retry topic n for the n-th retry of the current drive (a redrive starts a fresh
budget, `dlq.redelivery.retries_since_redrive`); once the budget is spent the request is
dead-lettered instead, with its whole history.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tidegate.core.errors import (
    CrashLoopError,
    DeadlineExceededError,
    InvalidInputError,
    MalformedRequestError,
    ModelNotFoundError,
    SerializationError,
    TidegateError,
)
from tidegate.core.settings import TopicSettings
from tidegate.dlq.failure_settings import Action, FailureSettings

__all__ = ["ANSWER", "ConfiguredPolicy", "FailurePolicy", "Verdict"]

_ANSWERED = {
    InvalidInputError.code,
    MalformedRequestError.code,
    ModelNotFoundError.code,
    DeadlineExceededError.code,
}


@dataclass(frozen=True, slots=True)
class Verdict:
    """`level` (1-based) and `delay_s` are set for a retry only."""

    action: Action
    level: int = 0
    delay_s: float = 0.0


ANSWER = Verdict("answer")


class FailurePolicy(Protocol):
    def decide(self, model: str, error: Mapping[str, Any], retries: int) -> Verdict:
        """What to do with a request of `model` that failed with `error` (an `ErrorInfo`)
        after `retries` retries in its current drive."""
        ...

    def timeout_s(self, model: str) -> float:
        """How long one batch of `model` may run."""
        ...


class ConfiguredPolicy:
    def __init__(
        self,
        settings: FailureSettings,
        topics: TopicSettings,
        *,
        rng: random.Random | None = None,
    ) -> None:
        most = max([settings.retries, *(m.retries or 0 for m in settings.models.values())])
        if most > topics.retry_levels:
            raise ValueError(
                f"{most} retries need {most} retry topics; the layout has {topics.retry_levels}"
                " (TIDEGATE_TOPICS_RETRY_LEVELS)"
            )
        self.settings = settings
        # Not for security: spreading retries in time only needs a uniform draw.
        self._rng = rng or random.Random()  # noqa: S311

    def action(self, model: str, error: Mapping[str, Any]) -> Action:
        code = str(error.get("code"))
        override = self.settings.models.get(model)
        if override is not None and code in override.actions:
            return override.actions[code]
        if code in self.settings.actions:
            return self.settings.actions[code]
        if code in _QUARANTINED:
            return "quarantine"
        if code in _ANSWERED:
            return "answer"
        return "retry" if error.get("retriable") else "dead-letter"

    def decide(self, model: str, error: Mapping[str, Any], retries: int) -> Verdict:
        action = self.action(model, error)
        if action != "retry":
            return Verdict(action)
        if retries >= self.retries(model):
            return Verdict("dead-letter")
        delay = self.settings.retry_delays_s[retries]
        jitter = self.settings.jitter
        return Verdict("retry", retries + 1, delay * self._rng.uniform(1 - jitter, 1 + jitter))

    def retries(self, model: str) -> int:
        override = self.settings.models.get(model)
        if override is not None and override.retries is not None:
            return override.retries
        return self.settings.retries

    def timeout_s(self, model: str) -> float:
        override = self.settings.models.get(model)
        if override is not None and override.timeout_ms is not None:
            return override.timeout_ms / 1000.0
        return self.settings.model_timeout_ms / 1000.0


def _codes_under(root: type[TidegateError]) -> set[str]:
    codes = set()
    stack: list[type[TidegateError]] = [root]
    while stack:
        cls = stack.pop()
        codes.add(cls.code)
        stack.extend(cls.__subclasses__())
    return codes


# Undecodable bytes stay undecodable however often they are read.
_QUARANTINED = {CrashLoopError.code, *_codes_under(SerializationError)}
