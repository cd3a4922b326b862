"""The shapes the projection queries return, and the pure functions that derive the history
summaries and lineage rows from events (lifecycle/eventstore/projections.py writes and reads them).

Everything here is a function of the events alone, so a rebuilt projection equals the live one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from tidegate.lifecycle.domain import events as ev

__all__ = [
    "CanaryView",
    "HistoryEntry",
    "Lineage",
    "ModelSummary",
    "Routing",
    "RuleRoute",
    "VersionRoute",
    "describe",
    "lineage_rows",
]


@dataclass(frozen=True, slots=True)
class CanaryView:
    version: str
    baseline: str | None
    steps: tuple[int, ...]
    step: int
    """Index into `steps` of the weight in force; -1 while the candidate warms up."""
    dwell_s: float
    thresholds: dict[str, float]
    started_at: datetime
    step_at: datetime | None


@dataclass(frozen=True, slots=True)
class ModelSummary:
    model: str
    sequence: int
    primary: str | None
    previous_primary: str | None
    canary: CanaryView | None
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class VersionRoute:
    version: str
    status: str
    weight: int
    """Intended weight in percent."""
    effective_weight: int
    """The weight in force: an unwarmed version's share goes to the primary."""
    shadow_rate: float | None
    ready: bool
    loaded_on: tuple[str, ...]
    runtime: str
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class RuleRoute:
    rule_id: str
    tenant: str | None
    version: str | None
    """The pinned version; None for an experiment, whose split is `weights`."""
    weights: dict[str, int]


@dataclass(frozen=True, slots=True)
class Routing:
    model: ModelSummary
    versions: tuple[VersionRoute, ...]
    rules: tuple[RuleRoute, ...]

    def shadows(self) -> dict[str, float]:
        return {v.version: v.shadow_rate for v in self.versions if v.shadow_rate is not None}


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    model: str
    sequence: int
    position: int
    occurred_at: datetime
    type: str
    version: str | None
    actor: str
    summary: str
    payload: dict[str, Any]
    correlation_id: uuid.UUID | None


@dataclass(slots=True)
class Lineage:
    """Where a version came from and what happened to it (the latest of each repeated step).

    `correlation_ids` are those of the events about the version (its payload's `version`), in
    order of first appearance: the handles that tie it to commands and requests elsewhere.
    """

    model: str
    version: str
    runtime: str
    artifact_uri: str
    sha256: dict[str, str]
    description: str
    registered_by: str
    registered_at: datetime
    validated_at: datetime | None = None
    validation_failed_at: datetime | None = None
    failure_reason: str | None = None
    shadow_started_at: datetime | None = None
    canary_started_at: datetime | None = None
    promoted_at: datetime | None = None
    promoted_by: str | None = None
    promoted_forced: bool | None = None
    rolled_back_at: datetime | None = None
    rollback_reason: str | None = None
    retired_at: datetime | None = None
    retired_by: str | None = None
    correlation_ids: list[uuid.UUID] = field(default_factory=list)

    COLUMNS: ClassVar[tuple[str, ...]] = (
        "model",
        "version",
        "runtime",
        "artifact_uri",
        "sha256",
        "description",
        "registered_by",
        "registered_at",
        "validated_at",
        "validation_failed_at",
        "failure_reason",
        "shadow_started_at",
        "canary_started_at",
        "promoted_at",
        "promoted_by",
        "promoted_forced",
        "rolled_back_at",
        "rollback_reason",
        "retired_at",
        "retired_by",
        "correlation_ids",
    )
    QUERY: ClassVar[str] = "SELECT {} FROM version_lineage".format(  # noqa: S608 - constant
        ", ".join(COLUMNS)
    )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Lineage:
        values = dict(zip(cls.COLUMNS, row, strict=True))
        values["sha256"] = dict(values["sha256"])
        values["correlation_ids"] = list(values["correlation_ids"])
        return cls(**values)

    def row(self) -> tuple[Any, ...]:
        """Column values in `COLUMNS` order; the store adapts `sha256` to JSONB when it writes."""
        return tuple(getattr(self, name) for name in self.COLUMNS)


def lineage_rows(model: str, events: Sequence[ev.RecordedEvent]) -> list[tuple[Any, ...]]:
    """The `version_lineage` rows of a model's events, registered versions only."""
    found: dict[str, Lineage] = {}
    for e in events:
        p = e.payload
        if isinstance(p, ev.ModelRegistered):
            found[p.version] = Lineage(
                model,
                p.version,
                p.runtime,
                p.artifact_uri,
                dict(p.sha256),
                p.description,
                e.actor,
                e.occurred_at,
            )
        name = getattr(p, "version", None)
        entry = found.get(name) if isinstance(name, str) else None
        if entry is None:
            continue
        _note(entry, e)
        if e.correlation_id is not None and e.correlation_id not in entry.correlation_ids:
            entry.correlation_ids.append(e.correlation_id)
    return [found[name].row() for name in sorted(found)]


def _note(entry: Lineage, e: ev.RecordedEvent) -> None:
    p, at = e.payload, e.occurred_at
    if isinstance(p, ev.ArtifactValidated):
        entry.validated_at = at
    elif isinstance(p, ev.ValidationFailed):
        entry.validation_failed_at, entry.failure_reason = at, p.reason
    elif isinstance(p, ev.ShadowStarted):
        entry.shadow_started_at = at
    elif isinstance(p, ev.CanaryStarted):
        entry.canary_started_at = at
    elif isinstance(p, ev.Promoted):
        entry.promoted_at, entry.promoted_by, entry.promoted_forced = at, e.actor, p.forced
    elif isinstance(p, ev.RolledBack):
        entry.rolled_back_at, entry.rollback_reason = at, p.reason
    elif isinstance(p, ev.Retired):
        entry.retired_at, entry.retired_by = at, e.actor


def _weights(weights: dict[str, int]) -> str:
    return ", ".join(f"{name}={weight}%" for name, weight in sorted(weights.items()))


def describe(p: ev.Payload) -> str:
    """One line saying what the event did, for `models history`."""
    if isinstance(p, ev.ModelRegistered):
        return f"registered {p.version} ({p.runtime}) from {p.artifact_uri}"
    if isinstance(p, ev.ArtifactValidated):
        return f"validated {p.version} (loaded in {p.load_ms:.0f} ms)"
    if isinstance(p, ev.ValidationFailed):
        return f"{p.version} failed validation: {p.reason}"
    if isinstance(p, ev.ShadowStarted):
        return f"shadowing {p.version} on {p.sample_rate:.0%} of traffic"
    if isinstance(p, ev.ShadowStopped):
        return f"stopped shadowing {p.version}" + (f": {p.reason}" if p.reason else "")
    if isinstance(p, ev.CanaryStarted):
        steps = " -> ".join(f"{s}%" for s in p.steps)
        return f"canary of {p.version} from {p.baseline or 'the primary'}: {steps}, {p.dwell_s:g}s"
    if isinstance(p, ev.TrafficShifted):
        return f"weights {_weights(p.weights)}" + (f" ({p.reason})" if p.reason else "")
    if isinstance(p, ev.Promoted):
        forced = " (forced past the shadow gate)" if p.forced else ""
        return f"promoted {p.version}" + (f" over {p.previous}" if p.previous else "") + forced
    if isinstance(p, ev.RolledBack):
        target = f" to {p.to_version}" if p.to_version else ""
        return f"rolled back {p.version}{target}: {p.reason}"
    if isinstance(p, ev.Retired):
        return f"retired {p.version}"
    if isinstance(p, ev.FallbackSet):
        why = f" ({p.reason})" if p.reason else ""
        if p.fallback is None:
            return f"fallback cleared{why}"
        return f"fallback set to {p.fallback}{why}"
    if isinstance(p, ev.PoolAssigned):
        why = f" ({p.reason})" if p.reason else ""
        return f"placed in {'pool ' + p.pool if p.pool else 'the default pool'}{why}"
    if isinstance(p, ev.RoutingRuleSet):
        who = f"tenant {p.tenant}" if p.tenant else "everyone"
        if p.version is not None:
            return f"rule {p.rule_id}: pin {who} to {p.version}"
        if p.weights:
            return f"rule {p.rule_id}: experiment for {who}, {_weights(p.weights)}"
        return f"rule {p.rule_id} cleared"
    if isinstance(p, ev.VersionLoaded):
        grown = f", +{p.rss_bytes / 2**20:.0f} MiB resident" if p.rss_bytes is not None else ""
        return f"{p.version} loaded on {p.worker_id} in {p.load_ms:.0f} ms{grown}"
    return f"{p.version} unloaded from {p.worker_id}" + (f": {p.reason}" if p.reason else "")
