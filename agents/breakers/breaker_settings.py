"""Settings of the circuit breakers (env prefix `TIDEGATE_BREAKER_`), with overrides per model."""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings

from tidegate.agents.breakers.breaker import BreakerPolicy
from tidegate.core.settings import settings_config

__all__ = ["BreakerSettings", "ModelBreakerPolicy"]


class ModelBreakerPolicy(BaseModel):
    """What one model changes of the defaults; unset fields keep them."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    failure_rate: float | None = Field(None, ge=0, lt=1)
    window_s: float | None = Field(None, gt=0)
    min_calls: int | None = Field(None, ge=1)
    open_s: float | None = Field(None, gt=0)
    max_open_s: float | None = Field(None, gt=0)
    probes: int | None = Field(None, ge=1)


class BreakerSettings(BaseSettings):
    """One breaker per model version in each worker (env prefix `TIDEGATE_BREAKER_`).

    Per-model overrides are JSON, e.g.
    `TIDEGATE_BREAKER_MODELS='{"fraud": {"min_calls": 50, "max_open_s": 60}}'`.
    """

    model_config = settings_config("TIDEGATE_BREAKER_")

    enabled: bool = Field(True, description="Off: every version is always called.")
    failure_rate: float = Field(
        0.5, ge=0, lt=1, description="The breaker opens above this share of failed calls."
    )
    window_s: float = Field(10.0, gt=0, description="The sliding window the share is taken over.")
    min_calls: int = Field(
        20, ge=1, description="Calls the window must hold before the share is judged."
    )
    open_s: float = Field(
        1.0, gt=0, description="The first open period; doubled while half-open probes fail."
    )
    max_open_s: float = Field(300.0, gt=0, description="The longest open period.")
    probes: int = Field(
        5, ge=1, description="Half-open calls let through; that many successes close it."
    )
    models: dict[str, ModelBreakerPolicy] = Field(
        default_factory=dict, description="Overrides per model name."
    )

    @model_validator(mode="after")
    def _periods(self) -> BreakerSettings:
        for model in [None, *self.models]:
            self.policy(model or "")  # BreakerPolicy checks the combination
        return self

    def is_enabled(self, model: str) -> bool:
        override = self.models.get(model)
        if override is not None and override.enabled is not None:
            return override.enabled
        return self.enabled

    def policy(self, model: str) -> BreakerPolicy:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(BreakerPolicy)}
        override = self.models.get(model)
        if override is not None:
            values.update(override.model_dump(exclude_none=True, exclude={"enabled"}))
        return BreakerPolicy(**values)
