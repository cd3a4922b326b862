"""Integration tests run against the real local stack started by `make up`.

They fail (not skip) when the stack is down: a green run must mean the servers were really exercised.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from tidegate.kafka import make_admin
from tidegate.settings import KafkaSettings, SchemaRegistrySettings


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
