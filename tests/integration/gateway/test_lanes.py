"""The gateway's publisher on the real Kafka: each lane's requests land on that lane's topic, and
a gateway whose cluster has no batch topic still serves real-time calls and refuses batch ones at
once (503), without taking itself for disconnected."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests.integration.fakes import register_subjects
from tests.integration.gateway.topic_reader import records_on
from tests.support import unique
from tidegate.clients.producer import PublishError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.roundtrip.request_publisher import KafkaRequestPublisher
from tidegate.schemas.catalog import INFERENCE_REQUEST
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.requests import build_request


def record(request_id: str) -> RequestRecord:
    features = np.zeros((1, 4), dtype=np.float32)
    return build_request("fraud", {"features": features}, request_id=request_id)


def keys_on(kafka: KafkaSettings, topic: str, count: int) -> list[bytes | None]:
    return [key for key, _ in records_on(kafka, topic, count)]


@pytest.fixture
def lane_topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    topics = TopicSettings(
        requests=new_topic("it-lane-requests"),
        requests_batch=new_topic("it-lane-requests-batch"),
        results=new_topic("it-lane-results"),
    )
    register_subjects(registry_settings, topics)
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {f"{topics.requests_batch}-value": INFERENCE_REQUEST}))
    return topics


async def test_each_lane_publishes_to_its_topic(
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    lane_topics: TopicSettings,
) -> None:
    publisher = KafkaRequestPublisher(kafka_settings, lane_topics, registry_settings)
    await publisher.start()
    try:
        await publisher.publish(record("rt-1"))
        await publisher.publish(record("bt-1"), "batch")
        await publisher.publish(record("bt-2"), "batch")
    finally:
        await publisher.stop()
    assert keys_on(kafka_settings, lane_topics.requests, 1) == [b"rt-1"]
    assert keys_on(kafka_settings, lane_topics.requests_batch, 2) == [b"bt-1", b"bt-2"]


async def test_without_a_batch_topic_batch_calls_are_refused_at_once(
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    lane_topics: TopicSettings,
) -> None:
    missing = lane_topics.model_copy(update={"requests_batch": unique("it-lane-missing")})
    publisher = KafkaRequestPublisher(kafka_settings, missing, registry_settings)
    await publisher.start()
    try:
        with pytest.raises(PublishError, match=missing.requests_batch):
            publisher.submit(record("bt-1"), "batch")
        assert publisher.connected  # not mistaken for Kafka being down
        await publisher.publish(record("rt-1"))
    finally:
        await publisher.stop()
    assert keys_on(kafka_settings, lane_topics.requests, 1) == [b"rt-1"]
