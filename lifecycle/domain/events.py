"""The events of a model's lifecycle stream.

Each payload type is a frozen dataclass whose fields are exactly those of its Avro record in
`schemas/avro/dev.tidegate.lifecycle.<Type>.avsc` (a unit test holds them equal), so the JSONB
payload in PostgreSQL and the Avro payload on `model-lifecycle` are the same dictionary.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, TypeAlias

from tidegate.core.errors import LifecycleError

__all__ = [
    "EVENT_TYPES",
    "ArtifactValidated",
    "CanaryStarted",
    "FallbackSet",
    "ModelRegistered",
    "NewEvent",
    "Payload",
    "PoolAssigned",
    "Promoted",
    "RecordedEvent",
    "Retired",
    "RolledBack",
    "RoutingRuleSet",
    "ShadowStarted",
    "ShadowStopped",
    "TrafficShifted",
    "ValidationFailed",
    "VersionLoaded",
    "VersionUnloaded",
    "payload_from_dict",
    "payload_to_dict",
]


@dataclass(frozen=True, slots=True)
class ModelRegistered:
    """A version was uploaded to the artifact store."""

    version: str
    runtime: str
    artifact_uri: str
    sha256: dict[str, str]
    signature_json: str = "{}"
    description: str = ""


@dataclass(frozen=True, slots=True)
class ArtifactValidated:
    """The artifact passed checksum, load and warm-up checks."""

    version: str
    load_ms: float = 0.0
    device: str = ""


@dataclass(frozen=True, slots=True)
class ValidationFailed:
    """The artifact failed validation; it never receives traffic."""

    version: str
    reason: str


@dataclass(frozen=True, slots=True)
class ShadowStarted:
    """The version receives a sampled copy of live traffic; its outputs are only compared."""

    version: str
    sample_rate: float = 1.0


@dataclass(frozen=True, slots=True)
class ShadowStopped:
    version: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CanaryStarted:
    """A stepped shift of traffic from `baseline` towards `version` began.

    `thresholds` keys: max_error_rate, max_error_rate_increase, max_p99_ratio, min_requests.
    """

    version: str
    steps: list[int]
    dwell_s: float = 60.0
    thresholds: dict[str, float] = field(default_factory=dict)
    baseline: str | None = None


@dataclass(frozen=True, slots=True)
class TrafficShifted:
    """The intended weights (percent, summing to 100) of the model's versions changed."""

    weights: dict[str, int]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Promoted:
    """The version now takes all traffic. `forced` records a promotion past the shadow gate."""

    version: str
    forced: bool = False
    previous: str | None = None
    agreement: float | None = None


@dataclass(frozen=True, slots=True)
class RolledBack:
    """Traffic returned from `version` to `to_version`, with the metrics that triggered it."""

    version: str
    reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    to_version: str | None = None


@dataclass(frozen=True, slots=True)
class Retired:
    """The version serves no more traffic; workers unload it."""

    version: str


@dataclass(frozen=True, slots=True)
class RoutingRuleSet:
    """A tenant pin (`version`) or an experiment (`weights`); neither clears the rule."""

    rule_id: str
    tenant: str | None = None
    version: str | None = None
    weights: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VersionLoaded:
    """A worker fetched, checksummed, loaded and warmed up the version."""

    version: str
    worker_id: str
    load_ms: float = 0.0
    rss_bytes: int | None = None
    """Growth of the worker's resident memory during the load; None when not measured."""
    pool: str | None = None
    """The model pool of the worker (None: the default pool)."""


@dataclass(frozen=True, slots=True)
class VersionUnloaded:
    version: str
    worker_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FallbackSet:
    """The model's fallback model (None clears it): it serves the model's requests while the
    version a worker would call has an open circuit breaker."""

    fallback: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PoolAssigned:
    """The model was placed in a pool (None: the default pool): its requests go to that pool's
    topics, and that pool's workers keep its versions loaded (docs/pools.md)."""

    pool: str | None = None
    reason: str = ""


Payload: TypeAlias = (
    ModelRegistered
    | ArtifactValidated
    | ValidationFailed
    | ShadowStarted
    | ShadowStopped
    | CanaryStarted
    | TrafficShifted
    | Promoted
    | RolledBack
    | Retired
    | RoutingRuleSet
    | VersionLoaded
    | VersionUnloaded
    | FallbackSet
    | PoolAssigned
)

EVENT_TYPES: Mapping[str, type[Payload]] = {
    cls.__name__: cls
    for cls in (
        ModelRegistered,
        ArtifactValidated,
        ValidationFailed,
        ShadowStarted,
        ShadowStopped,
        CanaryStarted,
        TrafficShifted,
        Promoted,
        RolledBack,
        Retired,
        RoutingRuleSet,
        VersionLoaded,
        VersionUnloaded,
        FallbackSet,
        PoolAssigned,
    )
}


def payload_to_dict(payload: Payload) -> dict[str, Any]:
    """The payload as plain JSON/Avro data (lists and dicts copied)."""
    return dataclasses.asdict(payload)


def payload_from_dict(event_type: str, data: Mapping[str, Any]) -> Payload:
    """Build a payload; unknown fields (written by a newer version) are ignored."""
    cls = EVENT_TYPES.get(event_type)
    if cls is None:
        raise LifecycleError(f"unknown lifecycle event type {event_type!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise LifecycleError(f"bad {event_type} payload: {exc}") from exc


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended: the store assigns id, sequence, position and time."""

    payload: Payload
    actor: str = "system"
    causation_id: uuid.UUID | None = None
    correlation_id: uuid.UUID | None = None

    @property
    def type(self) -> str:
        return type(self.payload).__name__


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: `sequence` is its place in the model's stream (from 1), `position`
    its place in the store's global order."""

    event_id: uuid.UUID
    stream: str
    sequence: int
    position: int
    occurred_at: datetime
    payload: Payload
    actor: str = "system"
    causation_id: uuid.UUID | None = None
    correlation_id: uuid.UUID | None = None

    TYPES: ClassVar[Mapping[str, type[Payload]]] = EVENT_TYPES

    @property
    def type(self) -> str:
        return type(self.payload).__name__
