"""The transactional outbox against the real PostgreSQL and Kafka: order, keys, wake-ups,
failures, and publishers killed between commit and publish and between publish and mark."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg_pool import AsyncConnectionPool

from tests.integration.outbox_crash import CRASH_EXIT, decode_json, encode_json
from tests.kafka_support import read_topic
from tests.support import free_port, unique, wait_for
from tidegate.core.errors import LifecycleUnavailableError
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, apply
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.readmodels.feed import LifecycleFeed

ROOT = Path(__file__).resolve().parents[3]
Pool = AsyncConnectionPool[Any]


def registered(version: str) -> ev.ModelRegistered:
    return ev.ModelRegistered(version, "onnx", f"file:///m/{version}", {"model.onnx": version})


async def topic_events(kafka: KafkaSettings, topic: str) -> list[ev.RecordedEvent]:
    messages = await asyncio.to_thread(read_topic, kafka, topic)
    return [decode_json(m.value()) for m in messages]


def dedupe(events: list[ev.RecordedEvent], model: str) -> tuple[ModelState, list[int]]:
    """Fold as any consumer does (lifecycle.state.apply); the sequences it really applied."""
    state, applied = ModelState(model), []
    for event in events:
        after = apply(state, event)
        if after is not state:
            applied.append(event.sequence)
        state = after
    return state, applied


async def unpublished(pool: Pool) -> list[int]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT position FROM outbox WHERE published_at IS NULL ORDER BY position"
        )
        return [row[0] for row in await cur.fetchall()]


def relay(pool: Pool, kafka: KafkaSettings, topic: str, **kwargs: Any) -> OutboxRelay:
    return OutboxRelay(pool, kafka, topic, kwargs.pop("encode", encode_json), **kwargs)


async def test_flush_publishes_in_order_keyed_by_model(
    pg_pool: Pool, kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("h1-outbox", 3)
    store = EventStore(pg_pool)
    models = ["fraud", "minilm", "resnet", "bert"]
    for i in range(3):
        for model in models:
            await store.append(model, [ev.NewEvent(registered(f"v{i}"))], expected_version=i)
    # Small batches: order must hold across them too.
    async with relay(pg_pool, kafka_settings, topic, batch_size=5) as outbox:
        assert await outbox.flush() == 12
        assert await outbox.flush() == 0
    assert await unpublished(pg_pool) == []

    messages = await asyncio.to_thread(read_topic, kafka_settings, topic)
    assert len(messages) == 12
    partition_of: dict[str, set[int]] = defaultdict(set)
    sequences: dict[str, list[int]] = defaultdict(list)
    positions: dict[int, list[int]] = defaultdict(list)
    for msg in messages:
        event = decode_json(msg.value())
        assert msg.key() == event.stream.encode()
        partition = msg.partition()
        assert partition is not None
        partition_of[event.stream].add(partition)
        sequences[event.stream].append(event.sequence)
        positions[partition].append(event.position)
    assert all(len(p) == 1 for p in partition_of.values())  # keyed: one partition per model
    assert dict(sequences) == {model: [1, 2, 3] for model in models}
    assert all(ps == sorted(ps) for ps in positions.values())  # position order on the topic


async def test_the_relay_loop_wakes_on_an_append(
    pg_pool: Pool, kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("h1-outbox")
    store = EventStore(pg_pool)
    outbox = relay(pg_pool, kafka_settings, topic, poll_s=120.0)
    await outbox.start()
    try:
        await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
        await asyncio.to_thread(
            wait_for, lambda: len(read_topic(kafka_settings, topic)) == 1, timeout=30
        )
        # The loop now waits on LISTEN; only the append's NOTIFY (not the 120 s poll) can
        # bring the next event out within the deadline.
        await store.append("fraud", [ev.NewEvent(registered("v2"))], expected_version=1)
        await asyncio.to_thread(
            wait_for, lambda: len(read_topic(kafka_settings, topic)) == 2, timeout=20
        )
    finally:
        await outbox.stop()
    assert await unpublished(pg_pool) == []


async def test_a_failed_delivery_is_never_marked_published(
    pg_pool: Pool, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("h1-outbox")
    store = EventStore(pg_pool)
    dead_kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    dead = relay(pg_pool, dead_kafka, topic, delivery_timeout_s=1.0)
    log = LifecycleLog(store, dead)
    await dead.open()
    try:
        # The commit counts; the failed publish is only logged.
        recorded = await log.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
        assert await unpublished(pg_pool) == [recorded[0].position]
        with pytest.raises(LifecycleUnavailableError):
            await dead.flush()
        assert await unpublished(pg_pool) == [recorded[0].position]
    finally:
        await dead.close()


async def test_an_event_that_cannot_be_encoded_holds_back_only_its_own_model(
    pg_pool: Pool, kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("outbox-held")
    store = EventStore(pg_pool)
    for i in range(3):
        for model in ("good", "bad"):
            await store.append(model, [ev.NewEvent(registered(f"v{i}"))], expected_version=i)
    broken = {("bad", 2)}

    def encode(event: ev.RecordedEvent) -> bytes:
        if (event.stream, event.sequence) in broken:
            raise ValueError("no schema for this event yet")
        return encode_json(event)

    async with relay(pg_pool, kafka_settings, topic, encode=encode) as outbox:
        assert await outbox.flush() == 4  # good 1-3 and bad 1; bad 2 and 3 wait
        broken.clear()
        assert await outbox.flush() == 2
    events = await topic_events(kafka_settings, topic)
    order = [(e.stream, e.sequence) for e in events]
    assert [seq for stream, seq in order if stream == "bad"] == [1, 2, 3]
    assert [seq for stream, seq in order if stream == "good"] == [1, 2, 3]
    assert await unpublished(pg_pool) == []


async def test_an_append_waits_for_a_stuck_publish_only_briefly(
    pg_pool: Pool, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("outbox-stuck")
    dead_kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    stuck = relay(pg_pool, dead_kafka, topic, delivery_timeout_s=20.0)
    log = LifecycleLog(EventStore(pg_pool), stuck, publish_wait_s=0.5)
    await stuck.open()
    try:
        started = time.monotonic()
        recorded = await log.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
        assert time.monotonic() - started < 5, "the append waited on Kafka's delivery timeout"
        assert await unpublished(pg_pool) == [recorded[0].position]
    finally:
        await log.stop()
    assert await unpublished(pg_pool) == [recorded[0].position]


async def test_only_one_publisher_at_a_time(
    pg_pool: Pool, kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("h1-outbox")
    store = EventStore(pg_pool)
    await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    async with relay(pg_pool, kafka_settings, topic) as outbox, pg_pool.connection() as holder:
        async with holder.transaction():
            await holder.execute(
                "SELECT pg_advisory_xact_lock(hashtext('tidegate.lifecycle.outbox.' "
                "|| current_schema()))"
            )
            assert await outbox.flush(wait=False) == 0
            assert len(await unpublished(pg_pool)) == 1
        assert await outbox.flush(wait=False) == 1
    assert len(await topic_events(kafka_settings, topic)) == 1


async def crash(mode: str, pg: PostgresSettings, topic: str, model: str) -> None:
    command = [sys.executable, "-m", "tests.integration.outbox_crash", mode]
    done = await asyncio.to_thread(
        subprocess.run,
        [*command, pg.db_schema, topic, model],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == CRASH_EXIT, done.stderr


async def test_a_crash_between_publish_and_mark_republishes_once_for_consumers(
    pg_settings: PostgresSettings,
    pg_pool: Pool,
    kafka_settings: KafkaSettings,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic("h1-outbox")
    store = EventStore(pg_pool)
    await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    async with relay(pg_pool, kafka_settings, topic) as outbox:
        assert await outbox.flush() == 1

        await crash("after-publish", pg_settings, topic, "fraud")
        # Kafka has the event, the outbox still says it is pending.
        on_topic = await topic_events(kafka_settings, topic)
        assert [e.sequence for e in on_topic] == [1, 2]
        stored = await store.read("fraud")
        assert await unpublished(pg_pool) == [stored[1].position]

        # The restarted publisher sends it again: the topic physically holds it twice...
        assert await outbox.flush() == 1
    assert await unpublished(pg_pool) == []
    on_topic = await topic_events(kafka_settings, topic)
    assert [e.sequence for e in on_topic] == [1, 2, 2]
    assert on_topic[1].event_id == on_topic[2].event_id == stored[1].event_id
    # ...and a consumer deduplicating by sequence sees it exactly once.
    state, applied = dedupe(on_topic, "fraud")
    assert applied == [1, 2]
    assert state == await store.load("fraud")


async def test_a_crash_between_commit_and_publish_publishes_after_restart(
    pg_settings: PostgresSettings,
    pg_pool: Pool,
    kafka_settings: KafkaSettings,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic("h1-outbox")
    store = EventStore(pg_pool)
    await crash("before-publish", pg_settings, topic, "fraud")
    stored = await store.read("fraud")
    assert [e.sequence for e in stored] == [1]
    assert await unpublished(pg_pool) == [stored[0].position]
    assert await topic_events(kafka_settings, topic) == []

    async with relay(pg_pool, kafka_settings, topic) as outbox:
        assert await outbox.flush() == 1
        assert await outbox.flush() == 0
    on_topic = await topic_events(kafka_settings, topic)
    assert [e.event_id for e in on_topic] == [stored[0].event_id]
    state, applied = dedupe(on_topic, "fraud")
    assert applied == [1]
    assert state == await store.load("fraud")


async def test_lifecycle_log_publishes_avro_that_the_feed_folds(
    pg_settings: PostgresSettings,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    new_topic: Callable[..., str],
) -> None:
    topics = TopicSettings(lifecycle=new_topic("h1-lifecycle", 2))
    client = SchemaRegistryClient(registry_settings.client_config())
    # Register the envelope under this test's topic subject, as `tidegate schemas register` does
    # for the real topic.
    probe = ev.RecordedEvent(uuid.uuid4(), "probe", 1, 1, datetime.now(UTC), registered("v0"))
    LifecycleCodec(client, topics, auto_register=True).encode(probe)

    lc = LifecycleSettings()
    async with LifecycleLog.from_settings(
        pg_settings, lc, kafka_settings, topics, registry_settings, publish=True
    ) as log:
        first = await log.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
        await log.append(
            "fraud",
            [ev.NewEvent(ev.ArtifactValidated("v1")), ev.NewEvent(ev.Promoted("v1"))],
            expected_version=1,
        )
        await log.append("minilm", [ev.NewEvent(registered("1"))], expected_version=0)
        assert await unpublished(log.pool) == []
        # Publish the first event once more, as a crash before its mark would.
        async with log.pool.connection() as conn:
            await conn.execute(
                "UPDATE outbox SET published_at = NULL WHERE position = %s",
                (first[0].position,),
            )
        assert log.relay is not None
        assert await log.relay.flush() == 1

        feed = LifecycleFeed(kafka_settings, topics, client, name=unique("h1-feed"))
        feed.start()
        try:
            await feed.caught_up(30)
            assert feed.state("fraud") == await log.load("fraud")
            assert feed.state("minilm") == await log.load("minilm")
            assert feed.stats.duplicates == 1
        finally:
            await asyncio.to_thread(feed.stop)
