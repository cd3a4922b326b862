"""JSON views of lifecycle states, events and lineage.

The CLI's `--json` and the admin API print the same views, so a script written against one works
against the other. Every value is plain JSON: times are ISO-8601 strings in UTC, ids strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, Rule, VersionState
from tidegate.lifecycle.domain.views import describe

__all__ = [
    "event_view",
    "iso",
    "rule_view",
    "state_view",
    "summary_view",
    "table_view",
    "version_lineage",
    "version_view",
]


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def version_view(v: VersionState) -> dict[str, Any]:
    return {
        "version": v.version,
        "status": v.status.value,
        "runtime": v.runtime,
        "artifact_uri": v.artifact_uri,
        "sha256": dict(v.sha256),
        "registered_at": iso(v.registered_at),
        "registered_by": v.registered_by,
        "weight": v.weight,
        "shadow_rate": v.shadow_rate,
        "loaded_on": sorted(v.loaded_on),
        "ready": v.ready,
        "reason": v.reason,
        "updated_at": iso(v.updated_at),
    }


def rule_view(rule: Rule) -> dict[str, Any]:
    return {
        "rule_id": rule.rule_id,
        "kind": rule.kind,
        "tenant": rule.tenant,
        "version": rule.version,
        "weights": dict(rule.weights),
    }


def state_view(state: ModelState) -> dict[str, Any]:
    canary = state.canary
    return {
        "model": state.model,
        "sequence": state.sequence,
        "primary": state.primary,
        "previous_primary": state.previous_primary,
        "weights": state.intended_weights(),
        "effective_weights": state.effective_weights(),
        "shadows": state.shadows(),
        "canary": None
        if canary is None
        else {
            "version": canary.version,
            "baseline": canary.baseline,
            "steps": list(canary.steps),
            "dwell_s": canary.dwell_s,
            "thresholds": dict(canary.thresholds),
            "started_at": iso(canary.started_at),
            "step": canary.step,
            "step_at": iso(canary.step_at),
        },
        "rules": [rule_view(r) for r in state.rules],
        "fallback": state.fallback_model,
        "pool": state.pool,
        "versions": [version_view(v) for v in state.versions],
        "updated_at": iso(state.updated_at),
    }


def summary_view(state: ModelState) -> dict[str, Any]:
    """One line of `models list`."""
    return {
        "model": state.model,
        "sequence": state.sequence,
        "primary": state.primary,
        "weights": state.intended_weights(),
        "shadows": state.shadows(),
        "canary": state.canary.version if state.canary else None,
        "versions": {v.version: v.status.value for v in state.versions},
        "rules": len(state.rules),
        "fallback": state.fallback_model,
        "pool": state.pool,
        "updated_at": iso(state.updated_at),
    }


def table_view(table: RoutingTable) -> dict[str, Any]:
    """The routing table a worker would have routed by (effective weights: warm versions only)."""
    return {
        "model": table.model,
        "sequence": table.sequence,
        "primary": table.primary,
        "weights": dict(table.weights),
        "shadows": dict(table.shadows),
        "rules": [rule_view(r) for r in table.rules],
        "servable": sorted(table.servable),
        "fallback": table.fallback_model,
        "pool": table.pool,
    }


def event_view(event: ev.RecordedEvent) -> dict[str, Any]:
    return {
        "sequence": event.sequence,
        "position": event.position,
        "type": event.type,
        "occurred_at": iso(event.occurred_at),
        "actor": event.actor,
        "summary": describe(event.payload),
        "payload": ev.payload_to_dict(event.payload),
        "event_id": str(event.event_id),
        "causation_id": str(event.causation_id) if event.causation_id else None,
        "correlation_id": str(event.correlation_id) if event.correlation_id else None,
    }


def version_lineage(events: Iterable[ev.RecordedEvent], version: str) -> dict[str, Any]:
    """Where a version came from and what happened to it, from its model's events alone:
    artifact and hashes, who registered, validated, promoted, rolled back and retired it."""
    out: dict[str, Any] = {"version": version, "events": []}
    for event in events:
        p = event.payload
        mentions = getattr(p, "version", None) == version or (
            isinstance(p, ev.Promoted | ev.RolledBack)
            and version in (getattr(p, "previous", None), getattr(p, "to_version", None))
        )
        if not mentions:
            continue
        out["events"].append({"sequence": event.sequence, "type": event.type})
        at, by = iso(event.occurred_at), event.actor
        if isinstance(p, ev.ModelRegistered):
            out.update(
                artifact_uri=p.artifact_uri,
                sha256=dict(p.sha256),
                runtime=p.runtime,
                description=p.description,
                registered_at=at,
                registered_by=by,
            )
        elif isinstance(p, ev.ArtifactValidated):
            out.update(validated_at=at, load_ms=p.load_ms, device=p.device)
        elif isinstance(p, ev.ValidationFailed):
            out.update(validation_failed_at=at, validation_failed=p.reason)
        elif isinstance(p, ev.Promoted) and p.version == version:
            out.update(promoted_at=at, promoted_by=by, forced=p.forced, agreement=p.agreement)
        elif isinstance(p, ev.RolledBack) and p.version == version:
            out.update(rolled_back_at=at, rolled_back_by=by, rollback_reason=p.reason)
        elif isinstance(p, ev.Retired):
            out.update(retired_at=at, retired_by=by)
        if event.correlation_id:
            out.setdefault("correlation_ids", []).append(str(event.correlation_id))
    return out
