"""What a request sent through the pipeline again carries: its history, in Kafka headers.

A retry (`dlq.retry_relay`), a redrive (`tidegate dlq redrive`) and a replay all publish the
request's original key, value and headers again, plus these headers, which the worker reads back
into the result's and the dead letter's lineage fields (`attempt`, `origin`, `history`):

* `tidegate-attempt`: this delivery's attempt number, 1-based (absent: 1);
* `tidegate-first-failed-at`: when the request first failed, epoch milliseconds;
* `tidegate-origin`: where the request was first read, `topic:partition:offset`;
* `tidegate-history`: the `Redelivery` records so far, oldest first, as JSON (`from` as
  `topic:partition:offset`).

A request without `tidegate-history` was never redelivered; reading its headers costs one scan
of the header list, which is empty for most requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidegate.dlq.letters import to_ms
from tidegate.schemas.records import RedeliveryRecord, SourcePositionRecord

__all__ = [
    "ATTEMPT",
    "FIRST_FAILED_AT",
    "HISTORY",
    "ORIGIN",
    "REDELIVERY_HEADERS",
    "Lineage",
    "format_position",
    "parse_position",
    "read_back",
    "read_lineage",
    "redelivery_headers",
    "retries_since_redrive",
    "step",
]

ATTEMPT = "tidegate-attempt"
FIRST_FAILED_AT = "tidegate-first-failed-at"
ORIGIN = "tidegate-origin"
HISTORY = "tidegate-history"
REDELIVERY_HEADERS = frozenset({ATTEMPT, FIRST_FAILED_AT, ORIGIN, HISTORY})

Position = SourcePositionRecord
Headers = Sequence[tuple[str, bytes | None]]


@dataclass(slots=True)
class Lineage:
    """A request's delivery history as the worker sees it."""

    attempt: int = 1
    first_failed_at_ms: int | None = None
    origin: Position | None = None
    history: list[RedeliveryRecord] = field(default_factory=list)


def format_position(position: Mapping[str, Any]) -> str:
    return f"{position['topic']}:{position['partition']}:{position['offset']}"


def parse_position(text: str) -> Position:
    """`topic:partition:offset`; the topic may itself hold colons."""
    topic, partition, offset = text.rsplit(":", 2)
    return {"topic": topic, "partition": int(partition), "offset": int(offset)}


def step(
    kind: str,
    at_ms: int,
    *,
    source: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    reason: str | None = None,
) -> RedeliveryRecord:
    """One `Redelivery` record."""
    return {
        "kind": kind,
        "at": at_ms,
        "from": _position(source) if source is not None else None,
        "id": run_id,
        "reason": reason,
    }


def read_back(item: Mapping[str, Any]) -> RedeliveryRecord:
    """A `Redelivery` record as a decoded envelope holds it (`at` a datetime), with `at` as epoch
    milliseconds again, ready to be written into headers or a new envelope."""
    at_ms = to_ms(item["at"])
    if at_ms is None:
        raise ValueError("a Redelivery record without its time")
    return step(
        str(item["kind"]),
        at_ms,
        source=item.get("from"),
        run_id=item.get("id"),
        reason=item.get("reason"),
    )


def read_lineage(headers: Headers | None) -> Lineage | None:
    """The lineage headers of a consumed request; None when it was never redelivered (or the
    headers are unreadable: a request is never refused for its history)."""
    if not headers:
        return None
    found: dict[str, bytes] = {}
    for key, value in headers:
        if key in REDELIVERY_HEADERS and value is not None:
            found[key] = value
    if not found:
        return None
    lineage = Lineage()
    try:
        if ATTEMPT in found:
            lineage.attempt = max(1, int(found[ATTEMPT]))
        if FIRST_FAILED_AT in found:
            lineage.first_failed_at_ms = int(found[FIRST_FAILED_AT])
        if ORIGIN in found:
            lineage.origin = parse_position(found[ORIGIN].decode())
        if HISTORY in found:
            lineage.history = [_from_json(item) for item in json.loads(found[HISTORY])]
    except (ValueError, TypeError, KeyError, AttributeError):
        return lineage
    return lineage


def redelivery_headers(
    original: Headers | None,
    *,
    attempt: int,
    origin: Mapping[str, Any],
    history: Iterable[Mapping[str, Any]],
    first_failed_at_ms: int | None,
) -> list[tuple[str, bytes | None]]:
    """The original headers (trace context included) with the lineage headers replaced."""
    headers = [(k, v) for k, v in original or () if k not in REDELIVERY_HEADERS]
    headers.append((ATTEMPT, str(attempt).encode()))
    headers.append((ORIGIN, format_position(origin).encode()))
    headers.append((HISTORY, json.dumps([_to_json(s) for s in history]).encode()))
    if first_failed_at_ms is not None:
        headers.append((FIRST_FAILED_AT, str(first_failed_at_ms).encode()))
    return headers


def retries_since_redrive(history: Iterable[Mapping[str, Any]]) -> int:
    """Retries since the last redrive or replay: a redrive after a fix starts a fresh budget.
    A `hold` (waiting behind an earlier request of the key) is not a retry."""
    count = 0
    for item in history:
        kind = item.get("kind")
        if kind == "retry":
            count += 1
        elif kind in ("redrive", "replay"):
            count = 0
    return count


def _position(source: Mapping[str, Any]) -> Position:
    return {
        "topic": str(source["topic"]),
        "partition": int(source["partition"]),
        "offset": int(source["offset"]),
    }


def _to_json(item: Mapping[str, Any]) -> dict[str, Any]:
    data = dict(item)
    source = data.get("from")
    data["from"] = format_position(source) if source else None
    return data


def _from_json(item: Mapping[str, Any]) -> RedeliveryRecord:
    source = item.get("from")
    return step(
        str(item["kind"]),
        int(item["at"]),
        source=parse_position(source) if source else None,
        run_id=item.get("id"),
        reason=item.get("reason"),
    )
