"""Rich renderings of the lifecycle's JSON views (`tidegate.lifecycle.domain.render`).

Tables are drawn from the very dictionaries `--json` prints, so the two outputs cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = [
    "compare_table",
    "history_table",
    "list_table",
    "result_render",
    "served_render",
    "state_at_render",
    "status_render",
]


def _weights(weights: Mapping[str, Any]) -> str:
    return ", ".join(f"{v}={w}" for v, w in sorted(weights.items())) or "-"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def list_table(models: list[dict[str, Any]]) -> RenderableType:
    table = Table("model", "primary", "weights", "shadows", "canary", "versions", "seq", "updated")
    for m in models:
        table.add_row(
            m["model"],
            _cell(m["primary"]),
            _weights(m["weights"]),
            _weights(m["shadows"]),
            _cell(m["canary"]),
            ", ".join(f"{v}:{s}" for v, s in m["versions"].items()),
            str(m["sequence"]),
            _cell(m["updated_at"]),
        )
    if not models:
        return Text("no models registered")
    return table


def status_render(state: dict[str, Any]) -> RenderableType:
    title = (
        f"{state['model']}  primary={_cell(state['primary'])}  "
        f"previous={_cell(state['previous_primary'])}  "
        f"fallback={_cell(state.get('fallback'))}  sequence={state['sequence']}"
    )
    versions = Table(title=title)
    for column in ("version", "status", "weight", "effective", "shadow", "loaded on", "by"):
        # Short cells stay whole; the free-text reason takes what width is left.
        versions.add_column(column, no_wrap=True, min_width=min(len(column), 9))
    versions.add_column("reason")
    effective = state["effective_weights"]
    for v in state["versions"]:
        versions.add_row(
            v["version"],
            v["status"],
            str(v["weight"]),
            str(effective.get(v["version"], 0)),
            _cell(v["shadow_rate"]),
            ", ".join(v["loaded_on"]) or "-",
            v["registered_by"],
            v["reason"] or "",
        )
    parts: list[RenderableType] = [versions]
    canary = state["canary"]
    if canary:
        step = canary["step"]
        at = "waiting for warm-up" if step < 0 else f"{canary['steps'][step]}%"
        parts.append(
            Text(
                f"canary {canary['version']} over {canary['baseline']}: steps "
                f"{canary['steps']} every {canary['dwell_s']:g}s, now {at}; thresholds "
                f"{_weights(canary['thresholds'])}"
            )
        )
    if state["rules"]:
        rules = Table("rule", "kind", "tenant", "version", "weights", title="routing rules")
        for r in state["rules"]:
            rules.add_row(
                r["rule_id"], r["kind"], _cell(r["tenant"]), _cell(r["version"]),
                _weights(r["weights"]) if r["weights"] else "-",
            )  # fmt: skip
        parts.append(rules)
    return Group(*parts)


def history_table(events: list[dict[str, Any]], title: str = "") -> RenderableType:
    table = Table("seq", "at", "actor", "what", title=title or None)
    for e in events:
        at = (e["occurred_at"] or "")[:23].replace("T", " ")
        table.add_row(str(e["sequence"]), at, e["actor"], e["summary"])
    return table


def result_render(result: dict[str, Any]) -> RenderableType:
    """What a write command did: its events (or why nothing was appended), then the state."""
    parts: list[RenderableType] = []
    if result.get("action") == "unchanged":
        parts.append(Text(f"{result['model']} {result['version']} is already registered"))
    if result.get("gate"):
        parts.append(Text(f"gate: {result['gate']['reason']}"))
    if result["events"]:
        parts.append(history_table(result["events"], title="appended"))
    parts.append(status_render(result["state"]))
    return Group(*parts)


def compare_table(data: dict[str, Any]) -> RenderableType:
    table = Table("stat", "value", title=f"{data['model']} {data['candidate']} vs the primary")
    for key, value in data["stats"].items():
        if key not in ("model", "candidate"):
            table.add_row(key, _cell(value))
    gate = data["gate"]
    verdict = "passes" if gate["passed"] else "fails"
    return Group(table, Text(f"promotion gate {verdict}: {gate['reason']}"))


def state_at_render(data: dict[str, Any]) -> RenderableType:
    table = data["table"]
    routing = Table("version", "weight", "shadow", title=f"routing table at {data['at']}")
    shadows = table["shadows"]
    for version in sorted(set(table["weights"]) | set(shadows)):
        routing.add_row(version, str(table["weights"].get(version, 0)), _cell(shadows.get(version)))
    return Group(routing, status_render(data["state"]))


_SERVED_FIELDS = (
    ("model", "model"),
    ("version", "version"),
    ("status", "status"),
    ("error_code", "error"),
    ("routing_rule", "rule"),
    ("tenant", "tenant"),
    ("routing_key", "routing key"),
    ("worker_id", "worker"),
    ("completed_at", "completed at"),
    ("total_ms", "total ms"),
    ("request_schema_id", "request schema id"),
    ("request_digest", "request digest"),
    ("attempt", "attempt"),
)
_SERVED_SHOWN = {"request_id", "source", "origin", "history", "conflicts"} | {
    key for key, _ in _SERVED_FIELDS
}


def _position(position: Mapping[str, Any] | None) -> str:
    """`topic:partition:offset`, as the redelivery headers write it."""
    if not position:
        return "-"
    return f"{position['topic']}:{position['partition']}:{position['offset']}"


def served_render(data: dict[str, Any]) -> RenderableType:
    """Who served the request and how it got there: where it was read, its schema and digest,
    the attempt, every redelivery step, and a warning when its id was reused for other
    content; then the version's lineage and the routing table as it stood then."""
    request = data["request"]
    table = Table("field", "value", title=f"request {request['request_id']}")
    for key, label in _SERVED_FIELDS:
        if key in request:
            table.add_row(label, _cell(request[key]))
    table.add_row("source", _position(request.get("source")))
    origin = request.get("origin")
    if origin and origin != request.get("source"):
        table.add_row("origin", _position(origin))
    for key, value in request.items():  # anything newer than this rendering
        if key not in _SERVED_SHOWN:
            table.add_row(key, _cell(value))
    lineage = data.get("lineage") or {}
    for key in ("artifact_uri", "registered_at", "registered_by", "promoted_at", "promoted_by"):
        if key in lineage:
            table.add_row(f"version {key}", _cell(lineage[key]))
    parts: list[RenderableType] = [table]
    conflicts = request.get("conflicts") or []
    if conflicts:
        parts.append(_conflicts_render(request, conflicts))
    history = request.get("history") or []
    if history:
        steps = Table("#", "kind", "at", "from", "run", "reason", title="redelivery history")
        for n, step in enumerate(history, 1):
            at = (step.get("at") or "")[:23].replace("T", " ")
            steps.add_row(
                str(n), step["kind"], at, _position(step.get("from")),
                _cell(step.get("id")), _cell(step.get("reason")),
            )  # fmt: skip
        parts.append(steps)
    at = {"at": data["state_at"], "table": data["table"], "state": data["state"]}
    parts.append(state_at_render(at))
    return Group(*parts)


def _conflicts_render(request: Mapping[str, Any], conflicts: list[dict[str, Any]]) -> Text:
    text = Text(
        f"CONFLICT: request id {request['request_id']} was also used for other content "
        f"(served digest {request.get('request_digest') or '-'}); not served, only recorded:",
        style="bold red",
    )
    for c in conflicts:
        text.append(
            f"\n  digest {c['digest']}: {c['model']} {c['version'] or '-'} {c['status']} on "
            f"{c['worker_id'] or '-'}, read from {_position(c.get('source'))}, completed "
            f"{c['completed_at']}, detected {c['detected_at']}",
            style="red",
        )
    return text
