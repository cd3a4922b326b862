"""Integration tests run against the real local stack started by `make up`.

They fail (not skip) when the stack is down: a green run must mean the servers were really
exercised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from tests.integration.fakes import FakeWorker
from tests.support import unique
from tidegate.core.db import make_pool, migrate
from tidegate.core.kafka import make_admin
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kafka_settings() -> KafkaSettings:
    return KafkaSettings()


@pytest.fixture(scope="session")
def registry_settings() -> SchemaRegistrySettings:
    return SchemaRegistrySettings()


@pytest.fixture(scope="session")
def admin(kafka_settings: KafkaSettings) -> AdminClient:
    client = make_admin(kafka_settings)
    brokers = client.list_topics(timeout=15).brokers
    assert brokers, "no Kafka broker answered: run `make up` first"
    return client


@pytest.fixture
def new_topic(admin: AdminClient) -> Iterator[Callable[..., str]]:
    """Create uniquely named topics for one test and delete them afterwards."""
    created: list[str] = []

    def create(prefix: str, partitions: int = 1) -> str:
        name = unique(prefix)
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[
            name
        ].result(timeout=30)
        created.append(name)
        return name

    yield create
    if created:
        for future in admin.delete_topics(created).values():
            future.result(timeout=30)


@pytest.fixture
def worker(
    kafka_settings: KafkaSettings, topics: TopicSettings, registry_settings: SchemaRegistrySettings
) -> Iterator[FakeWorker]:
    """A fake worker answering on the test module's own `topics` (each module defines that)."""
    fake = FakeWorker(kafka_settings, topics, registry_settings).start()
    yield fake
    fake.stop()


@pytest.fixture
def pg_settings() -> Iterator[PostgresSettings]:
    """PostgresSettings of a schema of this test's own, migrated; dropped afterwards."""
    settings = PostgresSettings(db_schema=unique("t").replace("-", "_"))
    migrate(settings)
    yield settings
    with psycopg.connect(settings.conninfo(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(settings.db_schema))
        )


@pytest.fixture
async def pg_pool(pg_settings: PostgresSettings) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """An open pool (tidegate.core.db.make_pool) on the test's own schema."""
    pool = make_pool(pg_settings, LifecycleSettings(pool_min_size=1, pool_max_size=4))
    await pool.open(wait=True, timeout=30)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fraud 1, 1-torch, 2 and 3 as package directories (what `tidegate models register` takes),
    exported from the real store and built there first if needed."""
    import asyncio

    from tidegate.examples import build_models
    from tidegate.models.model_settings import ModelSettings
    from tidegate.models.store import LocalArtifactStore

    store = LocalArtifactStore(ModelSettings(store_dir=REPO / "var" / "models"))
    root = tmp_path_factory.mktemp("packages")
    asyncio.run(build_models(store, only=["fraud"], packages_dir=root))
    return root


@pytest.fixture
def lifecycle_topic(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> str:
    """A lifecycle topic of the test's own, its envelope registered."""
    from tidegate.schemas.catalog import MODEL_LIFECYCLE_EVENT
    from tidegate.schemas.registration import RegistryHttp, register_all

    topic = new_topic("lifecycle")
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {f"{topic}-value": MODEL_LIFECYCLE_EVENT}, events=False))
    return topic
