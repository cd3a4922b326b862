"""Reading `events` rows back into `RecordedEvent`s: shared by the store, the outbox relay and
the projection rebuild, which all read the log inside transactions of their own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from tidegate.lifecycle.domain.events import RecordedEvent, payload_from_dict

__all__ = ["EVENT_COLUMNS", "SELECT_EVENTS", "read_stream", "row_to_event"]

EVENT_COLUMNS = (
    "position, event_id, stream, sequence, type, payload, actor, occurred_at, "
    "causation_id, correlation_id"
)
"""The columns `row_to_event` reads, in its order."""

SELECT_EVENTS = f"SELECT {EVENT_COLUMNS} FROM events"  # noqa: S608 - constant column list


def row_to_event(row: Sequence[Any]) -> RecordedEvent:
    position, event_id, stream, sequence, type_, payload, actor, at, causation, correlation = row
    return RecordedEvent(
        event_id=event_id,
        stream=stream,
        sequence=int(sequence),
        position=int(position),
        occurred_at=at,
        payload=payload_from_dict(type_, payload),
        actor=actor,
        causation_id=causation,
        correlation_id=correlation,
    )


async def read_stream(
    conn: AsyncConnection[Any], stream: str, until: datetime | None = None, *, after: int = 0
) -> list[RecordedEvent]:
    """The stream's events in sequence order: those past sequence `after`, and with `until`,
    only those that occurred by then."""
    query = SELECT_EVENTS + " WHERE stream = %s AND sequence > %s"
    params: tuple[Any, ...] = (stream, after)
    if until is not None:
        query += " AND occurred_at <= %s"
        params = (*params, until)
    cur = await conn.execute(query + " ORDER BY sequence", params)
    return [row_to_event(row) for row in await cur.fetchall()]
