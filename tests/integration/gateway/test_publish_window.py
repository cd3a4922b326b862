"""The gateway's publish window on the real Kafka: the requests of one window reach the topic in
the order they were submitted, and one too large for Kafka fails its own acknowledgement when the
window ends (the call's 413) while the others of its window are published."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from tests.integration.fakes import register_subjects
from tests.integration.gateway.topic_reader import records_on
from tidegate.clients.producer import RecordTooLargeError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.roundtrip.request_publisher import KafkaRequestPublisher
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.requests import build_request

LIMIT = 20_000


def record(request_id: str, columns: int = 4) -> RequestRecord:
    features = np.zeros((1, columns), dtype=np.float32)
    return build_request("fraud", {"features": features}, request_id=request_id)


async def test_a_windows_requests_go_in_order_and_a_too_large_one_fails_alone(
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    new_topic: Callable[..., str],
) -> None:
    topics = TopicSettings(
        requests=new_topic("it-window-requests"), results=new_topic("it-window-results")
    )
    register_subjects(registry_settings, topics)
    settings = GatewaySettings(publish_linger_ms=200, max_record_bytes=LIMIT)
    publisher = KafkaRequestPublisher(kafka_settings, topics, registry_settings, gateway=settings)
    await publisher.start()
    try:
        first = publisher.submit(record("w-1"))
        too_large = publisher.submit(record("w-big", columns=LIMIT))  # 4 bytes a column
        second = publisher.submit(record("w-2"))
        await asyncio.sleep(0.05)
        assert not first.done(), "held for the window, not sent at once"
        await asyncio.wait_for(first, 10)
        await asyncio.wait_for(second, 10)
        with pytest.raises(RecordTooLargeError):
            await asyncio.wait_for(too_large, 10)
        assert publisher.connected, "a refused record says nothing about Kafka's health"
    finally:
        await publisher.stop()
    (key_1, offset_1), (key_2, offset_2) = records_on(kafka_settings, topics.requests, 2)
    assert (key_1, key_2) == (b"w-1", b"w-2")
    assert offset_2 == offset_1 + 1
