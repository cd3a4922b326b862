"""The transactional outbox relay: publishes committed lifecycle events to Kafka, in order.

An append writes its events and their `outbox` rows in one transaction, so every committed event
is eventually published and nothing uncommitted ever is. The relay takes a transaction-scoped
advisory lock (one publisher per schema at a time, which keeps the order), selects unpublished
rows by position, produces them keyed by model with an idempotent producer, waits until Kafka
acknowledged every one, and only then marks them published in the same transaction.

A crash after Kafka acknowledged and before the mark committed republishes the events on the next
flush: delivery is at least once, and consumers drop duplicates by (stream, sequence) as
`tidegate.lifecycle.domain.state.apply` does. Within one model, a duplicate always follows its
original (events of a model are published in sequence order), so deduplicating by the last sequence
seen suffices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Message, Producer
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from tidegate.core.aio import cancel_and_wait
from tidegate.core.db import connection
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings
from tidegate.lifecycle.domain.events import RecordedEvent
from tidegate.lifecycle.eventstore.event_store import NOTIFY_CHANNEL
from tidegate.lifecycle.eventstore.eventrows import SELECT_EVENTS, row_to_event

__all__ = ["OutboxRelay"]

log = logging.getLogger(__name__)

# One lock per schema: tests (and tenants) with schemas of their own never wait for each other.
_LOCK_KEY = "hashtext('tidegate.lifecycle.outbox.' || current_schema())"
_TRY_LOCK = f"SELECT pg_try_advisory_xact_lock({_LOCK_KEY})"
_WAIT_LOCK = f"SELECT pg_advisory_xact_lock({_LOCK_KEY})"
_UNPUBLISHED = "SELECT position FROM outbox WHERE published_at IS NULL ORDER BY position LIMIT %s"
_PENDING = f"{SELECT_EVENTS} WHERE position IN ({_UNPUBLISHED}) ORDER BY position"


class OutboxRelay:
    """Publishes the outbox to `topic`. `flush()` publishes what is pending now; `start()` also
    runs a loop that flushes on every append's NOTIFY and every `poll_s` seconds.

    `encode` turns an event into the message value (`LifecycleCodec.encode` in production).
    `after_publish` runs after Kafka acknowledged a batch and before it is marked published:
    the window a crash test aims at.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        kafka: KafkaSettings,
        topic: str,
        encode: Callable[[RecordedEvent], bytes],
        *,
        poll_s: float = 0.5,
        batch_size: int = 500,
        delivery_timeout_s: float = 30.0,
        after_publish: Callable[[list[RecordedEvent]], None] | None = None,
    ) -> None:
        self.pool = pool
        self.topic = topic
        self._kafka = kafka
        self._encode = encode
        self._poll_s = poll_s
        self._batch_size = batch_size
        self._delivery_timeout_s = delivery_timeout_s
        self._after_publish = after_publish
        self._producer: Producer | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Create the producer (idempotent, acks=all); `flush` needs it."""
        if self._producer is None:
            timeout_ms = int(self._delivery_timeout_s * 1000)
            self._producer = make_producer(self._kafka, {"message.timeout.ms": timeout_ms})

    async def close(self) -> None:
        """Stop the loop if running, and hand what the producer still holds to Kafka."""
        await self._stop_loop()
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(producer.flush, self._delivery_timeout_s)

    async def start(self) -> None:
        """Open, and run the publishing loop in the background until `stop()`."""
        await self.open()
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name=f"outbox-relay-{self.topic}")

    async def stop(self) -> None:
        await self.close()

    async def __aenter__(self) -> OutboxRelay:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def _stop_loop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])

    async def flush(self, *, wait: bool = True) -> int:
        """Publish every pending event; returns how many were published.

        With `wait`, queue behind a publisher that holds the lock (so an event committed before
        this call is on Kafka when it returns); without, return 0 at once if another holds it.
        Raises `LifecycleUnavailableError` if Kafka or PostgreSQL failed; nothing unacknowledged
        is ever marked published.
        """
        if self._producer is None:
            raise RuntimeError("OutboxRelay.flush() before open()")
        total = 0
        while True:
            published = await self._flush_batch(self._producer, wait)
            total += published
            if published < self._batch_size:
                return total

    async def _flush_batch(self, producer: Producer, wait: bool) -> int:
        async with connection(self.pool) as conn, conn.transaction():
            if not await self._lock(conn, wait):
                return 0
            cur = await conn.execute(_PENDING, (self._batch_size,))
            pending = [row_to_event(row) for row in await cur.fetchall()]
            if not pending:
                return 0
            batch, values = self._encoded(pending)
            if not batch:
                return 0
            await asyncio.to_thread(self._publish, producer, batch, values)
            if self._after_publish is not None:
                self._after_publish(batch)
            await conn.execute(
                "UPDATE outbox SET published_at = clock_timestamp() WHERE position = ANY(%s)",
                ([e.position for e in batch],),
            )
            return len(batch)

    async def _lock(self, conn: AsyncConnection[Any], wait: bool) -> bool:
        if not wait:
            cur = await conn.execute(_TRY_LOCK)
            row = await cur.fetchone()
            return bool(row and row[0])
        # A publisher stuck on Kafka holds the lock up to the delivery timeout; wait a bit more,
        # then fail as unavailable (lock_timeout) rather than hang.
        timeout_ms = int(self._delivery_timeout_s * 1000) + 5000
        await conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{timeout_ms}ms",))
        await conn.execute(_WAIT_LOCK)
        return True

    def _encoded(self, pending: list[RecordedEvent]) -> tuple[list[RecordedEvent], list[bytes]]:
        """The pending events that can be encoded, with their values. An event that cannot (its
        schema is not registered yet, the registry is away) holds back its own model's later
        events only, so that model's order is kept and every other model's events go out; it is
        tried again on the next flush."""
        held: set[str] = set()
        batch: list[RecordedEvent] = []
        values: list[bytes] = []
        for event in pending:
            if event.stream in held:
                continue
            try:
                values.append(self._encode(event))
            except Exception:
                held.add(event.stream)
                log.exception(
                    "lifecycle event %s/%d (%s) cannot be encoded; %s's events wait for it",
                    event.stream,
                    event.sequence,
                    event.type,
                    event.stream,
                )
                continue
            batch.append(event)
        return batch, values

    def _publish(self, producer: Producer, batch: list[RecordedEvent], values: list[bytes]) -> None:
        """Produce and wait for every acknowledgement (runs in a thread: both block)."""
        failures: list[str] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(f"{msg.key()!r}: {err}")

        for event, value in zip(batch, values, strict=True):
            while True:
                try:
                    producer.produce(
                        self.topic,
                        key=event.stream.encode(),
                        value=value,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
        left = producer.flush(self._delivery_timeout_s + 1.0)
        if failures or left:
            detail = "; ".join(failures[:3]) or f"{left} not acknowledged"
            raise LifecycleUnavailableError(f"publishing lifecycle events failed: {detail}")

    async def run(self) -> None:
        """Flush on every NOTIFY of an append and at least every `poll_s`, until cancelled.

        The loop outlives outages: failures are logged and retried on the next wake-up.
        """
        await self.open()
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.pool.conninfo, autocommit=True
                ) as listener:
                    await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while True:
                        await self._flush_logged()
                        # Any schema's append wakes us; a needless flush costs one query.
                        async for _ in listener.notifies(timeout=self._poll_s, stop_after=1):
                            pass
            except psycopg.OperationalError as exc:
                log.warning("outbox relay lost PostgreSQL (%s); retrying", exc)
                await asyncio.sleep(self._poll_s)

    async def _flush_logged(self) -> None:
        try:
            published = await self.flush(wait=False)
        except Exception:
            # The relay must outlive Kafka and PostgreSQL outages and a poison event alike; the
            # events stay pending and the next wake-up tries again.
            log.exception("outbox relay flush failed; retrying in %.1fs", self._poll_s)
            await asyncio.sleep(self._poll_s)
        else:
            if published:
                log.debug("outbox relay published %d lifecycle events", published)
