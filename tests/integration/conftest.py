"""Integration tests run against the real local stack started by `make up`.

They fail (not skip) when the stack is down: a green run must mean the servers were really
exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from tests.integration.fakes import FakeWorker
from tests.support import unique
from tidegate.kafka import make_admin
from tidegate.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings


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
