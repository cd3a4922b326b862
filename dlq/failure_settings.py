"""Settings of the failure policy (env prefix `TIDEGATE_FAILURE_`), with overrides per model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings

from tidegate.core.settings import settings_config

__all__ = ["Action", "FailureSettings", "ModelFailurePolicy"]

Action = Literal["retry", "dead-letter", "quarantine", "answer"]
"""What happens to a failed request besides its error result:
`retry` sends it to the next retry topic (then `dead-letter` after the last), `dead-letter` also
publishes it to the failed-requests topic, `quarantine` to the poison topic (without an error
result to the results topic it still answers its caller), and `answer` only answers."""


class ModelFailurePolicy(BaseModel):
    """What one model changes of the defaults; unset fields keep them."""

    model_config = ConfigDict(extra="forbid")

    retries: int | None = Field(None, ge=0, le=10, description="Retries before the DLQ.")
    timeout_ms: float | None = Field(None, gt=0, description="This model's batch timeout.")
    actions: dict[str, Action] = Field(
        default_factory=dict, description="Error code to action, over the defaults."
    )


class FailureSettings(BaseSettings):
    """How failures are handled (env prefix `TIDEGATE_FAILURE_`).

    Per-model overrides are JSON, e.g.
    `TIDEGATE_FAILURE_MODELS='{"fraud": {"retries": 1, "timeout_ms": 500}}'`.
    """

    model_config = settings_config("TIDEGATE_FAILURE_")

    retry_delays_s: list[float] = Field(
        [1.0, 10.0, 60.0],
        description="The delay before each retry, one per retry topic: a request that failed "
        "with a retriable error waits this long on `<retry_prefix>-<n>` before its n-th retry.",
    )
    retries: int = Field(
        3, ge=0, le=10, description="Retries before a retriable failure is dead-lettered."
    )
    jitter: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="Each delay is drawn uniformly from delay x (1 +/- jitter), so requests that "
        "failed together are not all retried in the same instant.",
    )
    actions: dict[str, Action] = Field(
        default_factory=dict,
        description="Error code to action, over the defaults (by the error tree: retriable "
        "errors retry; model errors dead-letter; invalid input, unknown models and missed "
        "deadlines only answer; undecodable messages and crash loops are quarantined).",
    )
    model_timeout_ms: float = Field(
        30_000.0,
        gt=0,
        description="A batch running longer fails its members as retriable (MODEL_TIMEOUT).",
    )
    crash_limit: int = Field(
        3,
        ge=1,
        le=100,
        description="Worker processes a message may kill before it is quarantined (CRASH_LOOP).",
    )
    crash_guard: bool = Field(
        True, description="Count crashes per message in Redis (off: crash loops go unnoticed)."
    )
    ordering: Literal["unordered", "hold-key"] = Field(
        "unordered",
        description="`hold-key`: while a request waits for a retry, later requests of its key "
        "wait behind it (on the same retry topic), so a key's results keep their order.",
    )
    models: dict[str, ModelFailurePolicy] = Field(
        default_factory=dict, description="Overrides per model name."
    )

    @model_validator(mode="after")
    def _enough_delays(self) -> FailureSettings:
        most = max([self.retries, *(m.retries or 0 for m in self.models.values())])
        if most > len(self.retry_delays_s):
            raise ValueError(
                f"{most} retries need as many retry_delays_s; {len(self.retry_delays_s)} given"
            )
        return self
