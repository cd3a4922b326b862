"""What the gateway's publisher put on a one-partition topic, read back."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings


def records_on(kafka: KafkaSettings, topic: str, count: int) -> list[tuple[bytes | None, int]]:
    """The first `count` records of the topic's partition 0, as (key, offset)."""
    consumer = make_consumer(kafka, unique("it-topic-reader"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[tuple[bytes | None, int]] = []

    def read() -> bool:
        batch = consumer.consume(100, 0.2)
        found.extend((m.key(), m.offset() or 0) for m in batch if not m.error())
        return len(found) >= count

    try:
        wait_for(read, timeout=30, what=f"{count} records on {topic}")
    finally:
        consumer.close()
    return found
