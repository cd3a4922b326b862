"""The `tidegate controller` service on real PostgreSQL and Kafka: a canary that errs is rolled
back by itself with the metrics that condemned it, a healthy one steps up and is promoted, the
events reach the lifecycle topic through the outbox, and a second instance takes over."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg_pool import AsyncConnectionPool

from tests.integration.lifecycle.lineage_rows import compared, request_ids, served
from tests.integration.lifecycle.lineage_support import (
    ResultPublisher,
    make_result,
    register_lineage_subjects,
)
from tests.support import eventually, unique
from tidegate.core.db import make_pool
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.control.process import LOCK_NAME, ControllerConfig, ControllerService
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.schemas.catalog import MODEL_LIFECYCLE_EVENT
from tidegate.schemas.registration import RegistryHttp, register_all

Pool = AsyncConnectionPool[Any]
REPO = Path(__file__).resolve().parents[3]
MODEL = "fraud"


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    settings = TopicSettings(
        results=new_topic("ctl-results", partitions=2),
        shadow=new_topic("ctl-shadow"),
        lifecycle=new_topic("ctl-lifecycle"),
    )
    register_lineage_subjects(registry_settings, settings)
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {f"{settings.lifecycle}-value": MODEL_LIFECYCLE_EVENT}))
    return settings


@pytest.fixture
def config(
    pg_settings: PostgresSettings,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    topics: TopicSettings,
) -> ControllerConfig:
    return ControllerConfig(
        postgres=pg_settings,
        lifecycle=LifecycleSettings(controller_tick_s=0.1, outbox_poll_s=0.2),
        kafka=kafka_settings,
        topics=topics,
        registry=registry_settings,
        group_id=unique("ctl-indexer"),
        takeover_poll_s=0.2,
        lock_check_s=0.3,
    )


@asynccontextmanager
async def running(config: ControllerConfig) -> AsyncIterator[ControllerService]:
    service = ControllerService(config)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


class Traffic:
    """A fake results stream: both versions answer all the time, the candidate erring on every
    `error_every`-th request (0: never), like workers publishing to the results topic."""

    def __init__(self, publisher: ResultPublisher, *, error_every: int) -> None:
        self._publisher = publisher
        self._error_every = error_every
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-results", daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        n = 0
        while not self._stopping.is_set():
            batch = []
            for _ in range(10):
                n += 1
                fails = self._error_every and n % self._error_every == 0
                batch.append(make_result(f"b{n}-{unique('r')}", version="v1"))
                batch.append(
                    make_result(
                        f"c{n}-{unique('r')}", version="v2", status="ERROR" if fails else "OK"
                    )
                )
            self._publisher.results(batch)
            self._stopping.wait(0.05)


async def start_canary(pool: Pool, steps: list[int]) -> EventStore:
    store = EventStore(pool)
    history: list[ev.Payload] = [
        ev.ModelRegistered("v1", "onnx", "store://fraud/v1", {"model.onnx": "a"}),
        ev.ArtifactValidated("v1"),
        ev.VersionLoaded("v1", "w1"),
        ev.Promoted("v1"),
        ev.ModelRegistered("v2", "onnx", "store://fraud/v2", {"model.onnx": "b"}),
        ev.ArtifactValidated("v2"),
        ev.CanaryStarted("v2", steps, dwell_s=0.5, thresholds={"min_requests": 20}),
    ]
    await store.append(MODEL, [ev.NewEvent(p, actor="test") for p in history], expected_version=0)
    return store


def published_types(
    kafka: KafkaSettings, registry: SchemaRegistrySettings, topics: TopicSettings
) -> list[str]:
    """The event types on the lifecycle topic, in order."""
    codec = LifecycleCodec(SchemaRegistryClient(registry.client_config()), topics)
    consumer = make_consumer(kafka, unique("ctl-reader"))
    try:
        consumer.assign([TopicPartition(topics.lifecycle, 0, OFFSET_BEGINNING)])
        _, high = consumer.get_watermark_offsets(TopicPartition(topics.lifecycle, 0), timeout=10)
        types: list[str] = []
        while len(types) < high:
            msg = consumer.poll(5)
            if msg is None:
                break
            if msg.error() is None:
                types.append(codec.decode(msg.value()).type)
        return types
    finally:
        consumer.close()


async def events_until(
    store: EventStore, what: str, done: Callable[[ev.Payload], bool]
) -> list[ev.RecordedEvent]:
    async def probe() -> list[ev.RecordedEvent] | None:
        events = await store.read(MODEL)
        return events if any(done(e.payload) for e in events) else None

    found: list[ev.RecordedEvent] = await eventually(probe, timeout=90, what=what)
    return found


async def test_a_faulty_candidate_is_rolled_back_with_its_metrics(
    config: ControllerConfig, pg_pool: Pool, publisher: ResultPublisher
) -> None:
    store = await start_canary(pg_pool, [10, 50, 100])
    with Traffic(publisher, error_every=5):
        async with running(config) as service:
            await eventually(
                _is_set(service.active), timeout=60, what="the controller to become active"
            )
            await store.append(
                MODEL, [ev.NewEvent(ev.VersionLoaded("v2", "w1"))], expected_version=None
            )
            events = await events_until(store, "a rollback", lambda p: isinstance(p, ev.RolledBack))

    loaded = next(e for e in events if e.type == "VersionLoaded" and e.payload.version == "v2")  # type: ignore[union-attr]
    first_shift = next(e for e in events if e.type == "TrafficShifted")
    assert first_shift.sequence > loaded.sequence  # no weight before the candidate was warm
    assert first_shift.payload == ev.TrafficShifted({"v2": 10, "v1": 90}, reason="canary step 1/3")
    rollback = events[-1]
    assert isinstance(rollback.payload, ev.RolledBack)
    assert rollback.actor == "canary-controller"
    assert rollback.payload.version == "v2"
    assert rollback.payload.to_version == "v1"
    assert "max_error_rate" in rollback.payload.reason
    metrics = rollback.payload.metrics
    # Judged as soon as 20 results were in: which ones depends on partition timing.
    assert metrics["candidate_error_rate"] > 0.05
    assert (
        metrics["candidate_error_rate"]
        == metrics["candidate_errors"] / metrics["candidate_requests"]
    )
    assert metrics["baseline_error_rate"] == 0.0
    assert metrics["candidate_requests"] >= 20
    assert metrics["baseline_requests"] >= 20
    assert {"candidate_p99_ms", "baseline_p99_ms"} <= set(metrics)

    state = await store.load(MODEL)
    assert state.canary is None
    assert state.primary == "v1"
    assert state.effective_weights() == {"v1": 100}
    # The relay in the same process published every event, the rollback last.
    assert published_types(config.kafka, config.registry, config.topics) == [e.type for e in events]


async def test_a_healthy_candidate_steps_up_and_is_promoted(
    config: ControllerConfig, pg_pool: Pool, publisher: ResultPublisher
) -> None:
    store = await start_canary(pg_pool, [10, 50, 100])
    await store.append(MODEL, [ev.NewEvent(ev.VersionLoaded("v2", "w1"))], expected_version=None)
    with Traffic(publisher, error_every=0):
        async with running(config):
            events = await events_until(
                store, "v2 promoted", lambda p: p == ev.Promoted("v2", previous="v1")
            )

    shares = [e.payload.weights["v2"] for e in events if isinstance(e.payload, ev.TrafficShifted)]
    assert shares == [10, 50, 100]
    assert events[-1].payload == ev.Promoted("v2", previous="v1")
    assert not any(e.type == "RolledBack" for e in events)
    state = await store.load(MODEL)
    assert (state.primary, state.canary) == ("v2", None)
    assert state.intended_weights() == {"v2": 100}


async def test_a_second_instance_waits_and_takes_over(config: ControllerConfig) -> None:
    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    first, second = ControllerService(config), ControllerService(config)
    first_task = asyncio.create_task(first.run(first_stop))
    await eventually(_is_set(first.active), timeout=60, what="the first instance to become active")
    second_task = asyncio.create_task(second.run(second_stop))
    try:
        await eventually(_is_set(second.waiting), timeout=60, what="the second instance to wait")
        assert not second.active.is_set()

        first_stop.set()  # the first goes away: the second takes over
        await asyncio.wait_for(first_task, 30)
        await eventually(
            _is_set(second.active), timeout=60, what="the second instance to take over"
        )

        # The active instance's lock connection dies: it stands down, then takes the lock again.
        async with await psycopg.AsyncConnection.connect(
            config.postgres.conninfo(), autocommit=True
        ) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (second.lock_pid,))

        async def retaken() -> bool:
            return second.acquisitions == 2 and second.active.is_set()

        await eventually(retaken, timeout=60, what="the instance to take the lock again")
    finally:
        first_stop.set()
        second_stop.set()
        await asyncio.wait_for(asyncio.gather(first_task, second_task), 30)


async def lock_holders(config: ControllerConfig) -> int:
    """Sessions holding the controller's advisory lock of the test's schema."""
    async with await psycopg.AsyncConnection.connect(
        config.postgres.conninfo(), autocommit=True
    ) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 1 AND objid = (hashtext(%s || %s)::bigint & 4294967295)::oid",
            (LOCK_NAME, config.postgres.db_schema),
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_the_controller_process_stops_cleanly_on_sigterm(config: ControllerConfig) -> None:
    env = {
        **os.environ,
        "TIDEGATE_POSTGRES_DB_SCHEMA": config.postgres.db_schema,
        "TIDEGATE_TOPICS_RESULTS": config.topics.results,
        "TIDEGATE_TOPICS_SHADOW": config.topics.shadow,
        "TIDEGATE_TOPICS_LIFECYCLE": config.topics.lifecycle,
    }
    script = (
        "import typer; from tidegate.cli.serve_controller import controller; typer.run(controller)"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        "--group-id",
        config.group_id,
        env=env,
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    stop = asyncio.Event()
    standby = ControllerService(config)
    task: asyncio.Task[None] | None = None
    try:

        async def held() -> bool:
            return await lock_holders(config) == 1

        await eventually(held, timeout=60, what="the process to take the lock")
        task = asyncio.create_task(standby.run(stop))
        await eventually(_is_set(standby.waiting), timeout=60, what="a second instance to wait")
        proc.send_signal(signal.SIGTERM)
        exited = asyncio.ensure_future(proc.communicate())
        done, _ = await asyncio.wait({exited}, timeout=30)
        if not done:
            proc.kill()
            _, err = await exited
            pytest.fail(f"the controller did not exit within 30 s of SIGTERM:\n{err.decode()}")
        _, err = exited.result()
        assert proc.returncode == 0, err.decode()
        assert "controller lock acquired" in err.decode()
        await eventually(
            _is_set(standby.active), timeout=60, what="the released lock to be taken over"
        )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 30)


def _is_set(event: asyncio.Event) -> Callable[[], Any]:
    async def probe() -> bool:
        return event.is_set()

    return probe


@pytest.fixture
def publisher(
    kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings, topics: TopicSettings
) -> ResultPublisher:
    return ResultPublisher(kafka_settings, registry_settings, topics)


async def test_the_controller_deletes_lineage_rows_past_the_retention(
    config: ControllerConfig, pg_settings: PostgresSettings
) -> None:
    # One hour: the shortest retention there is, the live windows' horizon.
    lifecycle = config.lifecycle.model_copy(
        update={"lineage_retention_days": 1 / 24, "lineage_prune_every_s": 0.2}
    )
    config = dataclasses.replace(config, lifecycle=lifecycle)
    pool = make_pool(pg_settings, lifecycle)
    await pool.open(wait=True, timeout=30)
    try:
        now = datetime.now(UTC)
        await served(pool, "two-hours-old", now - timedelta(hours=2))
        await compared(pool, "two-hours-old", now - timedelta(hours=2))
        await served(pool, "fresh", now)

        async def pruned() -> bool:
            kept = await request_ids(pool, "served_requests")
            return kept == {"fresh"} and not await request_ids(pool, "shadow_comparisons")

        async with running(config):
            await eventually(pruned, timeout=60, what="the expired lineage rows to be deleted")
    finally:
        await pool.close()
