"""The lineage indexer on real Kafka and PostgreSQL: one row per request despite redelivery, and
shadow stats computed in SQL equal to a direct computation from the published records."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tests.integration.lifecycle.lineage_support import (
    ResultPublisher,
    make_result,
    register_lineage_subjects,
)
from tests.support import eventually, unique
from tidegate.core.db import make_pool, migrate
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.control.indexer import Indexer, seed_windows
from tidegate.lifecycle.domain.windows import LiveWindows
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.readmodels.lineage import served, shadow_stats

Pool = AsyncConnectionPool[Any]


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    settings = TopicSettings(
        results=new_topic("idx-results", partitions=2), shadow=new_topic("idx-shadow")
    )
    register_lineage_subjects(registry_settings, settings)
    return settings


@pytest.fixture
def publisher(
    kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings, topics: TopicSettings
) -> ResultPublisher:
    return ResultPublisher(kafka_settings, registry_settings, topics)


def indexer(
    pool: Pool,
    kafka: KafkaSettings,
    registry: SchemaRegistrySettings,
    topics: TopicSettings,
    windows: LiveWindows,
) -> Indexer:
    client = SchemaRegistryClient(registry.client_config())
    return Indexer(
        pool, kafka, topics, client, group_id=unique("indexer"), windows=windows, poll_s=0.2
    )


async def count(pool: Pool, table: str) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - test constant
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_each_request_is_indexed_once_despite_redelivery(
    pg_pool: Pool,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    topics: TopicSettings,
    publisher: ResultPublisher,
) -> None:
    records = [make_result(f"r{i}", version="v2" if i % 2 else "v1") for i in range(20)]
    records[3] = make_result("r3", version="v2", status="ERROR", rule="pin:acme")
    records.append(make_result("r-none", version=None, status="NOT_FOUND", rule=None))
    duplicate = make_result("r5", version="v2", status="ERROR", worker_id="w2")
    publisher.results([*records, duplicate])

    windows = LiveWindows()
    first = indexer(pg_pool, kafka_settings, registry_settings, topics, windows)
    await first.start()
    try:
        await eventually(
            lambda: _equals(count(pg_pool, "served_requests"), 21), timeout=60, what="21 rows"
        )
        # A duplicate arriving well after its original changes neither the row nor the windows.
        publisher.results([make_result("r0", version="v9", worker_id="late")])
        await eventually(lambda: _consumed(first, 23), timeout=60, what="the late duplicate")
    finally:
        await first.stop()

    assert await count(pg_pool, "served_requests") == 21
    record = await served(pg_pool, "r3")
    assert record is not None
    assert (record.model, record.version, record.status) == ("fraud", "v2", "ERROR")
    assert (record.worker_id, record.routing_rule, record.tenant) == ("w1", "pin:acme", "acme")
    assert record.routing_key == "key-r3"
    assert record.error_code == "MODEL_ERROR"
    assert record.total_ms == 5.0
    five = await served(pg_pool, "r5")
    assert five is not None
    assert (five.status, five.worker_id) == ("OK", "w1")
    zero = await served(pg_pool, "r0")
    assert zero is not None
    assert zero.version == "v1"
    none = await served(pg_pool, "r-none")
    assert none is not None
    assert none.version is None
    assert await served(pg_pool, "nope") is None
    # The windows saw each request once: 10 v1 and 10 v2 results, one v2 error.
    since = datetime(2000, 1, 1, tzinfo=UTC)
    assert windows.stats("fraud", "v1", since).count == 10
    v2 = windows.stats("fraud", "v2", since)
    assert (v2.count, v2.errors) == (10, 1)
    assert windows.stats("fraud", "v9", since).count == 0

    # A whole redelivery (a new group reads everything again) adds no row and counts nothing.
    again = LiveWindows()
    second = indexer(pg_pool, kafka_settings, registry_settings, topics, again)
    await second.start()
    try:
        await eventually(lambda: _consumed(second, 23), timeout=60, what="the redelivery")
    finally:
        await second.stop()
    assert await count(pg_pool, "served_requests") == 21
    assert again.keys() == []


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _consumed(idx: Indexer, at_least: int) -> bool:
    return idx.indexed >= at_least


START = datetime.now(UTC)


def comparison(i: int, rng: random.Random, *, kind: str, primary: str = "v1") -> dict[str, Any]:
    rows = rng.randint(1, 8)
    failed = rng.random() < 0.1
    values = rows * 2 if kind == "classifier" else rows * 16
    return {
        "model": "fraud",
        "primary_version": primary,
        "candidate_version": "v2",
        "request_id": f"s{i}",
        "kind": kind,
        "rows": rows,
        "agree_rows": rng.randint(0, rows) if kind == "classifier" and not failed else None,
        "abs_diff_sum": 0.0 if failed else rng.random() * values * 0.1,
        "values": 0 if failed else values,
        "cosine_sum": rows * rng.uniform(0.8, 1.0) if kind == "embedding" and not failed else None,
        "primary_ms": rng.uniform(1, 20),
        "candidate_ms": rng.uniform(1, 40),
        "candidate_error": "MODEL_ERROR: boom" if failed else None,
        "worker_id": "w1",
        "compared_at": START + timedelta(milliseconds=10 * i),
    }


async def test_shadow_stats_equal_a_direct_computation(
    pg_pool: Pool,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    topics: TopicSettings,
    publisher: ResultPublisher,
) -> None:
    rng = random.Random(7)
    records = [
        comparison(
            i, rng, kind="classifier" if i % 3 else "embedding", primary="v0" if i < 5 else "v1"
        )
        for i in range(120)
    ]
    other = {**comparison(999, rng, kind="classifier"), "candidate_version": "v3"}
    publisher.shadows([*records, records[10], other])  # records[10] twice

    idx = indexer(pg_pool, kafka_settings, registry_settings, topics, LiveWindows())
    await idx.start()
    try:
        await eventually(
            lambda: _equals(count(pg_pool, "shadow_comparisons"), 121), timeout=60, what="121 rows"
        )
    finally:
        await idx.stop()

    stats = await shadow_stats(pg_pool, "fraud", "v2")
    ok = [r for r in records if r["candidate_error"] is None]
    classifier = [r for r in ok if r["agree_rows"] is not None]
    embedding = [r for r in ok if r["cosine_sum"] is not None]
    assert stats.samples == len(ok)
    assert stats.candidate_errors == len(records) - len(ok)
    assert stats.rows == sum(r["rows"] for r in ok)
    assert stats.agreement == pytest.approx(
        sum(r["agree_rows"] for r in classifier) / sum(r["rows"] for r in classifier)
    )
    assert stats.mean_abs_diff == pytest.approx(
        sum(r["abs_diff_sum"] for r in ok) / sum(r["values"] for r in ok)
    )
    assert stats.mean_cosine == pytest.approx(
        sum(r["cosine_sum"] for r in embedding) / sum(r["rows"] for r in embedding)
    )
    primary_ms = [r["primary_ms"] for r in ok]
    candidate_ms = [r["candidate_ms"] for r in ok]
    assert stats.primary_p50_ms == pytest.approx(np.percentile(primary_ms, 50))
    assert stats.primary_p99_ms == pytest.approx(np.percentile(primary_ms, 99))
    assert stats.candidate_p50_ms == pytest.approx(np.percentile(candidate_ms, 50))
    assert stats.candidate_p99_ms == pytest.approx(np.percentile(candidate_ms, 99))
    assert stats.primary_version == "v1"

    against_v0 = await shadow_stats(pg_pool, "fraud", "v2", primary="v0")
    assert against_v0.samples + against_v0.candidate_errors == 5
    empty = await shadow_stats(pg_pool, "fraud", "v7")
    assert (empty.samples, empty.agreement, empty.candidate_p99_ms) == (0, None, None)


@pytest.fixture
def unmigrated() -> Iterator[PostgresSettings]:
    """A schema with no tables yet: the indexer's inserts fail until it is migrated."""
    settings = PostgresSettings(db_schema=unique("t").replace("-", "_"))
    with psycopg.connect(settings.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(settings.db_schema)))
    yield settings
    with psycopg.connect(settings.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(settings.db_schema)))


async def test_offsets_are_committed_only_after_the_rows(
    unmigrated: PostgresSettings,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    topics: TopicSettings,
    publisher: ResultPublisher,
) -> None:
    pool = make_pool(unmigrated, LifecycleSettings())
    await pool.open(wait=True, timeout=30)
    client = SchemaRegistryClient(registry_settings.client_config())
    group = unique("indexer")
    try:
        publisher.results(make_result(f"r{i}", version="v1") for i in range(30))
        failing = Indexer(
            pool, kafka_settings, topics, client, group_id=group, poll_s=0.2, retry_s=0.1
        )
        await failing.start()
        try:
            await eventually(lambda: _retried(failing), timeout=60, what="a failed batch")
        finally:
            await failing.stop()
        assert failing.indexed == 0

        await asyncio.to_thread(migrate, unmigrated)
        windows = LiveWindows()
        recovered = Indexer(
            pool, kafka_settings, topics, client, group_id=group, windows=windows, poll_s=0.2
        )
        await recovered.start()
        try:
            # The same group starts where nothing was committed: at the beginning.
            await eventually(
                lambda: _equals(count(pool, "served_requests"), 30), timeout=60, what="30 rows"
            )
        finally:
            await recovered.stop()
        since = datetime(2000, 1, 1, tzinfo=UTC)
        assert windows.stats("fraud", "v1", since).count == 30

        # A controller taking over fills its windows from the rows.
        seeded = LiveWindows()
        assert await seed_windows(pool, seeded, since) == 30
        assert seeded.stats("fraud", "v1", since) == windows.stats("fraud", "v1", since)
    finally:
        await pool.close()


async def _retried(idx: Indexer) -> bool:
    return idx.retries >= 1
