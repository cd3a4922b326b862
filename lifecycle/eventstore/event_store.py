"""The lifecycle event store: append-only streams (one per model) in PostgreSQL.

An append is one transaction: it locks the stream's row in `streams` and checks the expected
version under that lock, inserts the events and their outbox rows, rewrites the stream's
projections from the fold of all its events, and notifies the outbox relay. Either all of it
commits or none of it does, so the log, the outbox and the projections never disagree.

Each store keeps the streams it has read, folded, and reads only the events past them: events are
never changed or deleted, and a stream's committed events are always a prefix of it (appends to
one stream are serialised by its row lock), so a cached fold at sequence N stays true. Without it
an append read and folded the whole stream, and a long-lived stream (worker load reports pile up)
made every append slower (docs/decisions/006). Should the database lose commits (a restore, a
failover to a replica that lagged), an append finds the stream behind its cache, drops the cache
and conflicts once; the caller's retry reads the log afresh.

Times come from the database clock (`clock_timestamp()` once the lock is held, truncated to
milliseconds as on Kafka), never from a client's: one clock orders every writer. Each append of a
stream is at least a millisecond after the one before (the events of one append share a time),
so `read(until=T)` is always a prefix of the stream and tells appends apart.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, errors
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.errors import ConcurrencyConflictError, LifecycleError
from tidegate.lifecycle.domain.events import NewEvent, RecordedEvent, payload_to_dict
from tidegate.lifecycle.domain.state import ModelState, apply, fold
from tidegate.lifecycle.eventstore import projections
from tidegate.lifecycle.eventstore.eventrows import SELECT_EVENTS, read_stream, row_to_event

__all__ = ["NOTIFY_CHANNEL", "EventStore"]

NOTIFY_CHANNEL = "tidegate_lifecycle"
"""Appends notify this channel with their schema's name, to wake the relay at once."""

_SEQUENCE_KEY = "events_stream_sequence_key"


async def _one(cur: AsyncCursor[Any]) -> tuple[Any, ...]:
    row = await cur.fetchone()
    if row is None:
        raise LifecycleError("the event store returned no row where one was certain")
    return tuple(row)


@dataclass(frozen=True, slots=True)
class _Folded:
    """A committed prefix of a stream, as read back from the database, and its fold."""

    events: tuple[RecordedEvent, ...]
    state: ModelState


class EventStore:
    """Appends to and reads the model streams; `stream` is the model name throughout."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool
        self._folded: dict[str, _Folded] = {}
        self.events_read = 0
        """Event rows read back to fold streams, since creation (how the cache is observed)."""

    async def append(
        self, stream: str, events: Sequence[NewEvent], *, expected_version: int | None
    ) -> list[RecordedEvent]:
        """Append `events` atomically, after the stream's last event.

        `expected_version` is the stream version the caller decided on (0: the stream must not
        exist yet); if the stream moved on, nothing is written and `ConcurrencyConflictError`
        says so. None skips the check, for facts that hold whatever the state (a worker
        reporting a load). Returns the events as stored.
        """
        if not events:
            raise LifecycleError(f"nothing to append to {stream!r}")
        try:
            async with connection(self.pool) as conn, conn.transaction():
                recorded, folded = await self._append(conn, stream, events, expected_version)
            self._remember(stream, folded)  # committed: what it read is now true for everyone
            return recorded
        except errors.UniqueViolation as exc:
            # Unreachable while every writer goes through the row lock; the constraint is the
            # backstop for one that does not.
            if exc.diag.constraint_name != _SEQUENCE_KEY:
                raise
            actual = await self.version(stream)
            raise ConcurrencyConflictError(
                stream, actual if expected_version is None else expected_version, actual
            ) from exc

    async def _append(
        self,
        conn: AsyncConnection[Any],
        stream: str,
        events: Sequence[NewEvent],
        expected: int | None,
    ) -> tuple[list[RecordedEvent], _Folded]:
        await conn.execute(
            "INSERT INTO streams (stream) VALUES (%s) ON CONFLICT (stream) DO NOTHING", (stream,)
        )
        cur = await conn.execute(
            "SELECT version FROM streams WHERE stream = %s FOR UPDATE", (stream,)
        )
        # The row was inserted above or by a committed writer, and rows are never deleted.
        version = int((await _one(cur))[0])
        cached = self._folded.get(stream)
        if cached is not None and cached.state.sequence > version:
            # Only if the database went back in time (a restore, a failover that lost commits):
            # what this store read is no longer the log.
            del self._folded[stream]
        if expected is not None and expected != version:
            raise ConcurrencyConflictError(stream, expected, version)
        # The clock is read after the lock is held: a writer that waited gets a later time.
        cur = await conn.execute(
            "UPDATE streams SET version = %s, updated_at = greatest("
            "date_trunc('milliseconds', clock_timestamp()), updated_at + interval '1 ms') "
            "WHERE stream = %s RETURNING updated_at",
            (version + len(events), stream),
        )
        at: datetime = (await _one(cur))[0]
        recorded: list[RecordedEvent] = []
        for offset, new in enumerate(events, start=1):
            event_id = uuid.uuid4()
            cur = await conn.execute(
                "INSERT INTO events (event_id, stream, sequence, type, payload, actor, "
                "occurred_at, causation_id, correlation_id) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING position",
                (
                    event_id,
                    stream,
                    version + offset,
                    new.type,
                    Jsonb(payload_to_dict(new.payload)),
                    new.actor,
                    at,
                    new.causation_id,
                    new.correlation_id,
                ),
            )
            row = await _one(cur)
            recorded.append(
                RecordedEvent(
                    event_id=event_id,
                    stream=stream,
                    sequence=version + offset,
                    position=int(row[0]),
                    occurred_at=at,
                    payload=new.payload,
                    actor=new.actor,
                    causation_id=new.causation_id,
                    correlation_id=new.correlation_id,
                )
            )
        await conn.execute(
            "INSERT INTO outbox (position) SELECT unnest(%s::bigint[])",
            ([e.position for e in recorded],),
        )
        # Read back (not the objects in hand) so the projections fold exactly what a rebuild
        # from the table would.
        folded = await self._fold(conn, stream)
        await projections.write(conn, stream, folded.events, recorded, state=folded.state)
        await conn.execute("SELECT pg_notify(%s, current_schema())", (NOTIFY_CHANNEL,))
        return recorded, folded

    async def _fold(self, conn: AsyncConnection[Any], stream: str) -> _Folded:
        """Every event of `stream` visible to `conn`, and their fold, reading only the events
        past the cached prefix."""
        cached = self._folded.get(stream) or _Folded((), ModelState(stream))
        new = await read_stream(conn, stream, after=cached.state.sequence)
        if new and new[0].sequence != cached.state.sequence + 1:
            # A gap means the cache does not match the log (see `_append`): read it all again.
            cached = _Folded((), ModelState(stream))
            new = await read_stream(conn, stream)
        self.events_read += len(new)
        state = cached.state
        for event in new:
            state = apply(state, event)
        return _Folded((*cached.events, *new), state) if new else cached

    def _remember(self, stream: str, folded: _Folded) -> None:
        """Keep `folded` (committed) unless a longer prefix is already kept."""
        current = self._folded.get(stream)
        if current is None or folded.state.sequence > current.state.sequence:
            self._folded[stream] = folded

    async def read(self, stream: str, *, until: datetime | None = None) -> list[RecordedEvent]:
        """The stream's events in order; with `until`, only those that occurred by then."""
        if until is not None:
            async with connection(self.pool) as conn:
                return await read_stream(conn, stream, until)
        return list((await self._load(stream)).events)

    async def load(self, stream: str, *, until: datetime | None = None) -> ModelState:
        """The model's state folded from its events (as it was at `until`, if given)."""
        if until is not None:
            return fold(stream, await self.read(stream, until=until))
        return (await self._load(stream)).state

    async def _load(self, stream: str) -> _Folded:
        async with connection(self.pool) as conn:
            folded = await self._fold(conn, stream)
        self._remember(stream, folded)
        return folded

    async def version(self, stream: str) -> int:
        """The stream's version: its last sequence, 0 if it has no events."""
        async with connection(self.pool) as conn:
            cur = await conn.execute("SELECT version FROM streams WHERE stream = %s", (stream,))
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def streams(self) -> list[str]:
        """Every stream (model) with at least one event, by name."""
        async with connection(self.pool) as conn:
            cur = await conn.execute("SELECT stream FROM streams WHERE version > 0 ORDER BY stream")
            return [str(row[0]) for row in await cur.fetchall()]

    async def read_all(self, *, after_position: int = 0, limit: int = 1000) -> list[RecordedEvent]:
        """Events of every stream in position order, for catch-up readers.

        Positions are allocated before commit, so a slow transaction can commit a position
        below one already read: a reader that must see everything follows the outbox (or
        Kafka), not this.
        """
        async with connection(self.pool) as conn:
            cur = await conn.execute(
                SELECT_EVENTS + " WHERE position > %s ORDER BY position LIMIT %s",
                (after_position, limit),
            )
            return [row_to_event(row) for row in await cur.fetchall()]
