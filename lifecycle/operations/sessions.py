"""Opening the operator commands over the configured event store: one way for the CLI and
`/admin`, so both build the same log, pool and artifact store from the same settings.

A write session publishes each append at once through the outbox relay's producer; a read session
touches PostgreSQL alone. `wait_for_store=False` opens without waiting for PostgreSQL, for a
long-lived server (the gateway) whose other routes do not need it: commands then fail as
unavailable until it answers, instead of the server failing to start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tidegate.core.db import make_pool
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

__all__ = ["OPEN_TIMEOUT_S", "command_session"]

OPEN_TIMEOUT_S = 15.0
"""How long a read session waits for PostgreSQL before the store counts as unavailable."""


@asynccontextmanager
async def command_session(
    *,
    write: bool,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    registry: SchemaRegistrySettings | None = None,
    postgres: PostgresSettings | None = None,
    wait_for_store: bool = True,
) -> AsyncIterator[LifecycleCommands]:
    """Commands over the event store with TIDEGATE_LIFECYCLE_* and the artifact store of
    TIDEGATE_MODELS_*; Kafka, topics, registry and PostgreSQL default to the environment."""
    pg, lc, models = postgres or PostgresSettings(), LifecycleSettings(), ModelSettings()
    store = LocalArtifactStore(models)
    if write:
        log = LifecycleLog.from_settings(
            pg,
            lc,
            kafka or KafkaSettings(),
            topics or TopicSettings(),
            registry or SchemaRegistrySettings(),
            require_store=wait_for_store,
        )
        async with log:
            # One store for reads and appends: one fold cache, so a command reads its stream once.
            yield LifecycleCommands(log, log.pool, store, lc, models=models, events=log.store)
        return
    pool = make_pool(pg, lc)
    try:
        await pool.open(wait=wait_for_store, timeout=OPEN_TIMEOUT_S)
    except Exception as exc:
        await pool.close()
        raise LifecycleUnavailableError(f"cannot reach the event store: {exc}") from exc
    try:
        # Reads append nothing; the store itself stands in for the log.
        events = EventStore(pool)
        yield LifecycleCommands(events, pool, store, lc, models=models, events=events)
    finally:
        await pool.close()
