"""The lifecycle log: how the worker, the commands and the controller write events.

`append` commits to the event store, which also queues the events in the outbox and NOTIFYs the
controller's relay; the relay publishes them to Kafka within milliseconds. So only the controller
writes the lifecycle topic (its principal alone has WRITE there, docs/security.md), and a writer
needs no Kafka producer at all: what counts is the commit.

`publish=True` gives the log a relay of its own that publishes each append at once, for a
set-up that runs no controller (and for tests that stand in for one). That publish is best effort
and bounded: `append` waits for it at most `publish_wait_s` (Kafka down must not make every command
take the delivery timeout); the publish goes on in the background, and if it fails the
controller's relay loop (or the next append) publishes the events later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg_pool import AsyncConnectionPool

from tidegate.core.aio import cancel_and_wait
from tidegate.core.db import make_pool
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.domain.events import NewEvent, RecordedEvent
from tidegate.lifecycle.domain.state import ModelState
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["LifecycleLog"]

log = logging.getLogger(__name__)

_OPEN_TIMEOUT_S = 30.0
_PUBLISH_WAIT_S = 2.0


class LifecycleLog:
    """Event store, and an outbox relay when it publishes its own appends. Use as an async
    context manager (or `start`/`stop`).

    Built by `from_settings`, it owns its pool and closes it; given a pool, it leaves it open.
    """

    def __init__(
        self,
        store: EventStore,
        relay: OutboxRelay | None = None,
        *,
        owned_pool: AsyncConnectionPool[Any] | None = None,
        publish_wait_s: float = _PUBLISH_WAIT_S,
        require_store: bool = True,
    ) -> None:
        self.store = store
        self.relay = relay
        self._owned_pool = owned_pool
        self._require_store = require_store
        self._publish_wait = publish_wait_s
        self._publishing: set[asyncio.Task[int]] = set()

    @classmethod
    def from_settings(
        cls,
        pg: PostgresSettings,
        lc: LifecycleSettings,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistrySettings,
        *,
        require_store: bool = True,
        publish: bool = False,
    ) -> LifecycleLog:
        """`require_store=False` starts without waiting for PostgreSQL (appends fail as
        unavailable until it answers): a worker serves without it and retries its reports.
        `publish=True` publishes each append from this process too (see the module's doc)."""
        pool = make_pool(pg, lc)
        relay = None
        if publish:
            codec = LifecycleCodec(SchemaRegistryClient(registry.client_config()), topics)
            relay = OutboxRelay(
                pool, kafka, topics.lifecycle, codec.encode, poll_s=lc.outbox_poll_s
            )
        return cls(EventStore(pool), relay, owned_pool=pool, require_store=require_store)

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        return self.store.pool

    async def start(self) -> None:
        """Open the pool (if owned) and the relay's producer, if any. The relay loop is not
        started: that is the controller's job."""
        if self._owned_pool is not None and not self._require_store:
            await self._owned_pool.open(wait=False)
        elif self._owned_pool is not None:
            try:
                await self._owned_pool.open(wait=True, timeout=_OPEN_TIMEOUT_S)
            except Exception as exc:
                await self._owned_pool.close()
                raise LifecycleUnavailableError(f"cannot reach the event store: {exc}") from exc
        if self.relay is not None:
            await self.relay.open()

    async def stop(self) -> None:
        if self._publishing:
            # Give publishes in flight a moment; what is cut short stays in the outbox.
            await asyncio.wait(self._publishing, timeout=self._publish_wait)
            await cancel_and_wait(list(self._publishing))
        try:
            if self.relay is not None:
                await self.relay.close()
        finally:
            if self._owned_pool is not None:
                await self._owned_pool.close()

    async def __aenter__(self) -> LifecycleLog:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    async def append(
        self, stream: str, events: Sequence[NewEvent], *, expected_version: int | None
    ) -> list[RecordedEvent]:
        """`EventStore.append`, then publish when the log has a relay. Raises what the append
        raises (conflicts, an unavailable store); a failed publish is only logged, as the events
        are committed."""
        recorded = await self.store.append(stream, events, expected_version=expected_version)
        if self.relay is None:
            return recorded
        where = f"{stream}/{recorded[0].sequence}..{recorded[-1].sequence}"
        publish = asyncio.ensure_future(self.relay.flush())
        self._publishing.add(publish)
        publish.add_done_callback(lambda task: self._published(task, where))
        # A failed publish is logged by _published; the events are committed, the relay retries.
        done, _ = await asyncio.wait({publish}, timeout=self._publish_wait)
        if not done:
            log.warning("events %s are committed; publishing them goes on in the background", where)
        return recorded

    def _published(self, task: asyncio.Task[int], where: str) -> None:
        self._publishing.discard(task)
        if task.cancelled():
            return
        if (exc := task.exception()) is not None:
            log.warning(
                "events %s are committed but not yet published; the relay retries",
                where,
                exc_info=exc,
            )

    async def read(self, stream: str, *, until: datetime | None = None) -> list[RecordedEvent]:
        return await self.store.read(stream, until=until)

    async def load(self, stream: str, *, until: datetime | None = None) -> ModelState:
        return await self.store.load(stream, until=until)
